"""Start the ranks of a training run: spawned here, or joined under torchrun."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from shardkit.launch import init_from_env, shutdown, spawn
from shardkit.train._config import TrainConfig
from shardkit.train._loop import train_rank
from shardkit.train._prepare import Prepared, prepare

__all__ = ["run"]


def run(config: TrainConfig, *, rank_setup: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train with ``config``: under torchrun this process is one rank, else ``config.nproc``
    ranks are spawned. Returns rank 0's result.

    Input is checked first (data paths, the checkpoint to resume, every row of table data):
    refused input raises here, in this process, before any rank starts or anything is written.

    ``rank_setup`` (a picklable function) runs first in every rank's process: the command line
    uses it to show the ``shardkit.train`` log on the terminal. Progress and results are logged
    at INFO on ``shardkit.train`` (rank 0 only).
    """
    if dist.is_torchelastic_launched():
        info = init_from_env(timeout=config.timeout)
        try:  # rank 0 prepares, see [Note: refusing input before ranks start]
            return _rank(info.rank, info.world_size, config, rank_setup, None)
        finally:
            shutdown()
    prepared = prepare(config, config.nproc)  # bad input: refused here, before ranks start
    results = spawn(
        _rank,
        world_size=config.nproc,
        args=(config, rank_setup, prepared),
        timeout=config.timeout,
        local_world_size=config.local_world_size,
    )
    return results[0]


def _rank(
    rank: int,
    world_size: int,
    config: TrainConfig,
    setup: Callable[[], None] | None,
    prepared: Prepared | None,
) -> dict[str, Any]:
    if setup is not None:
        setup()
    return train_rank(rank, world_size, config, prepared)
