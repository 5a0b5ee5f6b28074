"""Meta-device modules: give sharded parameters real values without building the whole model.

[Note: materialising]
A module built on the meta device is sharded on the meta device (shapes only). Materialising
walks the modules in ``module.modules()`` order; for each module with meta parameters or buffers
of its own it puts full-size empty parameters on the compute device in their place, runs
``init_fn(module)`` (default: ``module.reset_parameters()``, as torch's FSDP), keeps this rank's
rows as the shard and frees the full tensors before the next module. So at most one module's
parameters exist in full at a time, and every rank computes the same values from the same random
state: the result equals initialising the unsharded module the same way, module by module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.fsdp._mesh_info import compute_device
from shardkit.fsdp._param import ShardedParam, set_param
from shardkit.fsdp._param_group import ParamGroup
from shardkit.fsdp._state import FSDPState, get_state

__all__ = ["has_meta", "materialize"]

logger = logging.getLogger(__name__)


def _units(module: nn.Module) -> list[FSDPState]:
    return [state for m in module.modules() if (state := get_state(m)) is not None]


def has_meta(module: nn.Module) -> bool:
    """Whether any unit under ``module`` still has a shard or buffer on the meta device."""
    for state in _units(module):
        if any(p.local.is_meta for p in state.group.params):
            return True
        if any(b.module._buffers[b.name].is_meta for b in state.group.buffers):  # type: ignore[union-attr]
            return True
    return False


def materialize(
    module: nn.Module,
    *,
    init_fn: Callable[[nn.Module], None] | None = None,
    sync_module_states: bool = False,
) -> None:
    """Initialise every meta shard and buffer under ``module``. See [Note: materialising]."""
    units = _units(module)
    if not units:
        raise ValueError(
            f"{type(module).__name__} has no fully sharded units: materialize() applies to a "
            "module wrapped with fully_shard or FullyShardedDataParallel"
        )
    owner = {(id(s.module), s.attr): p for u in units for p in u.group.params for s in p.slots}
    groups = {id(p): u.group for u in units for p in u.group.params}
    buffer_dtype = {(id(b.module), b.name): u for u in units for b in u.group.buffers}
    # the units' compute device (a first unit with buffers only has no mesh to ask)
    device = next((u.group.params[0].mesh_info.device for u in units if u.group.params), None)
    device = device or compute_device()
    count = 0
    for current in module.modules():
        own = [(attr, p) for attr in current._parameters
               if (p := owner.get((id(current), attr))) is not None and p.local.is_meta]  # fmt: skip
        meta_buffers = [a for a, b in current._buffers.items() if b is not None and b.is_meta]
        if not own and not meta_buffers:
            continue
        loads = [(attr, param, groups[id(param)]) for attr, param in own]
        _materialize_one(current, loads, meta_buffers, device, init_fn, sync_module_states)
        for attr in meta_buffers:
            unit = buffer_dtype.get((id(current), attr))
            dtype = unit.config.precision.buffer_dtype if unit is not None else None
            buffer = current._buffers[attr]
            if dtype is not None and buffer is not None and buffer.is_floating_point():
                current._buffers[attr] = buffer.to(dtype)
        count += 1
    logger.info("materialised %d module(s) from the meta device on %s", count, device)


def _materialize_one(
    module: nn.Module,
    own: list[tuple[str, ShardedParam, ParamGroup]],
    meta_buffers: list[str],
    device: torch.device,
    init_fn: Callable[[nn.Module], None] | None,
    sync: bool,
) -> None:
    for attr, param, _ in own:
        full = torch.empty(param.shape, dtype=param.dtype, device=device)
        set_param(module, attr, nn.Parameter(full, param.sharded.requires_grad))
    for attr in meta_buffers:
        module._buffers[attr] = torch.empty_like(module._buffers[attr], device=device)  # type: ignore[arg-type]
    if init_fn is not None:
        init_fn(module)
    elif (reset := getattr(module, "reset_parameters", None)) is not None:
        with torch.no_grad():
            reset()
    else:
        names = [attr for attr, _, _ in own] + meta_buffers
        raise ValueError(
            f"{type(module).__name__} has parameters or buffers {names} on the meta device and "
            "no reset_parameters() to initialise them; pass param_init_fn= (FullyShardedDataParallel)"
            " or init_fn= (materialize) that initialises one module's own parameters"
        )
    for attr, param, group in own:
        initialised = module._parameters[attr]
        assert initialised is not None
        if sync:
            _broadcast(initialised.detach(), param)
        group.load(param, initialised.detach().to(device))
    if sync:
        for attr in meta_buffers:
            buffer = module._buffers[attr]
            assert buffer is not None
            comm.broadcast(buffer, src=0, group=None, inplace=True)


def _broadcast(full: torch.Tensor, param: ShardedParam) -> None:
    group = param.mesh_info.world_group
    if dist.get_world_size(group) > 1:
        comm.broadcast(full, src=dist.get_global_rank(group, 0), group=group, inplace=True)
