"""Making a unit: find the parameters it manages, check them on every rank, shard them one by one.

[Note: checks on every rank]
A unit's checks (already wrapped, parameters on several devices, a parameter shared with a
nested unit) and a fingerprint of its structure (parameter names, shapes, dtypes, nested units)
travel in one ``all_gather_object`` over all ranks before anything is sharded. If any rank found
a problem, or the fingerprints differ, every rank raises the same ValueError, so no rank waits
in a collective for a rank that raised. Ranks that wrap a different number of units pair the
fingerprint of one unit with that of another and raise at the first difference.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.compat import is_dtensor
from shardkit.fsdp._config import Precision, Prefetch
from shardkit.fsdp._mesh_info import MeshInfo
from shardkit.fsdp._param import ShardedParam, Slot
from shardkit.fsdp._param_group import BufferInfo, ParamGroup
from shardkit.fsdp._stale import REPLACED_ATTR, mark_replaced
from shardkit.fsdp._state import FSDPState, UnitConfig, get_state

__all__ = ["UnitSettings", "build_unit", "is_managed"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnitSettings:
    """Everything a unit is built from (one per wrapping call; auto-wrap shares it).

    ``layout`` names the layout in logs and cross-rank checks (FSDP1's strategy name, or
    ``fully_shard``'s description of its mesh and resharding); ``reshard_after_forward`` (see
    `UnitConfig`) says what happens after forward; ``dtensor``: shards are DTensors (FSDP2).
    """

    mesh_info: MeshInfo
    layout: str
    precision: Precision
    prefetch: Prefetch
    reshard_after_forward: bool | None
    offload: bool = False
    pin_memory: bool = True
    dtensor: bool = False
    ignored_params: frozenset[nn.Parameter] = frozenset()
    ignored_modules: frozenset[nn.Module] = frozenset()
    sync_module_states: bool = False

    @property
    def storage_device(self) -> torch.device:
        return torch.device("cpu") if self.offload else self.mesh_info.device


def is_managed(param: torch.Tensor) -> bool:
    """Whether ``param`` is a shard of some unit."""
    return getattr(param, "_shardkit_fsdp_shard", False)


@dataclass
class _Found:
    params: list[tuple[nn.Parameter, list[Slot]]] = field(default_factory=list)
    buffers: list[tuple[str, nn.Module, str]] = field(default_factory=list)
    nested: list[FSDPState] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def build_unit(
    trigger: nn.Module, module: nn.Module, settings: UnitSettings, *, name: str
) -> FSDPState:
    """Shard the parameters of ``module`` (minus nested units and ignored ones) into a unit whose
    hooks sit on ``trigger`` (``module`` itself, or the FSDP1 wrapper around it)."""
    label = name or type(module).__name__
    found = _collect(module, settings, label)
    existing = get_state(module)
    if existing is not None:
        found.problems.insert(0, _already_wrapped(module, existing))
    found.problems.extend(_device_problems(found.params, label))
    _agree(settings.mesh_info.world_group, found, label, settings.layout)
    params = [_describe(param, slots, settings) for param, slots in found.params]
    group = ParamGroup(
        params,
        _prepare_buffers(found.buffers, settings),
        settings.precision,
        mesh_info=settings.mesh_info,
        storage_device=settings.storage_device,
        meta=any(param.is_meta for param, _ in found.params),
        pin_memory=settings.pin_memory,
    )
    _shard_params(found, group, settings, label)
    config = UnitConfig(
        reshard_after_forward=settings.reshard_after_forward,
        precision=settings.precision,
        prefetch=settings.prefetch,
    )
    state = FSDPState(trigger, group, config, name=label)
    state.adopt(found.nested)
    _log_unit(state, settings)
    return state


def _collect(module: nn.Module, settings: UnitSettings, label: str) -> _Found:
    """Parameters and buffers of the unit's own modules, in registration order."""
    found = _Found()
    by_id: dict[int, list[Slot]] = {}
    for prefix, own in _own_modules(module, settings.ignored_modules, found.nested):
        for attr, param in own._parameters.items():
            if param is None or param in settings.ignored_params:
                continue
            slot = Slot(prefix + attr, own, attr)
            if id(param) in by_id:
                by_id[id(param)].append(slot)
                continue
            if getattr(param, REPLACED_ATTR, None) is not None or is_managed(param):
                found.problems.append(_shared_with_nested(label, slot.fqn, param))
                continue
            if is_dtensor(param):
                found.problems.append(_already_dtensor(label, slot.fqn, param))
                continue
            by_id[id(param)] = [slot]
            found.params.append((param, by_id[id(param)]))
        for attr, buffer in own._buffers.items():
            if buffer is not None:
                found.buffers.append((prefix + attr, own, attr))
    return found


