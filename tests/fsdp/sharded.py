"""The models of `tests.fsdp.models` under FSDP, and their full state: what several test files
(and tests/checkpoint) build and read back."""

from __future__ import annotations

import torch

from shardkit.fsdp import (
    FullStateDictConfig,
    FullyShardedDataParallel,
    ShardingStrategy,
    StateDictType,
    fully_shard,
    state_dict_type,
)
from shardkit.fsdp.wrap import ModuleWrapPolicy
from tests.fsdp.models import OPTIMIZERS, Block, make_model


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer whole (an FSDP model's full state dict), cloned."""
    with state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig()):
        return {key: value.clone() for key, value in model.state_dict().items()}


def wrapped(strategy: str = "FULL_SHARD", seed: int = 0) -> FullyShardedDataParallel:
    """The model under the FSDP wrapper, one unit per block."""
    return FullyShardedDataParallel(
        make_model(seed),
        sharding_strategy=ShardingStrategy[strategy],
        auto_wrap_policy=ModuleWrapPolicy({Block}),
    )


def model_and_optimizer(face: str, strategy: str = "FULL_SHARD", seed: int = 0):
    """The model under the wrapper (``face="wrapper"``) or ``fully_shard`` per block and at the
    root, with Adam over its parameters."""
    if face == "wrapper":
        model = wrapped(strategy, seed)
    else:
        model = make_model(seed)
        for block in model.blocks:
            fully_shard(block, strategy=ShardingStrategy[strategy])
        fully_shard(model, strategy=ShardingStrategy[strategy])
    return model, OPTIMIZERS["adam"](model.parameters())
