"""The programs tier runs on request (``make test-programs``): each program runs twice, on
TorchRec/torch in the peers venv and on shardkit, 2 ranks each (1-4 minutes apiece on 2 cores),
which the default run's 15-minute budget cannot hold. Its tests skip here with one summary line."""

from __future__ import annotations

import os

import pytest

PROGRAMS_SKIP_REASON = (
    "programs tier: user programs on TorchRec and on shardkit side by side "
    "(run `make test-programs`; needs the peers venv)"
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if os.environ.get("SHARDKIT_PROGRAMS") != "1":
        pytest.skip(PROGRAMS_SKIP_REASON)