def _own_modules(
    module: nn.Module, ignored: frozenset[nn.Module], nested: list[FSDPState]
) -> list[tuple[str, nn.Module]]:
    """The module and its descendants, pre-order, stopping at nested units and ignored modules."""
    out: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()

    def visit(prefix: str, current: nn.Module) -> None:
        seen.add(id(current))
        out.append((prefix, current))
        for child_name, child in current.named_children():
            if id(child) in seen or child in ignored:
                continue
            state = get_state(child)
            if state is not None:
                if state not in nested:
                    nested.append(state)
                continue
            visit(f"{prefix}{child_name}.", child)

    visit("", module)
    return out


def _already_wrapped(module: nn.Module, existing: FSDPState) -> str:
    return (
        f"{type(module).__name__} is already fully sharded (unit {existing.name!r}); wrap each "
        "module once (call fully_shard or FullyShardedDataParallel on it a single time)"
    )


def _shared_with_nested(label: str, fqn: str, param: torch.Tensor) -> str:
    return (
        f"parameter {fqn!r} of unit {label!r} (shape {list(param.shape)}) is also registered in "
        "another unit, which already sharded it; wrap the modules that share a parameter in "
        "one unit"
    )


def _already_dtensor(label: str, fqn: str, param: torch.Tensor) -> str:
    placements = tuple(param.placements)  # type: ignore[attr-defined]
    return (
        f"parameter {fqn!r} of unit {label!r} is already a DTensor (placements {placements}, "
        "e.g. from tensor parallelism); shardkit.fsdp shards plain parameters only: apply it to "
        "a model without DTensor parameters"
    )


def _device_problems(params: list[tuple[nn.Parameter, list[Slot]]], label: str) -> list[str]:
    devices: dict[str, list[str]] = {}
    for param, slots in params:
        devices.setdefault(str(param.device), []).append(slots[0].fqn)
    if len(devices) <= 1:
        return []
    listing = "; ".join(f"{device}: {', '.join(names[:3])}" for device, names in devices.items())
    return [
        f"unit {label!r} has parameters on {len(devices)} devices ({listing}); one unit gathers "
        "all its parameters on one device: move the module to one device (module.to(device)) "
        "before wrapping, or wrap the parts separately"
    ]


# ---- agreement across ranks ---------------------------------------------------------------------


def _fingerprint(found: _Found, label: str, layout: str) -> dict[str, Any]:
    return {
        "unit": label,
        "layout": layout,
        "params": [(slots[0].fqn, list(p.shape), str(p.dtype)) for p, slots in found.params],
        "nested": sorted(state.name for state in found.nested),
    }


def _agree(group: dist.ProcessGroup, found: _Found, label: str, layout: str) -> None:
    """See [Note: checks on every rank]."""
    mine = (found.problems[0] if found.problems else None, _fingerprint(found, label, layout))
    everyone = (
        [mine] if dist.get_world_size(group) == 1 else comm.all_gather_object(mine, group=group)
    )
    reported = [(rank, problem) for rank, (problem, _) in enumerate(everyone) if problem]
    if reported:
        rank, problem = reported[0]
        everywhere = len(reported) == len(everyone) and len({p for _, p in reported}) == 1
        raise ValueError(problem if everywhere else f"on rank {rank}: {problem}")
    prints = [fp for _, fp in everyone]
    for rank, other in enumerate(prints):
        difference = _difference(prints[0], other, rank)
        if difference:
            raise ValueError(
                f"the module structure differs across ranks while wrapping unit {label!r}: "
                f"{difference}. Every rank must build the same model and wrap "
                "the same modules in the same order"
            )


