"""Model state dicts: full tensors of the unsharded model, DTensor shards for DCP, or local rows.

[Note: state dict hooks]
``module.state_dict()`` first collects what the modules hold (shards), then each unit's
post-hook replaces its parameters' entries: FULL_STATE_DICT gathers them one at a time (moving
each to the CPU right away with ``offload_to_cpu``); SHARDED_STATE_DICT wraps each shard in a
DTensor with the parameter's global shape (``Shard(0)`` over the shard group, ``Replicate`` over
replicas: see [Note: shard layout]), so ``torch.distributed.checkpoint`` writes each rank's rows
with their offsets and can load them into any number of ranks; LOCAL_STATE_DICT gives the rows as
plain tensors. Buffers go back to the dtype they had before mixed precision. ``load_state_dict``
runs each unit's pre-hook first, which turns a full tensor, a DTensor of any layout or local rows
into this rank's rows (as a DTensor for ``fully_shard``'s DTensor parameters), so the ordinary
copy into the shard follows. The keys are those of the unsharded module in every form
(``checkpoint_wrapper``'s ``_checkpoint_wrapped_module.`` left out, as torch does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.compat import is_dtensor
from shardkit.fsdp._config import SaveForm, StateDictForm
from shardkit.fsdp._param import ShardedParam
from shardkit.fsdp._state import FSDPState, TreeContext, get_state
from shardkit.fsdp.api import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    OptimStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)

__all__ = [
    "get_state_dict_type",
    "install_state_dict_hooks",
    "key_forms",
    "set_state_dict_type",
    "state_dict_type",
    "to_local",
]

CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."

# FSDP1's state-dict types, their configs, and the form each stands for
_CONFIGS: dict[StateDictType, tuple[type, type, SaveForm]] = {
    StateDictType.FULL_STATE_DICT: (FullStateDictConfig, FullOptimStateDictConfig, SaveForm.FULL),
    StateDictType.LOCAL_STATE_DICT: (
        LocalStateDictConfig,
        LocalOptimStateDictConfig,
        SaveForm.LOCAL,
    ),
    StateDictType.SHARDED_STATE_DICT: (
        ShardedStateDictConfig,
        ShardedOptimStateDictConfig,
        SaveForm.SHARDED,
    ),
}


def key_forms(key: str) -> tuple[str, ...]:
    """``key`` and, inside ``checkpoint_wrapper``, the key its state-dict hooks turn it into."""
    return (key, key.replace(CHECKPOINT_PREFIX, "")) if CHECKPOINT_PREFIX in key else (key,)


def install_state_dict_hooks(module: nn.Module, state: FSDPState, inner_prefix: str) -> None:
    """Hook ``state``'s conversions into ``module``'s state_dict and load_state_dict.
    ``inner_prefix`` is the path from ``module`` to the unit's parameters' modules."""

    def save(_module: nn.Module, sd: dict[str, Any], prefix: str, _meta: Any) -> None:
        _save_unit(state, sd, prefix + inner_prefix)
        ctx = state.context
        if state.is_root and _rank0_only(ctx) and dist.get_rank() != 0:
            sd.clear()

    def load(_module: nn.Module, sd: dict[str, Any], prefix: str, *_args: Any) -> None:
        _load_unit(state, sd, prefix + inner_prefix)

    module.register_state_dict_post_hook(save)
    module.register_load_state_dict_pre_hook(load)


def _rank0_only(ctx: TreeContext) -> bool:
    form = ctx.state_dict_form
    return form.form is SaveForm.FULL and form.rank0_only


def _save_unit(state: FSDPState, sd: dict[str, Any], prefix: str) -> None:
    ctx = state.context
    ctx.finish_pending_reduce()
    offload = ctx.state_dict_form.offload_to_cpu
    drop = _rank0_only(ctx) and dist.get_rank() != 0
    for param in state.group.params:
        keys = [k for slot in param.slots for k in key_forms(prefix + slot.fqn) if k in sd]
        if not keys:
            continue
        value = _saved_value(param, ctx.state_dict_form.form)  # a collective: on every rank
        for key in keys:
            if drop:
                del sd[key]
            else:
                sd[key] = value.cpu() if offload else value
    for info in state.group.buffers:
        for key in key_forms(prefix + info.fqn):
            if key not in sd:
                continue
            if drop:
                del sd[key]
                continue
            buffer = sd[key].to(info.dtype)
            sd[key] = buffer.cpu() if offload else buffer


def _saved_value(param: ShardedParam, form: SaveForm) -> torch.Tensor:
    if form is SaveForm.FULL:
        return param.full_value()
    if form is SaveForm.LOCAL:
        return param.local.detach()
    return param.wrap(param.local.detach())


def _load_unit(state: FSDPState, sd: dict[str, Any], prefix: str) -> None:
    state.context.finish_pending_reduce()
    state.group.reshard()
    local_form = state.context.state_dict_form.form is SaveForm.LOCAL
    for param in state.group.params:
        for slot in param.slots:
            key = prefix + slot.fqn
            if key in sd:
                rows = to_local(param, sd[key], key, local_form=local_form)
                sd[key] = param.wrap(rows) if param.dtensor else rows


def to_local(
    param: ShardedParam, value: Any, key: str, *, local_form: bool = False
) -> torch.Tensor:
    """This rank's rows of ``value``: a full tensor, a DTensor of the parameter's shape (any
    placements), or (``local_form``) this rank's rows already."""
    if is_dtensor(value):
        if tuple(value.shape) != tuple(param.shape):
            raise ValueError(_shape_message(key, value.shape, param.shape))
        local = value.to_local()
        mesh, placements = param.mesh_info.mesh_and_placements
        same = value.device_mesh == mesh and tuple(value.placements) == tuple(placements)
        if (same or param.whole) and tuple(local.shape) == param.local_shape:
            return local
        value = value.full_tensor()
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"state dict entry {key!r} must be a tensor, got {type(value).__name__}")
    if local_form:
        if tuple(value.shape) != param.local_shape:
            raise ValueError(_shape_message(key, value.shape, param.local_shape, local=True))
        return value
    if tuple(value.shape) != tuple(param.shape):
        raise ValueError(_shape_message(key, value.shape, param.shape))
    return param.local_rows(value)


