"""Start ranks from Python: `spawn` for one function, `RankPool` to keep ranks up between calls."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from shardkit.launch._context import DEFAULT_TIMEOUT_S
from shardkit.launch._errors import RankFailedError, RankFailure, dump_stacks
from shardkit.launch._hang import PEER_LOSS
from shardkit.launch._pickle import dumps, main_is_reimportable
from shardkit.launch._watch import Watchdog
from shardkit.launch._worker import START_ALLOWANCE_S, WorkerConfig, worker_main

__all__ = ["RankPool", "set_start_method", "spawn"]

logger = logging.getLogger(__name__)

# After the first failure, how long to keep listening for the failure that caused it: a rank
# that raised reports at once, while its peers only notice when their collective breaks.
_GRACE_S = 1.0
# The parent waits a little longer than the ranks wait for each other at the start, so that
# their message (which names the ranks missing) comes first.
_START_ALLOWANCE_S = START_ALLOWANCE_S + 10.0
# How rank processes start (`set_start_method`): a process setting, as `multiprocessing`'s own.
_start_method = "spawn"
_START_METHODS = ("spawn", "forkserver")


def set_start_method(method: str) -> str:
    """Choose how `spawn` and `RankPool` start rank processes from now on, in this process.

    ``"spawn"`` (the default) starts each rank as a fresh Python, which imports torch and the
    function's module itself: seconds per rank, and nothing of the parent's state leaks in.
    ``"forkserver"`` forks each rank from a server process started once, which imports what
    ``multiprocessing.get_context("forkserver").set_forkserver_preload([...])`` names before it
    starts: a rank then starts in a fraction of a second, for a test suite or a notebook that
    starts ranks many times. A forked rank has the server's environment (from when it started),
    not the caller's. ``"fork"`` is refused: a rank forked from a parent that runs torch's
    threads can deadlock.

    Example::

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "shardkit"])
        previous = shardkit.launch.set_start_method("forkserver")

    Args:
        method: ``"spawn"`` or ``"forkserver"``.

    Returns:
        The method used before (to put it back).

    Raises:
        ValueError: ``method`` is neither, or ``"forkserver"`` where this platform has none.
    """
    global _start_method
    if method not in _START_METHODS:
        why = " (a rank forked from a parent running torch's threads can deadlock)"
        raise ValueError(
            f"start method {method!r} is not one shardkit starts ranks with"
            f"{why if method == 'fork' else ''}: it must be 'spawn' (the default: each rank a "
            "fresh Python) or 'forkserver' (ranks fork from a server started once); use "
            "set_start_method('spawn') or set_start_method('forkserver')"
        )
    if method not in mp.get_all_start_methods():
        raise ValueError(
            f"start method {method!r} is not available on {sys.platform} (it offers "
            f"{mp.get_all_start_methods()}); use set_start_method('spawn')"
        )
    previous, _start_method = _start_method, method
    return previous


def spawn(
    fn: Callable[..., Any],
    *,
    world_size: int,
    args: Sequence[Any] = (),
    backend: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    local_world_size: int | None = None,
    threads_per_rank: int | None = None,
    debug: bool = False,
    watchdog: Watchdog | None = Watchdog(),  # noqa: B008 (frozen, so one instance is safe)
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new processes and return the results.

    Each rank is started with the ``spawn`` method (`set_start_method` chooses another), joins
    a process group (gloo on CPU, NCCL when every rank has a GPU of its own; ``backend``
    overrides) through a file store in a fresh temporary directory, so no port is chosen and
    none can clash. The group is torn down after ``fn`` returns. ``fn`` may be a module-level
    function, or one defined in a notebook, a lambda or a closure (these are sent by value).

    Args:
        fn: the function each rank runs.
        world_size: number of ranks.
        args: extra positional arguments for ``fn``; they must pickle.
        backend: ``"gloo"``, ``"nccl"`` or None (choose from the hardware).
        timeout: seconds a collective may wait before it fails, and that ranks wait for each
            other at start and end.
        local_world_size: ranks per simulated host (default: all on one host); sets
            ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` and what `current()` reports.
        threads_per_rank: intra-op threads per rank (default: cores divided among local ranks).
        debug: check that every rank issues the same collectives with matching shapes.
        watchdog: how ranks name the rank a collective waits for (a warning after a fraction
            of ``timeout``, then the timeout's error); None: no recording, no warning.

    Returns:
        ``[fn(0, world_size, *args), ..., fn(world_size - 1, world_size, *args)]``.

    Raises:
        RankFailedError: a rank raised, died or timed out; carries its rank and traceback (when
            a collective timed out, the rank that had not reached it). The other ranks are
            stopped before this is raised: none is left running.
    """
    with RankPool(
        world_size,
        backend=backend,
        timeout=timeout,
        local_world_size=local_world_size,
        threads_per_rank=threads_per_rank,
        debug=debug,
        watchdog=watchdog,
    ) as pool:
        return pool.run(fn, *args)


