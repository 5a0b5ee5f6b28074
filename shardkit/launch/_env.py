"""Joining a job started by torchrun (or any launcher that sets torchrun's variables).

This is the only module in shardkit that reads the launcher's environment variables.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
from collections.abc import Mapping

import torch.distributed as dist

from shardkit.launch import _intercept
from shardkit.launch._context import (
    DEFAULT_TIMEOUT_S,
    RankInfo,
    _set_current,
    current,
    is_initialized,
    select_backend_and_device,
)
from shardkit.launch._watch import Watchdog

__all__ = ["init_from_env", "local_world_size", "shutdown"]

logger = logging.getLogger(__name__)

_REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_HOW_TO_LAUNCH = (
    "start the script with torchrun (e.g. `torchrun --nproc-per-node=2 train.py`), or start "
    "ranks from Python with shardkit.launch.spawn(fn, world_size=2)"
)


def init_from_env(
    *,
    backend: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
    watchdog: Watchdog | None = Watchdog(),  # noqa: B008 (frozen, so one instance is safe)
) -> RankInfo:
    """Join the process group described by torchrun's environment variables.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (default: ``WORLD_SIZE``),
    ``MASTER_ADDR`` and ``MASTER_PORT``; picks NCCL on ``cuda:<LOCAL_RANK>`` when every local rank
    has a GPU, else gloo on the CPU (``backend`` overrides); sets the CUDA device; creates the
    default process group with ``timeout`` seconds for every collective; records this rank's
    collectives so that a timeout names the rank it waited for (see `Watchdog`).

    Args:
        backend: ``"gloo"``, ``"nccl"`` or None (choose from the hardware).
        timeout: seconds a collective may wait before it fails.
        environ: the variables to read (default: ``os.environ``); for tests.
        watchdog: how this rank names the ranks its collectives wait for; None: no recording.

    Returns:
        This rank's `RankInfo` (also available later from `shardkit.launch.current()`).
    """
    if is_initialized():
        raise RuntimeError("shardkit's process group is already set up in this process")
    variables = _read(os.environ if environ is None else environ)
    rank, world_size, local_rank, local_world_size = _ranks(variables)
    backend, device = select_backend_and_device(local_rank, local_world_size, backend)
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    store = _store(variables, timeout)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("default_pg", store),  # what init_method would have made
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
        device_id=device if device.type == "cuda" else None,
    )
    info = RankInfo(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        backend=backend,
        device=device,
        timeout_s=timeout,
    )
    _set_current(info)
    if watchdog is not None:
        _intercept.install(
            store, rank=info.rank, world_size=info.world_size, timeout_s=timeout, watchdog=watchdog
        )
        atexit.register(_intercept.uninstall, ended=True)  # for scripts that do not call shutdown
    logger.info(
        "rank %d/%d joined (%s on %s, %d ranks per host)",
        rank,
        world_size,
        backend,
        device,
        local_world_size,
    )
    return info


def local_world_size(world_size: int) -> int:
    """Ranks per host of a job of ``world_size`` ranks: what `spawn` or `init_from_env` set up;
    for a process group made by hand, torchrun's ``LOCAL_WORLD_SIZE`` (default: one host)."""
    if is_initialized():
        return min(current().local_world_size, world_size)
    return min(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), world_size)


def shutdown() -> None:
    """Tear down the process group that `init_from_env` created (safe to call twice); ranks
    still waiting for this one learn that its program ended."""
    _intercept.uninstall(ended=True)
    _set_current(None)
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _store(variables: Mapping[str, int | str], timeout: float) -> dist.Store:
    """The job's TCP store (torchrun's agent hosts it, or rank 0), the one ``init_method``
    would connect to, kept so that the flight recorder can use it too."""
    url = f"tcp://{variables['MASTER_ADDR']}:{variables['MASTER_PORT']}"
    rank, world_size = variables["RANK"], variables["WORLD_SIZE"]
    assert isinstance(rank, int) and isinstance(world_size, int)
    limit = datetime.timedelta(seconds=timeout)
    store, _, _ = next(dist.rendezvous(url, rank, world_size, timeout=limit))
    store.set_timeout(limit)
    return store


def _read(environ: Mapping[str, str]) -> dict[str, int | str]:
    missing = [name for name in _REQUIRED if name not in environ]
    if missing:
        raise ValueError(
            f"init_from_env() needs the variables a launcher sets, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: {_HOW_TO_LAUNCH}"
        )
    values: dict[str, int | str] = {
        "MASTER_ADDR": environ["MASTER_ADDR"],
        "MASTER_PORT": environ["MASTER_PORT"],
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        raw = environ.get(name, environ["WORLD_SIZE"])
        try:
            values[name] = int(raw)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    _check(values)
    return values


def _ranks(values: Mapping[str, int | str]) -> tuple[int, int, int, int]:
    """RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, which `_read` made ints."""
    rank, world_size = values["RANK"], values["WORLD_SIZE"]
    local_rank, local_world_size = values["LOCAL_RANK"], values["LOCAL_WORLD_SIZE"]
    assert isinstance(rank, int) and isinstance(world_size, int)
    assert isinstance(local_rank, int) and isinstance(local_world_size, int)
    return rank, world_size, local_rank, local_world_size


def _check(values: Mapping[str, int | str]) -> None:
    rank, world_size, local_rank, local_world_size = _ranks(values)
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK ({rank}) must be in [0, WORLD_SIZE={world_size})")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"LOCAL_RANK ({local_rank}) must be in [0, LOCAL_WORLD_SIZE={local_world_size})"
        )
    if local_world_size > world_size:
        raise ValueError(
            f"LOCAL_WORLD_SIZE ({local_world_size}) cannot exceed WORLD_SIZE ({world_size})"
        )
