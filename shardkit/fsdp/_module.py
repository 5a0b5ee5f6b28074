"""What both faces' modules share: argument checks, and ``_apply`` (``module.to_empty``,
``module.to``) that keeps each shard in its unit's storage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.fsdp._state import FSDPState, get_state

__all__ = ["apply_keeping_shards", "check_type", "require_process_group", "unit_of"]


def require_process_group(what: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"{what} needs an initialized process group: start ranks with "
            "shardkit.launch.spawn(fn, world_size=N), call shardkit.launch.init_from_env() under "
            "torchrun, or torch.distributed.init_process_group()"
        )


def check_type(name: str, value: Any, expected: type, example: str) -> None:
    if not isinstance(value, expected):
        raise TypeError(
            f"{name} must be a shardkit.fsdp.{expected.__name__}, got {value!r}; use e.g. {example}"
        )


def unit_of(module: nn.Module) -> FSDPState:
    state = get_state(module)
    assert state is not None, f"{type(module).__name__} has no fully sharded unit"
    return state


def apply_keeping_shards(
    module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], apply: Callable[[], Any]
) -> Any:
    """Run ``apply()`` (``nn.Module._apply(fn)``) on a unit's module, then put the values it
    gave the shards back into the unit's storage, keeping the Parameter objects (an optimizer
    may hold them). ``to_empty(device=...)`` from the meta device and moves to where the shards
    already live work; moving shards to another device or dtype is refused before anything
    changes."""
    unit = unit_of(module)
    unit.context.finish_pending_reduce()
    unit.group.reshard()
    _check_target(unit, fn)
    result = apply()
    unit.group.adopt_applied()
    return result


def _check_target(unit: FSDPState, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    for param in unit.group.params:
        local = param.local
        try:
            probe = fn(torch.empty(0, dtype=local.dtype, device=local.device))
        except Exception:  # not a per-tensor conversion we can foresee: let _apply decide
            return
        if probe.dtype != local.dtype or not (
            probe.device == param.storage_device or probe.is_meta
        ):
            raise ValueError(
                f"unit {unit.name!r} holds parameter {param.fqn!r} as a {local.dtype} shard on "
                f"{param.storage_device}; moving it to {probe.dtype} on {probe.device} is not "
                "supported: build the model on its device and dtype before sharding it (or on "
                "the meta device, then to_empty(device=...) on that device), and use "
                "MixedPrecisionPolicy / MixedPrecision for lower-precision compute"
            )
