"""The data tests use tiny tensors: intra-op threads only add contention on a shared machine
(measured: the synthetic training test takes 1 s on one thread, 8 s on two busy cores)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
