"""The body of one rank process started by `RankPool`.

[Note: rank protocol]
The parent sends ``("run", run_id, payload)`` or ``("stop",)``; the rank answers ``("ready",)``
once its process group is up, then ``("ok", run_id, result)`` or ``("error", run_id, failure)``
per run. Every message is pickled with plain `pickle` and sent as bytes, so tensors travel by
value and nothing depends on the sender staying alive. A rank that fails sends its failure and
exits; the parent then stops the other ranks, which may be blocked in a collective.
Two store barriers bound every wait: "join" before the process group is created (it names the
ranks that never arrived) and "done/<run_id>" after each run (it names the ranks still busy, and
where they are). Once the group is up the rank records its collectives (see `_intercept`), and
`faulthandler` dumps its stack to ``stack-<rank>`` beside the store on SIGUSR1, for the parent to
show when the rank is too stuck to answer.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import faulthandler
import os
import pickle
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from shardkit.compat import glibc_function
from shardkit.launch import _intercept
from shardkit.launch._context import RankInfo, _set_current, select_backend_and_device
from shardkit.launch._errors import (
    STACK_SIGNAL,
    RendezvousTimeoutError,
    describe_exception,
    stack_file,
)
from shardkit.launch._watch import Watchdog

__all__ = ["START_ALLOWANCE_S", "WorkerConfig", "finish_timeout", "store_barrier", "worker_main"]

# Start-up (importing torch in every rank, seconds apart on a busy machine) is not covered by
# the collective timeout: ranks wait this much longer for each other to join.
START_ALLOWANCE_S = 120.0


class WorkerConfig:
    """What one rank needs to start; plain attributes so it pickles cheaply."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_world_size: int,
        backend: str | None,
        timeout_s: float,
        store_path: str,
        threads: int | None,
        debug: bool,
        watchdog: Watchdog | None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self.store_path = store_path
        self.threads = threads
        self.debug = debug
        self.watchdog = watchdog


def worker_main(conn: Connection, config: WorkerConfig) -> None:
    """Entry point of a rank process. See [Note: rank protocol]."""
    _die_with_parent()
    rank = config.rank
    try:
        info, store = _join(config)
    except BaseException as exc:
        _send(conn, ("error", -1, describe_exception(exc, rank=rank, phase="join")))
        return
    _send(conn, ("ready",))
    try:
        _serve(conn, info, store)
    finally:
        _intercept.uninstall(ended=True)
        _set_current(None)
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _serve(conn: Connection, info: RankInfo, store: dist.Store) -> None:
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the parent went away
        if message[0] == "stop":
            return
        _, run_id, payload = message
        phase = "fn"
        try:
            fn, args = pickle.loads(payload)
            _intercept.start_run()
            result = fn(info.rank, info.world_size, *args)
            _intercept.finish_run()
            phase = "finish"
            store_barrier(
                store,
                f"done/{run_id}",
                info.rank,
                info.world_size,
                finish_timeout(info.timeout_s),
                "finish",
            )
            phase = "result"
            reply = pickle.dumps(("ok", run_id, result))
        except BaseException as exc:
            _send(conn, ("error", run_id, describe_exception(exc, rank=info.rank, phase=phase)))
            return
        conn.send_bytes(reply)


def _join(config: WorkerConfig) -> tuple[RankInfo, dist.Store]:
    local_rank = config.rank % config.local_world_size
    # Set the variables torchrun would set, for user code and libraries that read them.
    os.environ.update(
        RANK=str(config.rank),
        WORLD_SIZE=str(config.world_size),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(config.local_world_size),
        GROUP_RANK=str(config.rank // config.local_world_size),
    )
    if config.debug:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        os.environ["SHARDKIT_DEBUG"] = "1"
        dist.set_debug_level_from_env()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    backend, device = select_backend_and_device(local_rank, config.local_world_size, config.backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.FileStore(config.store_path, config.world_size)
    join_s = config.timeout_s + START_ALLOWANCE_S
    store_barrier(store, "join", config.rank, config.world_size, join_s, "join")
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("pg", store),
        rank=config.rank,
        world_size=config.world_size,
        timeout=datetime.timedelta(seconds=config.timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    info = RankInfo(
        rank=config.rank,
        world_size=config.world_size,
        local_rank=local_rank,
        local_world_size=config.local_world_size,
        backend=backend,
        device=device,
        timeout_s=config.timeout_s,
    )
    _set_current(info)
    if config.watchdog is not None:
        _intercept.install(
            store,
            rank=config.rank,
            world_size=config.world_size,
            timeout_s=config.timeout_s,
            watchdog=config.watchdog,
        )
    # Kept open for the life of the process: faulthandler writes to its descriptor.
    dump = open(stack_file(config.store_path, config.rank), "w")  # noqa: SIM115
    faulthandler.register(STACK_SIGNAL, file=dump, all_threads=True)
    return info, store


def finish_timeout(timeout_s: float) -> float:
    """How long a finished rank waits for the others. Longer than a collective's timeout, so
    that a rank stuck in a collective reports which one (more useful) before the ranks waiting
    here give up; this wait only catches ranks stuck outside any collective."""
    return 2 * timeout_s + 5


def store_barrier(
    store: dist.Store, name: str, rank: int, world_size: int, timeout_s: float, what: str
) -> None:
    """Wait until every rank reached barrier ``name``; on timeout, name the ranks missing."""
    keys = [f"shardkit/{name}/{r}" for r in range(world_size)]
    store.set(keys[rank], "1")
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            message = _barrier_message(what, rank, missing, timeout_s)
            where = _intercept.whereabouts(missing)
            error = RendezvousTimeoutError(message + (f":\n{where}" if where else ""))
            if what == "finish":
                error.late_ranks = tuple(missing)  # type: ignore[attr-defined]
            raise error
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _barrier_message(what: str, rank: int, missing: list[int], timeout_s: float) -> str:
    if what == "join":
        return (
            f"rank {rank} waited {timeout_s:g} s for rank(s) {missing} to join the process "
            "group; they never started or are stuck before it (raise the timeout if start-up "
            "is slow)"
        )
    return (
        f"rank {rank} finished but rank(s) {missing} did not finish within {timeout_s:g} s: "
        "they are stuck outside any collective (a loop, a lock, or waiting for input)"
    )


def _send(conn: Connection, message: Any) -> None:
    with contextlib.suppress(OSError):
        conn.send_bytes(pickle.dumps(message))


def _die_with_parent() -> None:
    """Ask Linux to kill this rank if the parent dies, so that no rank outlives its job."""
    prctl = glibc_function("prctl", (ctypes.c_int, ctypes.c_ulong))
    if prctl is not None:
        pr_set_pdeathsig = 1
        prctl(pr_set_pdeathsig, signal.SIGKILL)
