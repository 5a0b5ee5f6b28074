"""What a training checkpoint holds, gathered from and written back into live objects.

``{"model": model.state_dict(), "optim": {"fused": ..., "dense": ...}, "extra": ..., "rng": ...}``
(torch.distributed.checkpoint flattens it to ``model.<fqn>``, ``optim.fused.<path>.<table>.<state>``
...). Sharded tables are ShardedTensors, data-parallel FSDP parameters DTensors: the checkpoint
library saves each shard once, from the rank that holds it, and reads into any other sharding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from shardkit.fsdp import (
    FSDPModule,
    FullyShardedDataParallel,
    StateDictType,
    optim_state_dict,
    optim_state_dict_to_load,
    state_dict_type,
)
from shardkit.modules.mc_modules import ManagedCollisionModule
from shardkit.sharding import ShardedCollection, fused_state, load_fused_state

__all__ = [
    "apply_dense_optimizer",
    "apply_fused",
    "dense_optimizer_state",
    "fused_states",
    "has_fsdp",
    "revalidate",
    "sharded_view",
]


def has_fsdp(model: nn.Module) -> bool:
    """Whether parts of ``model`` are fully sharded (FSDP wrapper or ``fully_shard``)."""
    faces = (FSDPModule, FullyShardedDataParallel)
    return any(isinstance(m, faces) for m in model.modules())


@contextlib.contextmanager
def sharded_view(model: nn.Module) -> Iterator[None]:
    """Within the block FSDP parts give and take DTensor shards with global shapes, which the
    checkpoint library writes once each and reads into any world size; other models as they are."""
    if not has_fsdp(model):
        yield
        return
    with state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        yield


def _collections(model: nn.Module) -> dict[str, ShardedCollection]:
    return {
        path: module
        for path, module in model.named_modules()
        if isinstance(module, ShardedCollection)
    }


def _unwrapped(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model) if hasattr(model, "_dmp_wrapped_module") else model


def fused_states(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``{module path: fused_state(collection)}`` for every sharded collection of ``model``."""
    return {path or "root": fused_state(c) for path, c in _collections(_unwrapped(model)).items()}


def apply_fused(model: nn.Module, states: dict[str, dict[str, Any]]) -> None:
    """Write loaded fused-optimizer state back (see `shardkit.sharding.load_fused_state`)."""
    for path, collection in _collections(_unwrapped(model)).items():
        load_fused_state(collection, states.get(path or "root", {}))  # {}: no fused shards


def revalidate(model: nn.Module) -> None:
    """After an in-place load: managed-collision remappers re-index the state written into their
    buffers and forget what they had cached (their iteration, their search index)."""
    for module in _unwrapped(model).modules():
        if isinstance(module, ManagedCollisionModule):
            module.validate_state()


def dense_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name (torch keys it by position). Call it in
    `sharded_view`: FSDP parameters' state is then in DTensor shards."""
    if has_fsdp(model):
        return optim_state_dict(model, optimizer)
    names = {id(p): n for n, p in _unwrapped(model).named_parameters()}
    state: dict[str, Any] = {}
    groups = []
    for group in optimizer.param_groups:
        params = [names[id(p)] for p in group["params"]]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
        for param, name in zip(group["params"], params):
            for key, value in optimizer.state.get(param, {}).items():
                state.setdefault(name, {})[key] = value
    return {"state": state, "param_groups": groups}


def apply_dense_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """Load `dense_optimizer_state`'s layout back into ``optimizer`` (in `sharded_view`)."""
    if has_fsdp(model):
        optimizer.load_state_dict(optim_state_dict_to_load(model, optimizer, saved))
        return
    index: dict[str, int] = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            index[_name_of(model, param)] = len(index)
    groups = []
    for group in saved["param_groups"]:
        unknown = [n for n in group["params"] if n not in index]
        if unknown:
            raise ValueError(
                f"the checkpoint's dense optimizer steps parameters this optimizer does not hold: "
                f"{unknown[:3]}"
            )
        groups.append({**group, "params": [index[n] for n in group["params"]]})
    state = {index[name]: value for name, value in saved["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _name_of(model: nn.Module, param: torch.Tensor) -> str:
    for name, candidate in _unwrapped(model).named_parameters():
        if candidate is param:
            return name
    raise ValueError("the optimizer holds a parameter that is not in the model")
