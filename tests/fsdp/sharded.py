"""The models of `tests.fsdp.models` under FSDP, and their full state: what several test files
(and tests/checkpoint) build and read back."""

from __future__ import annotations

import torch

from shardkit.fsdp import (
    FullStateDictConfig,
    FullyShardedDataParallel,
    ShardingStrategy,
    StateDictType,
    state_dict_type,
)
from shardkit.fsdp.wrap import ModuleWrapPolicy
from tests.fsdp.models import OPTIMIZERS, Block, fsdp2_kwargs, make_model, shard_blocks


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer whole (an FSDP model's full state dict), cloned."""
    with state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig()):
        return {key: value.clone() for key, value in model.state_dict().items()}


def wrapped(
    strategy: str = "FULL_SHARD", seed: int = 0, device: torch.device | None = None
) -> FullyShardedDataParallel:
    """The model under the FSDP wrapper, one unit per block, computing on ``device`` (default:
    the rank's)."""
    return FullyShardedDataParallel(
        make_model(seed),
        sharding_strategy=ShardingStrategy[strategy],
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        device_id=device,
    )


def model_and_optimizer(
    face: str, strategy: str = "FULL_SHARD", seed: int = 0, device: torch.device | None = None
):
    """The model under the wrapper (``face="wrapper"``) or ``fully_shard`` per block and at the
    root (FSDP2's keywords for ``strategy``), with Adam over its parameters, computing on
    ``device`` (default: the rank's)."""
    if face == "wrapper":
        model = wrapped(strategy, seed, device)
    else:
        import torch.distributed as dist

        kwargs = fsdp2_kwargs(strategy, dist.get_world_size(), device=device)
        model = shard_blocks(make_model(seed), **kwargs)
    return model, OPTIMIZERS["adam"](model.parameters())
