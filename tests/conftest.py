"""Shared fixtures. Multi-rank tests run their rank functions on `RankPool`s kept for the session,
so torch is imported once per rank rather than once per test."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import multiprocessing.forkserver
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from shardkit.kernels import kernel_path
from shardkit.launch import RankPool, set_start_method
from tests.devices import GPU_SKIP_REASON, OnDevice, backend_of, cuda_ready

# Tiers the default run skips (one summary line each): run them with `pytest -m <name>`.
OPT_IN = {
    "pt2_grid": "the full PT2 grid (every module x kernel x optimizer compiled against eager, "
    "~3 min): pytest -m pt2_grid",
    "aoti": "AOTInductor packages (each compiles C++, 20-60 s): pytest -m aoti",
    "slow": "end-to-end examples, benchmark smoke runs and CLI pipelines (~7 min on 2 cores, "
    "over the default run's 15-minute budget): make test-slow",
    "programs": "user programs on TorchRec and on shardkit side by side (~15 min; needs the "
    "peers venv): make test-programs",
}

# Collective timeout inside test ranks: far above what any test needs, far below pytest's timeout.
RANK_TIMEOUT_S = 60.0

PoolKey = tuple[int, int, str]  # world size, local world size, device kind


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The GPU tier skips here, from one place, so that all its tests share one summary line
    (first, before a test's own ``skipif(not torch.cuda.is_available())`` says it again)."""
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip(GPU_SKIP_REASON)
    chosen = item.config.getoption("markexpr", "") or ""
    for name, reason in OPT_IN.items():
        if item.get_closest_marker(name) is not None and name not in chosen:
            pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def _embedding_kernel() -> None:
    """Choose the embedding kernel before any test starts ranks: on a machine without a cached
    build this builds the compiled kernel (20-40 s on 2 cores), which no rank should wait for
    inside a collective."""
    kernel_path()


@pytest.fixture(scope="session", autouse=True)
def _ranks_fork_from_a_server(_embedding_kernel: None) -> Iterator[None]:
    """Rank processes (`spawn`, `RankPool`) fork from one server that imported shardkit once,
    instead of each importing torch and shardkit (4-8 s a start on 2 busy cores, ~0.2 s forked;
    the default run starts ranks dozens of times). The server starts here, before any test
    changes the environment: a forked rank has the server's environment, not the test's (a test
    whose ranks need a variable sets it in the rank function). Scripts and the CLI, which tests
    run in fresh processes, still start theirs with ``spawn`` (tests/launch/test_pickle.py,
    tests/cli, tests/compat). Preloaded too: torch._dynamo, which the fake GPU's first tensor
    imports in every fakegpu rank (torch's dispatch path; 3-5 s a rank). Not preloaded:
    tests.fake_gpu, which must not leak into the CPU ranks."""
    if "forkserver" not in multiprocessing.get_all_start_methods():  # not on Windows
        yield
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["shardkit", "shardkit.launch._worker", "torch._dynamo"])
    multiprocessing.forkserver.ensure_running()
    previous = set_start_method("forkserver")
    yield
    set_start_method(previous)


@pytest.fixture(scope="session")
def _rank_pools() -> Iterator[dict[PoolKey, RankPool]]:
    pools: dict[PoolKey, RankPool] = {}
    yield pools
    # all at once: a rank process takes seconds to shut torch down on a busy machine, and one
    # pool after another added up to half a minute at the end of the run
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(pools))) as executor:
        list(executor.map(RankPool.close, pools.values()))


@pytest.fixture
def run_ranks(_rank_pools: dict[PoolKey, RankPool]) -> Callable[..., list[Any]]:
    """``run_ranks(fn, world_size, *args, local_world_size=None, device=None)`` -> per-rank
    results.

    ``fn(rank, world_size, *args)`` must be a module-level function of the test module (or any
    picklable callable). A failing rank raises `RankFailedError` here, with its traceback.
    With ``device`` (``"cpu"``, ``"fakegpu"`` or ``"cuda"``, see `tests.devices`) ``fn`` is
    called with ``device=<this rank's torch.device>`` on ranks kept for that kind of device
    (gloo, or NCCL for CUDA): the fake GPU never leaks into the CPU tests' processes.
    """

    def run(
        fn: Callable[..., Any],
        world_size: int,
        *args: Any,
        local_world_size: int | None = None,
        device: str | None = None,
    ) -> list[Any]:
        kind = device or "cpu"
        if kind == "cuda" and (why := cuda_ready(world_size)) is not None:
            pytest.skip(why)
        key = (world_size, local_world_size or world_size, kind)
        pool = _rank_pools.get(key)
        if pool is None:
            pool = RankPool(
                world_size,
                backend=backend_of(kind),
                timeout=RANK_TIMEOUT_S,
                local_world_size=key[1],
            )
            _rank_pools[key] = pool
        return pool.run(fn if device is None else OnDevice(fn, kind), *args)

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
