"""Optimizer state dicts keyed by parameter name, full, sharded or local, and back.

[Note: optimizer state]
``optimizer.state_dict()`` keys state by the position of each parameter (a shard) in the
optimizer's groups. `optim_state_dict` re-keys it by the parameter's name in the unsharded model
and converts each state tensor shaped like the shard (Adam's ``exp_avg``, Adadelta's
``square_avg``...; a DTensor for ``fully_shard``'s DTensor parameters) the way the model's state
dict converts parameters: gathered to full size (FULL_STATE_DICT), a DTensor
(SHARDED_STATE_DICT) or this rank's rows (LOCAL_STATE_DICT). Scalars such as ``step`` are kept
as they are. `optim_state_dict_to_load` goes back: it takes this rank's rows of each state tensor
(a DTensor again for DTensor parameters) and positions from the optimizer it is given, so the
result loads with ``optimizer.load_state_dict``, on any number of ranks. torch's
``ShardedTensor`` values (what its ``load_sharded_optimizer_state_dict`` returns) are read
whole first (`full_of`).
"""

from __future__ import annotations

import enum
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.compat import is_dtensor
from shardkit.fsdp._config import SaveForm
from shardkit.fsdp._param import ShardedParam, local_of
from shardkit.fsdp._sharded_tensor import ShardedTensor, full_of
from shardkit.fsdp._state import TreeContext
from shardkit.fsdp._state_dict import CHECKPOINT_PREFIX, to_local
from shardkit.fsdp._summon import units_under

__all__ = [
    "OptimStateKeyType",
    "optim_state_dict",
    "optim_state_dict_to_load",
    "rekey_optim_state_dict",
]

WRAPPED = "_fsdp_wrapped_module."


@enum.unique
class OptimStateKeyType(enum.Enum):
    """How an optimizer state dict names parameters: by name or by position
    (`rekey_optim_state_dict`)."""

    PARAM_NAME = enum.auto()
    PARAM_ID = enum.auto()


def clean_name(name: str) -> str:
    """A parameter's name in the unsharded model (no wrapper or checkpoint-wrapper parts)."""
    return name.replace(WRAPPED, "").replace(CHECKPOINT_PREFIX, "")


def _names(model: nn.Module) -> tuple[dict[int, str], dict[int, ShardedParam], TreeContext]:
    units = units_under(model)
    if not units:
        raise ValueError(
            f"{type(model).__name__} contains no fully sharded units; pass the model that "
            "fully_shard or FullyShardedDataParallel wrapped"
        )
    units[0].context.finish_pending_reduce()
    names = {id(p): clean_name(name) for name, p in model.named_parameters()}
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
    """``optim``'s state keyed by parameter name. See [Note: optimizer state].

    The form follows `state_dict_type` (full by default for FullyShardedDataParallel, sharded
    for fully_shard). A collective: call it on every rank.
    """
    names, sharded, ctx = _names(model)
    osd = optim_state_dict if optim_state_dict is not None else optim.state_dict()
    params = _flat_params(optim)
    form = ctx.state_dict_form
    state: dict[str, Any] = {}
    for index, param in enumerate(params):
        fqn = _fqn(names, param, optim)
        entry = osd["state"].get(index)
        if entry is None:
            continue
        owner = sharded.get(id(param))
        state[fqn] = {
            key: _export(owner, value, fqn, key, form=form.form, offload=form.optim_offload_to_cpu)
            for key, value in entry.items()
        }
    groups = [
        {
            **{k: v for k, v in group.items() if k != "params"},
            "params": [names[id(params[i])] for i in group["params"]],
        }
        for group in osd["param_groups"]
    ]
    if form.form is SaveForm.FULL and form.optim_rank0_only and dist.get_rank() != 0:
        return {}
    return {"state": state, "param_groups": groups}