class RankPool:
    """``world_size`` rank processes that stay up, with their process group, between runs.

    Useful in notebooks and tests, where starting ranks (importing torch in each) costs more than
    the work. After a failed run the ranks are stopped; the next `run` starts fresh ones.

    Example::

        with RankPool(2) as pool:
            pool.run(train_one_epoch, model_config)   # same arguments as spawn's fn
            pool.run(evaluate)

    Args: as for `spawn`.
    """

    def __init__(
        self,
        world_size: int,
        *,
        backend: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        local_world_size: int | None = None,
        threads_per_rank: int | None = None,
        debug: bool = False,
        watchdog: Watchdog | None = Watchdog(),  # noqa: B008 (frozen, so one instance is safe)
    ) -> None:
        local_world_size = world_size if local_world_size is None else local_world_size
        _check_sizes(world_size, local_world_size, timeout)
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.backend = backend
        self.timeout = timeout
        self.threads_per_rank = threads_per_rank or _default_threads(local_world_size)
        self.debug = debug
        self.watchdog = watchdog
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._tmpdir: str | None = None
        self._next_run_id = 0
        self._starting = False

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def started(self) -> bool:
        return bool(self._procs)

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """Run ``fn(rank, world_size, *args)`` on every rank; returns the results by rank."""
        if not self.started:
            self._start()
        run_id = self._next_run_id
        self._next_run_id += 1
        payload = dumps((fn, args))
        message = pickle.dumps(("run", run_id, payload))
        for conn in self._conns:
            conn.send_bytes(message)
        replies = self._collect(deadline=None)
        return [reply[2] for reply in replies]

    def close(self) -> None:
        """Stop the ranks (politely, then by force) and delete the rendezvous directory."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(pickle.dumps(("stop",)))
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def _start(self) -> None:
        self._tmpdir = tempfile.mkdtemp(prefix="shardkit-ranks-")
        store_path = os.path.join(self._tmpdir, "store")
        context = mp.get_context(_start_method)
        with _hide_missing_main_file():
            self._start_processes(context, store_path)
        logger.info("started %d ranks (rendezvous in %s)", self.world_size, self._tmpdir)
        self._starting = True
        try:
            self._collect(deadline=time.monotonic() + self.timeout + _START_ALLOWANCE_S)
        finally:
            self._starting = False

    def _start_processes(self, context: Any, store_path: str) -> None:
        for rank in range(self.world_size):
            parent_end, child_end = context.Pipe(duplex=True)
            config = WorkerConfig(
                rank=rank,
                world_size=self.world_size,
                local_world_size=self.local_world_size,
                backend=self.backend,
                timeout_s=self.timeout,
                store_path=store_path,
                threads=self.threads_per_rank,
                debug=self.debug,
                watchdog=self.watchdog,
            )
            proc = context.Process(
                target=worker_main, args=(child_end, config), name=f"shardkit-rank-{rank}"
            )
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)

    def _collect(self, deadline: float | None) -> list[tuple]:
        """Wait for one reply per rank; on any failure stop all ranks and raise."""
        replies: dict[int, tuple] = {}
        failures: list[RankFailure] = []
        while len(replies) + len(failures) < self.world_size:
            pending = [r for r in range(self.world_size) if r not in replies]
            pending = [r for r in pending if all(f.rank != r for f in failures)]
            if any(_is_root_cause(f) for f in failures):
                break
            timeout = _GRACE_S if failures else _remaining(deadline)
            ready = wait(
                [self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending],
                timeout=timeout,
            )
            if not ready:
                if failures:
                    break
                failures.append(_start_timeout(pending, self.timeout))
                break
            for rank in pending:
                reply = self._poll(rank)
                if reply is None:
                    continue
                if reply[0] == "error":
                    failures.append(reply[2])
                else:
                    replies[rank] = reply
        if failures:
            stacks = self._silent_stacks(failures)
            self._kill()
            raise _error(failures, self.world_size, stacks)
        return [replies[r] for r in range(self.world_size)]

    def _silent_stacks(self, failures: list[RankFailure]) -> dict[int, str]:
        """The stacks of late ranks that did not answer the flight recorder's question."""
        silent = {rank for failure in failures for rank in failure.silent_ranks}
        pids = {r: self._procs[r].pid for r in silent if self._procs[r].is_alive()}
        if not pids or self._tmpdir is None:
            return {}
        return dump_stacks(pids, os.path.join(self._tmpdir, "store"))

    def _poll(self, rank: int) -> tuple | None:
        """The reply of ``rank`` if one is ready, a failure if it died silently, else None."""
        conn, proc = self._conns[rank], self._procs[rank]
        try:
            if conn.poll():
                return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            pass
        if proc.is_alive():
            return None
        proc.join()
        return ("error", -1, _died(rank, proc.exitcode, starting=self._starting))

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


