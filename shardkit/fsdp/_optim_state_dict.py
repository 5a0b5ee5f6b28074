"""Optimizer state dicts keyed by parameter name, full or sharded, and back.

[Note: optimizer state]
``optimizer.state_dict()`` keys state by the position of each parameter (a shard) in the
optimizer's groups. `optim_state_dict` re-keys it by the parameter's name in the unsharded model
and converts each state tensor shaped like the shard (Adam's ``exp_avg``, Adadelta's
``square_avg``...) the way the model's state dict converts parameters: gathered to full size
(FULL_STATE_DICT) or wrapped as a DTensor (SHARDED_STATE_DICT). Scalars such as ``step`` are
kept as they are. `optim_state_dict_to_load` goes back: it takes this rank's rows of each state
tensor and positions from the optimizer it is given, so the result loads with
``optimizer.load_state_dict``, on any number of ranks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.fsdp._api import StateDictType
from shardkit.fsdp._param import ShardedParam
from shardkit.fsdp._state import TreeContext
from shardkit.fsdp._state_dict import to_dtensor, to_local
from shardkit.fsdp._summon import units_under

__all__ = ["optim_state_dict", "optim_state_dict_to_load"]

WRAPPED = "_fsdp_wrapped_module."


def _names(model: nn.Module) -> tuple[dict[int, str], dict[int, ShardedParam], TreeContext]:
    units = units_under(model)
    if not units:
        raise ValueError(
            f"{type(model).__name__} contains no fully sharded units; pass the model that "
            "fully_shard or FullyShardedDataParallel wrapped"
        )
    names = {id(p): name.replace(WRAPPED, "") for name, p in model.named_parameters()}
    sharded = {id(p.sharded): p for unit in units for p in unit.group.params}
    return names, sharded, units[0].context


def _flat_params(optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optim.param_groups for p in group["params"]]


def _fqn(names: dict[int, str], param: torch.Tensor, optim: torch.optim.Optimizer) -> str:
    if id(param) not in names:
        raise ValueError(
            f"{type(optim).__name__} holds a parameter of shape {list(param.shape)} that is not "
            "a parameter of the model; build the optimizer over model.parameters() after wrapping"
        )
    return names[id(param)]


def optim_state_dict(
    model: nn.Module, optim: torch.optim.Optimizer, optim_state_dict: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``optim``'s state keyed by parameter name, full or sharded. See [Note: optimizer state].

    The form follows `state_dict_type` (full by default for FullyShardedDataParallel, sharded
    for fully_shard). A collective: call it on every rank.
    """
    names, sharded, ctx = _names(model)
    osd = optim_state_dict if optim_state_dict is not None else optim.state_dict()
    params = _flat_params(optim)
    full = ctx.state_dict_type is StateDictType.FULL_STATE_DICT
    config = ctx.optim_state_dict_config
    state: dict[str, Any] = {}
    for index, param in enumerate(params):
        fqn = _fqn(names, param, optim)
        entry = osd["state"].get(index)
        if entry is None:
            continue
        owner = sharded.get(id(param))
        state[fqn] = {
            key: _export(owner, value, fqn, key, full=full, offload=config.offload_to_cpu)
            for key, value in entry.items()
        }
    groups = [
        {
            **{k: v for k, v in group.items() if k != "params"},
            "params": [names[id(params[i])] for i in group["params"]],
        }
        for group in osd["param_groups"]
    ]
    if full and getattr(config, "rank0_only", False) and dist.get_rank() != 0:
        return {}
    return {"state": state, "param_groups": groups}


def _export(
    owner: ShardedParam | None, value: Any, fqn: str, key: str, *, full: bool, offload: bool
) -> Any:
    if not isinstance(value, torch.Tensor) or owner is None or value.dim() == 0:
        return value
    if tuple(value.shape) != tuple(owner.local_shape):
        raise ValueError(
            f"optimizer state {key!r} of parameter {fqn!r} has shape {list(value.shape)}, which "
            f"is neither the shard's {list(owner.local_shape)} nor a scalar; shardkit.fsdp can "
            "only gather element-wise optimizer state"
        )
    if full:
        gathered = owner.full_value(value)
        return gathered.cpu() if offload else gathered
    return to_dtensor(owner, value.detach(), offload=offload)


def optim_state_dict_to_load(
    model: nn.Module, optim: torch.optim.Optimizer, optim_state_dict: dict[str, Any]
) -> dict[str, Any]:
    """Turn a name-keyed optimizer state dict (full or sharded) into one that
    ``optim.load_state_dict`` accepts on this rank. See [Note: optimizer state]."""
    names, sharded, _ = _names(model)
    params = _flat_params(optim)
    index = {_fqn(names, p, optim): i for i, p in enumerate(params)}
    state: dict[int, Any] = {}
    for fqn, entry in optim_state_dict["state"].items():
        if fqn not in index:
            raise ValueError(
                f"optimizer state for {fqn!r}, which {type(optim).__name__} does not hold; the "
                f"optimizer holds {sorted(index)[:5]}..."
            )
        owner = sharded.get(id(params[index[fqn]]))
        state[index[fqn]] = {key: _import(owner, value, fqn) for key, value in entry.items()}
    saved_groups = optim_state_dict["param_groups"]
    if len(saved_groups) != len(optim.param_groups):
        raise ValueError(
            f"the state dict has {len(saved_groups)} parameter group(s) but "
            f"{type(optim).__name__} has {len(optim.param_groups)}; build the optimizer with the "
            "same groups"
        )
    groups = []
    for saved, group in zip(saved_groups, optim.param_groups):
        mine = [index[_fqn(names, p, optim)] for p in group["params"]]
        if sorted(saved["params"]) != sorted(_fqn(names, p, optim) for p in group["params"]):
            raise ValueError(
                f"parameter group of {saved['params'][:3]}... does not match the optimizer's "
                "group; build the optimizer with the same groups in the same order"
            )
        groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": mine})
    return {"state": state, "param_groups": groups}


def _import(owner: ShardedParam | None, value: Any, fqn: str) -> Any:
    from torch.distributed.tensor import DTensor

    if owner is None or not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value.full_tensor() if isinstance(value, DTensor) else value
    return to_local(owner, value, fqn).clone()
