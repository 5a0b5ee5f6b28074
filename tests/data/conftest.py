"""Every test here runs torch on one thread (see `one_thread` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """Applies the shared `one_thread` fixture to every test in this directory."""