@contextlib.contextmanager
def _hide_missing_main_file() -> Iterator[None]:
    """multiprocessing re-runs ``__main__.__file__`` in each child; for code read from stdin that
    is ``<stdin>``, which does not exist. Hide it while the children start (their functions
    travel by value instead, see `_pickle`)."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if path is None or main_is_reimportable():
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _check_sizes(world_size: int, local_world_size: int, timeout: float) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if local_world_size < 1 or world_size % local_world_size:
        raise ValueError(
            f"local_world_size ({local_world_size}) must divide world_size ({world_size}): "
            "every simulated host has the same number of ranks"
        )
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")


def _default_threads(local_world_size: int) -> int | None:
    if "OMP_NUM_THREADS" in os.environ:
        return None  # the user chose; torch reads it in each rank
    return max(1, (os.cpu_count() or 1) // local_world_size)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _died(rank: int, exitcode: int | None, *, starting: bool) -> RankFailure:
    if exitcode is not None and exitcode < 0:
        how = f"was killed by signal {signal.Signals(-exitcode).name}"
    else:
        how = f"exited with code {exitcode}"
    if starting:
        why = (
            "while starting, before shardkit's code ran in it; its traceback is on stderr. "
            "Usually the script starts ranks when imported: each rank re-imports the main "
            'script, so put the call under `if __name__ == "__main__":`'
        )
    else:
        why = "before reporting a result (out of memory, a crash in native code, or os._exit)"
    return RankFailure(
        rank=rank,
        phase="exit",
        exc_type="ProcessExited",
        message=f"the process {how} {why}",
        traceback="",
    )


def _start_timeout(pending: list[int], timeout: float) -> RankFailure:
    return RankFailure(
        rank=pending[0],
        phase="join",
        exc_type="TimeoutError",
        message=f"rank(s) {pending} did not start within {timeout + _START_ALLOWANCE_S:g} s",
        traceback="",
    )


def _error(failures: list[RankFailure], world_size: int, stacks: dict[int, str]) -> RankFailedError:
    # Report the failure that started it: an error in user code first, unless that error only
    # says a peer went away (then the peer's death is the cause), then the earliest.
    order = {"fn": 0, "result": 1, "join": 2, "exit": 3, "finish": 5}

    def rank_of(failure: RankFailure) -> tuple[int, int]:
        phase_order = 4 if _lost_peer(failure) else order[failure.phase]
        return phase_order, failures.index(failure)

    primary = min(failures, key=rank_of)
    others = [f for f in failures if f is not primary]
    return RankFailedError(primary, world_size, others, stacks)


def _lost_peer(failure: RankFailure) -> bool:
    """The failure only says that another rank went away or failed first."""
    if failure.secondary:
        return True
    return failure.phase == "fn" and any(m in failure.message for m in PEER_LOSS)


def _is_root_cause(failure: RankFailure) -> bool:
    """A failure that needs no other to explain it: stop listening for more."""
    return failure.phase in ("fn", "result", "exit") and not _lost_peer(failure)