def _shape_message(key: str, got: Any, want: Any, *, local: bool = False) -> str:
    if local:
        return (
            f"state dict entry {key!r} has shape {list(got)} but this rank's shard has shape "
            f"{list(want)}; a LOCAL_STATE_DICT loads only into the same world size and sharding: "
            "save a SHARDED_STATE_DICT to load it elsewhere"
        )
    return (
        f"state dict entry {key!r} has shape {list(got)} but the parameter has shape "
        f"{list(want)}; load a state dict of the unsharded model (FULL_STATE_DICT) or one saved "
        "with SHARDED_STATE_DICT from the same model"
    )


def _contexts(module: nn.Module, what: str) -> list[TreeContext]:
    found: list[TreeContext] = []
    for sub in module.modules():
        state = get_state(sub)
        if state is not None and state.context not in found:
            found.append(state.context)
    if not found:
        raise ValueError(
            f"{type(module).__name__} contains no fully sharded units; {what} applies to a "
            "module wrapped with fully_shard or FullyShardedDataParallel"
        )
    return found


def _settings(
    kind: StateDictType,
    config: StateDictConfig | None,
    optim_config: OptimStateDictConfig | None,
) -> StateDictSettings:
    if not isinstance(kind, StateDictType):
        raise TypeError(
            f"state_dict_type must be a shardkit.fsdp.StateDictType, got {kind!r}; use "
            "StateDictType.FULL_STATE_DICT, SHARDED_STATE_DICT or LOCAL_STATE_DICT"
        )
    config_cls, optim_cls, _ = _CONFIGS[kind]
    config = config_cls() if config is None else config
    optim_config = optim_cls() if optim_config is None else optim_config
    for given, wanted in ((config, config_cls), (optim_config, optim_cls)):
        if type(given) is not wanted:
            raise ValueError(
                f"{type(given).__name__} does not go with {kind.name}; use {config_cls.__name__} "
                f"and {optim_cls.__name__} with {kind.name}"
            )
    return StateDictSettings(kind, config, optim_config)


def _form_of(settings: StateDictSettings) -> StateDictForm:
    """FSDP1's settings as the form a tree's state dicts take."""
    config, optim_config = settings.state_dict_config, settings.optim_state_dict_config
    return StateDictForm(
        form=_CONFIGS[settings.state_dict_type][2],
        offload_to_cpu=config.offload_to_cpu,
        rank0_only=getattr(config, "rank0_only", False),
        optim_offload_to_cpu=optim_config.offload_to_cpu,
        optim_rank0_only=getattr(optim_config, "rank0_only", False),
    )


def _settings_of(form: StateDictForm) -> StateDictSettings:
    """The FSDP1 settings that stand for ``form`` (what `get_state_dict_type` reports)."""
    kind = next(k for k, (*_, f) in _CONFIGS.items() if f is form.form)
    config_cls, optim_cls, _ = _CONFIGS[kind]
    full = form.form is SaveForm.FULL  # only FULL's configs have rank0_only
    config = config_cls(
        offload_to_cpu=form.offload_to_cpu, **({"rank0_only": form.rank0_only} if full else {})
    )
    optim_config = optim_cls(
        offload_to_cpu=form.optim_offload_to_cpu,
        **({"rank0_only": form.optim_rank0_only} if full else {}),
    )
    return StateDictSettings(kind, config, optim_config)


def set_state_dict_type(
    module: nn.Module,
    state_dict_type: StateDictType,
    state_dict_config: StateDictConfig | None = None,
    optim_state_dict_config: OptimStateDictConfig | None = None,
) -> StateDictSettings:
    """Make ``module.state_dict()`` and `optim_state_dict` give ``state_dict_type`` from now on;
    returns the previous settings."""
    settings = _settings(state_dict_type, state_dict_config, optim_state_dict_config)
    contexts = _contexts(module, "set_state_dict_type")
    previous = get_state_dict_type(module)
    for ctx in contexts:
        ctx.state_dict_form = _form_of(settings)
    return previous


def get_state_dict_type(module: nn.Module) -> StateDictSettings:
    """The state-dict type and configs ``module``'s units use now."""
    return _settings_of(_contexts(module, "get_state_dict_type")[0].state_dict_form)


@contextlib.contextmanager
def state_dict_type(
    module: nn.Module,
    state_dict_type: StateDictType,
    state_dict_config: StateDictConfig | None = None,
    optim_state_dict_config: OptimStateDictConfig | None = None,
) -> Iterator[None]:
    """Within the block, ``module.state_dict()`` and `optim_state_dict` give ``state_dict_type``.

    Example::

        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
            states = model.state_dict()   # full tensors on rank 0, {} elsewhere
    """
    form = _form_of(_settings(state_dict_type, state_dict_config, optim_state_dict_config))
    contexts = _contexts(module, "state_dict_type")
    saved = [ctx.state_dict_form for ctx in contexts]
    for ctx in contexts:
        ctx.state_dict_form = form
    try:
        yield
    finally:
        for ctx, previous in zip(contexts, saved):
            ctx.state_dict_form = previous
