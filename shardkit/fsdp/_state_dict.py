"""Model state dicts: full tensors of the unsharded model, or DTensor shards for DCP.

[Note: state dict hooks]
``module.state_dict()`` first collects what the modules hold (shards), then each unit's
post-hook replaces its parameters' entries: FULL_STATE_DICT gathers them one at a time (moving
each to the CPU right away with ``offload_to_cpu``); SHARDED_STATE_DICT wraps each shard in a
DTensor with the parameter's global shape (``Shard(0)`` over the shard group, ``Replicate`` over
replicas: see [Note: shard layout]), so ``torch.distributed.checkpoint`` writes each rank's rows
with their offsets and can load them into any number of ranks. Buffers go back to the dtype they
had before mixed precision. ``load_state_dict`` runs each unit's pre-hook first, which turns a
full tensor or a DTensor into this rank's rows, so the ordinary copy into the shard follows.
The keys are those of the unsharded module in both forms.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.fsdp._api import FullStateDictConfig, ShardedStateDictConfig, StateDictType
from shardkit.fsdp._param import ShardedParam
from shardkit.fsdp._state import FSDPState, TreeContext, get_state

__all__ = ["install_state_dict_hooks", "state_dict_type", "to_dtensor", "to_local"]

Config = FullStateDictConfig | ShardedStateDictConfig


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
    config = ctx.state_dict_config
    return ctx.state_dict_type is StateDictType.FULL_STATE_DICT and getattr(
        config, "rank0_only", False
    )


def _save_unit(state: FSDPState, sd: dict[str, Any], prefix: str) -> None:
    ctx = state.context
    offload = ctx.state_dict_config.offload_to_cpu
    drop = _rank0_only(ctx) and dist.get_rank() != 0
    for param in state.group.params:
        if ctx.state_dict_type is StateDictType.FULL_STATE_DICT:
            value = param.full_value()
            value = value.cpu() if offload else value
        else:
            value = to_dtensor(param, param.sharded.detach(), offload=offload)
        for slot in param.slots:
            key = prefix + slot.fqn
            if drop:
                sd.pop(key, None)
            elif key in sd:
                sd[key] = value
    for info in state.group.buffers:
        key = prefix + info.fqn
        if key not in sd:
            continue
        if drop:
            del sd[key]
            continue
        buffer = sd[key].to(info.dtype)
        sd[key] = buffer.cpu() if offload else buffer


def to_dtensor(param: ShardedParam, local: torch.Tensor, *, offload: bool = False) -> Any:
    """``local`` (laid out like the shard) as a DTensor with the parameter's global shape."""
    from torch.distributed.tensor import DTensor, Replicate

    mesh, placements = param.mesh_info.mesh_and_placements
    if param.whole:  # every rank holds all of it (see [Note: shard layout])
        placements = tuple(Replicate() for _ in placements)
    local = local.cpu() if offload else local
    return DTensor.from_local(
        local,
        mesh,
        placements,
        run_check=False,
        shape=param.shape,
        stride=_contiguous_stride(param.shape),
    )


def _contiguous_stride(shape: torch.Size) -> tuple[int, ...]:
    stride, out = 1, []
    for size in reversed(shape):
        out.append(stride)
        stride *= size
    return tuple(reversed(out))


def _load_unit(state: FSDPState, sd: dict[str, Any], prefix: str) -> None:
    state.group.reshard()
    for param in state.group.params:
        for slot in param.slots:
            key = prefix + slot.fqn
            if key in sd:
                sd[key] = to_local(param, sd[key], key)


def to_local(param: ShardedParam, value: Any, key: str) -> torch.Tensor:
    """This rank's rows of ``value``: a full tensor or a DTensor of the parameter's shape."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        if tuple(value.shape) != tuple(param.shape):
            raise ValueError(_shape_message(key, value.shape, param.shape))
        local = value.to_local()
        mesh, placements = param.mesh_info.mesh_and_placements
        same = value.device_mesh == mesh and tuple(value.placements) == tuple(placements)
        if same and tuple(local.shape) == param.local_shape:
            return local
        value = value.full_tensor()
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"state dict entry {key!r} must be a tensor, got {type(value).__name__}")
    if tuple(value.shape) != tuple(param.shape):
        raise ValueError(_shape_message(key, value.shape, param.shape))
    return param.local_rows(value)


def _shape_message(key: str, got: Any, want: Any) -> str:
    return (
        f"state dict entry {key!r} has shape {list(got)} but the parameter has shape "
        f"{list(want)}; load a state dict of the unsharded model (FULL_STATE_DICT) or one saved "
        "with SHARDED_STATE_DICT from the same model"
    )


def _contexts(module: nn.Module) -> list[TreeContext]:
    found: list[TreeContext] = []
    for sub in module.modules():
        state = get_state(sub)
        if state is not None and state.context not in found:
            found.append(state.context)
    return found


@contextlib.contextmanager
def state_dict_type(
    module: nn.Module,
    state_dict_type: StateDictType,
    state_dict_config: Config | None = None,
    optim_state_dict_config: Config | None = None,
) -> Iterator[None]:
    """Within the block, ``module.state_dict()`` and `optim_state_dict` give ``state_dict_type``.

    Example::

        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
            states = model.state_dict()   # full tensors on rank 0, {} elsewhere
    """
    if not isinstance(state_dict_type, StateDictType):
        raise TypeError(
            f"state_dict_type must be a shardkit.fsdp.StateDictType, got {state_dict_type!r}; "
            "use StateDictType.FULL_STATE_DICT or StateDictType.SHARDED_STATE_DICT"
        )
    default: Config = (
        FullStateDictConfig()
        if state_dict_type is StateDictType.FULL_STATE_DICT
        else ShardedStateDictConfig()
    )
    config = state_dict_config or default
    optim_config = optim_state_dict_config or config
    for given in (config, optim_config):
        if isinstance(given, FullStateDictConfig) != (
            state_dict_type is StateDictType.FULL_STATE_DICT
        ):
            raise ValueError(
                f"{type(given).__name__} does not go with {state_dict_type.name}; use "
                "FullStateDictConfig with FULL_STATE_DICT, ShardedStateDictConfig with "
                "SHARDED_STATE_DICT"
            )
    contexts = _contexts(module)
    if not contexts:
        raise ValueError(
            f"{type(module).__name__} contains no fully sharded units; state_dict_type applies "
            "to a module wrapped with fully_shard or FullyShardedDataParallel"
        )
    saved = [(c.state_dict_type, c.state_dict_config, c.optim_state_dict_config) for c in contexts]
    for ctx in contexts:
        ctx.state_dict_type = state_dict_type
        ctx.state_dict_config, ctx.optim_state_dict_config = config, optim_config
    try:
        yield
    finally:
        for ctx, (kind, cfg, optim_cfg) in zip(contexts, saved):
            ctx.state_dict_type, ctx.state_dict_config, ctx.optim_state_dict_config = (
                kind,
                cfg,
                optim_cfg,
            )
