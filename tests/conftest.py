"""Shared fixtures. Multi-rank tests run their rank functions on `RankPool`s kept for the session,
so torch is imported once per rank rather than once per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from shardkit.kernels import kernel_path
from shardkit.launch import RankPool

# Collective timeout inside test ranks: far above what any test needs, far below pytest's timeout.
RANK_TIMEOUT_S = 60.0


@pytest.fixture(scope="session", autouse=True)
def _embedding_kernel() -> None:
    """Choose the embedding kernel before any test starts ranks: on a machine without a cached
    build this builds the compiled kernel (20-40 s on 2 cores), which no rank should wait for
    inside a collective."""
    kernel_path()


@pytest.fixture(scope="session")
def _rank_pools() -> Iterator[dict[tuple[int, int], RankPool]]:
    pools: dict[tuple[int, int], RankPool] = {}
    yield pools
    for pool in pools.values():
        pool.close()


@pytest.fixture
def run_ranks(_rank_pools: dict[tuple[int, int], RankPool]) -> Callable[..., list[Any]]:
    """``run_ranks(fn, world_size, *args, local_world_size=None)`` -> per-rank results.

    ``fn(rank, world_size, *args)`` must be a module-level function of the test module (or any
    picklable callable). A failing rank raises `RankFailedError` here, with its traceback.
    """

    def run(
        fn: Callable[..., Any], world_size: int, *args: Any, local_world_size: int | None = None
    ) -> list[Any]:
        key = (world_size, local_world_size or world_size)
        pool = _rank_pools.get(key)
        if pool is None:
            pool = RankPool(world_size, timeout=RANK_TIMEOUT_S, local_world_size=key[1])
            _rank_pools[key] = pool
        return pool.run(fn, *args)

    return run


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread for the test: with tiny tensors, more threads only contend on
    a shared machine (measured: the synthetic training test takes 1 s on one thread, 8 s on two
    busy cores). tests/data and tests/metrics use it for every test."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
