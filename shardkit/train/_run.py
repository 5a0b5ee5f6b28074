"""Start the ranks of a training run: spawned here, or joined under torchrun."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from shardkit.launch import init_from_env, shutdown, spawn
from shardkit.train._config import TrainConfig
from shardkit.train._loop import train_rank

__all__ = ["run"]


def run(config: TrainConfig) -> dict[str, Any]:
    """Train with ``config``: under torchrun this process is one rank, else ``config.nproc``
    ranks are spawned. Returns rank 0's result."""
    if dist.is_torchelastic_launched():
        info = init_from_env(timeout=config.timeout)
        try:
            return train_rank(info.rank, info.world_size, config)
        finally:
            shutdown()
    results = spawn(
        train_rank,
        world_size=config.nproc,
        args=(config,),
        timeout=config.timeout,
        local_world_size=config.local_world_size,
    )
    return results[0]