def _difference(first: dict[str, Any], other: dict[str, Any], rank: int) -> str | None:
    if first["unit"] != other["unit"]:
        return f"rank 0 wraps unit {first['unit']!r} where rank {rank} wraps {other['unit']!r}"
    if first["layout"] != other["layout"]:
        return f"rank 0 uses {first['layout']}, rank {rank} {other['layout']}"
    mine = {fqn: (shape, dtype) for fqn, shape, dtype in first["params"]}
    theirs = {fqn: (shape, dtype) for fqn, shape, dtype in other["params"]}
    for fqn in mine.keys() - theirs.keys():
        return f"rank {rank} lacks parameter {fqn!r} {mine[fqn][0]} of rank 0"
    for fqn in theirs.keys() - mine.keys():
        return f"rank {rank} has parameter {fqn!r} {theirs[fqn][0]} that rank 0 lacks"
    for fqn, (shape, dtype) in mine.items():
        if theirs[fqn] != (shape, dtype):
            return (
                f"parameter {fqn!r} is {shape} {dtype} on rank 0 but {theirs[fqn][0]} "
                f"{theirs[fqn][1]} on rank {rank}"
            )
    if first["nested"] != other["nested"]:
        return f"nested units {first['nested']} on rank 0 but {other['nested']} on rank {rank}"
    return None


# ---- sharding ---------------------------------------------------------------------------------


def _describe(param: nn.Parameter, slots: list[Slot], settings: UnitSettings) -> ShardedParam:
    return ShardedParam(
        slots,
        param.shape,
        param.dtype,
        requires_grad=param.requires_grad,
        mesh_info=settings.mesh_info,
        storage_device=settings.storage_device,
        param_dtype=settings.precision.param_dtype,
        dtensor=settings.dtensor,
    )


def _shard_params(found: _Found, group: ParamGroup, settings: UnitSettings, label: str) -> None:
    """Replace each parameter by its shard, one at a time, so that the full parameter can be
    freed before the next one is sharded."""
    mesh_info = settings.mesh_info
    for sharded in group.params:
        param, _ = found.params.pop(0)
        full = param.detach()
        if not full.is_meta:
            full = full.to(mesh_info.device)
            if settings.sync_module_states:
                full = _broadcast_from_first(full, mesh_info.world_group)
        group.load(sharded, full)
        mark_replaced(param, f"'{sharded.fqn}' {list(sharded.shape)} of unit {label!r}")
        del param, full


def _prepare_buffers(
    buffers: list[tuple[str, nn.Module, str]], settings: UnitSettings
) -> list[BufferInfo]:
    out = []
    for fqn, module, attr in buffers:
        buffer = module._buffers[attr]
        assert buffer is not None
        info = BufferInfo(fqn, module, attr, buffer.dtype)
        if not buffer.is_meta:
            module._buffers[attr] = _prepare_buffer(buffer, settings)
        out.append(info)
    return out


def _prepare_buffer(buffer: torch.Tensor, settings: UnitSettings) -> torch.Tensor:
    """Move a buffer to the compute device, take rank 0's values if asked, cast it."""
    buffer = buffer.to(settings.mesh_info.device)
    if settings.sync_module_states:
        buffer = _broadcast_from_first(buffer, settings.mesh_info.world_group)
    dtype = settings.precision.buffer_dtype
    if dtype is not None and buffer.is_floating_point():
        buffer = buffer.to(dtype)
    return buffer


def _broadcast_from_first(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    if dist.get_world_size(group) == 1:
        return tensor
    out = tensor.contiguous()
    comm.broadcast(out, src=dist.get_global_rank(group, 0), group=group, inplace=True)
    return out


def _log_unit(state: FSDPState, settings: UnitSettings) -> None:
    params = state.group.params
    numel = sum(p.shape.numel() for p in params)
    local = sum(torch.Size(p.local_shape).numel() for p in params)
    size = params[0].dtype.itemsize if params else 4
    mesh_info = settings.mesh_info
    logger.info(
        "unit %r: %d parameter(s), %.2f M elements (%.1f MB); %s over %d rank(s) x %d "
        "replica(s): %.1f MB of parameters per rank; %d nested unit(s)",
        state.name,
        len(params),
        numel / 1e6,
        numel * size / 1e6,
        settings.layout,
        mesh_info.shard_size,
        mesh_info.replicate_size,
        local * size / 1e6,
        len(state.context.units) - 1,
    )