def _elementwise(owner: ShardedParam | None, value: Any, fqn: str, key: str) -> bool:
    """Whether ``value`` is optimizer state laid out like the parameter's shard."""
    if owner is None or not isinstance(value, torch.Tensor):
        return False
    if is_dtensor(value):
        return True
    if value.dim() == 0:
        return False
    if tuple(value.shape) != tuple(owner.local_shape):
        raise ValueError(
            f"optimizer state {key!r} of parameter {fqn!r} has shape {list(value.shape)}, which "
            f"is neither the shard's {list(owner.local_shape)} nor a scalar; shardkit.fsdp can "
            "only gather element-wise optimizer state"
        )
    return True


def _export(
    owner: ShardedParam | None,
    value: Any,
    fqn: str,
    key: str,
    *,
    form: SaveForm,
    offload: bool,
) -> Any:
    if not _elementwise(owner, value, fqn, key):
        return value
    assert owner is not None
    local = local_of(value).detach()
    if form is SaveForm.FULL:
        out = owner.full_value(local)
    elif form is SaveForm.LOCAL:
        out = local
    else:
        return owner.wrap(local.cpu() if offload else local)
    return out.cpu() if offload else out


def optim_state_dict_to_load(
    model: nn.Module, optim: torch.optim.Optimizer, optim_state_dict: dict[str, Any]
) -> dict[str, Any]:
    """Turn a name-keyed optimizer state dict (full, sharded or local) into one that
    ``optim.load_state_dict`` accepts on this rank. See [Note: optimizer state]."""
    names, sharded, ctx = _names(model)
    local_form = ctx.state_dict_form.form is SaveForm.LOCAL
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
        state[index[fqn]] = {
            key: _import(owner, value, fqn, key, local_form=local_form)
            for key, value in entry.items()
        }
    return {"state": state, "param_groups": _groups_to_load(optim_state_dict, optim, names, index)}


def _groups_to_load(
    saved_state: dict[str, Any],
    optim: torch.optim.Optimizer,
    names: dict[int, str],
    index: dict[str, int],
) -> list[dict[str, Any]]:
    saved_groups = saved_state["param_groups"]
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
    return groups


def _import(owner: ShardedParam | None, value: Any, fqn: str, key: str, *, local_form: bool) -> Any:
    if isinstance(value, ShardedTensor):  # torch's FSDP1 reload gives these: see its module
        value = full_of(value)
    if owner is None or not isinstance(value, torch.Tensor):
        return value
    like_param = is_dtensor(value) or (
        value.dim() > 0 and tuple(value.shape) in (tuple(owner.shape), tuple(owner.local_shape))
    )
    if owner.dtensor and owner.whole and not owner.shape and key != "step":
        like_param = True  # a 0-dim parameter's state is 0-dim too; ``step`` is the scalar
    if not like_param:
        return value.full_tensor() if is_dtensor(value) else value
    rows = to_local(owner, value, fqn, local_form=local_form).clone()
    return owner.wrap(rows) if owner.dtensor else rows


def rekey_optim_state_dict(
    optim_state_dict: dict[str, Any],
    optim_state_key_type: OptimStateKeyType,
    model: nn.Module,
    optim_input: Any = None,
    optim: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """Re-key an optimizer state dict by parameter name (what `optim_state_dict` gives) or by
    position (what an unwrapped model's optimizer takes), positions following ``optim``'s groups
    or else ``model.parameters()``."""
    if optim_input is not None:
        raise ValueError("optim_input is deprecated in torch and not taken; pass optim=")
    ordered = _flat_params(optim) if optim is not None else list(model.parameters())
    names = {id(p): clean_name(n) for n, p in model.named_parameters()}
    by_id = {i: names[id(p)] for i, p in enumerate(ordered)}
    by_name = {name: i for i, name in by_id.items()}
    to_name = optim_state_key_type is OptimStateKeyType.PARAM_NAME
    rekey = (lambda k: by_id.get(k, k)) if to_name else (lambda k: by_name.get(k, k))
    return {
        "state": {rekey(k): v for k, v in optim_state_dict["state"].items()},
        "param_groups": [
            {**group, "params": [rekey(k) for k in group["params"]]}
            for group in optim_state_dict["param_groups"]
        ],
    }
