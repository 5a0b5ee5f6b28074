"""``summon_full_params``: the unsharded parameters in the modules for a block of user code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from shardkit.fsdp._param import ShardedParam, set_param
from shardkit.fsdp._state import FSDPState, TrainingState, get_state

__all__ = ["summon_full_params", "units_under"]


def units_under(module: nn.Module, *, recurse: bool = True) -> list[FSDPState]:
    """The units whose hooks sit on ``module`` or (with ``recurse``) on its descendants."""
    modules = module.modules() if recurse else [module]
    return [state for m in modules if (state := get_state(m)) is not None]


@contextlib.contextmanager
def summon_full_params(
    module: nn.Module,
    *,
    recurse: bool = True,
    writeback: bool = True,
    rank0_only: bool = False,
    offload_to_cpu: bool = False,
    with_grads: bool = False,
) -> Iterator[None]:
    """Inside the block, every module attribute holds the full parameter (in its own dtype).

    Args:
        module: a fully sharded module (or one containing fully sharded units).
        recurse: also the units nested in ``module``'s unit.
        writeback: copy changes made in the block back into the shards.
        rank0_only: only rank 0 sees full parameters (the others keep shards); needs
            ``writeback=False``.
        offload_to_cpu: the full parameters are CPU copies.
        with_grads: also gather the shards' gradients into ``.grad``.

    Example::

        with FSDP.summon_full_params(model):
            shape = model.fc1.weight.shape  # torch.Size([128, 9216]) on every rank
    """
    units = units_under(module, recurse=recurse)
    if not units:
        raise ValueError(
            f"{type(module).__name__} contains no fully sharded units; summon_full_params "
            "applies to a module wrapped with fully_shard or FullyShardedDataParallel"
        )
    if rank0_only and writeback:
        raise ValueError(
            "summon_full_params(rank0_only=True, writeback=True) would let the other ranks' "
            "shards go stale; pass writeback=False with rank0_only=True"
        )
    for unit in units:
        ctx = unit.context
        if ctx.state is not TrainingState.IDLE:
            raise ValueError(
                f"summon_full_params called on unit {unit.name!r} during forward or backward; "
                "call it between iterations"
            )
    units[0].context.finish_pending_reduce()
    show = not rank0_only or dist.get_rank() == 0
    gathered = _gather(units, show=show, offload=offload_to_cpu, with_grads=with_grads)
    try:
        yield
    finally:
        for param, full in gathered:
            if writeback:
                with torch.no_grad():
                    rows = param.local_rows(full.detach())
                    param.local.copy_(rows.to(param.local.device))
            for slot in param.slots:
                set_param(slot.module, slot.attr, param.sharded)


def _gather(
    units: list[FSDPState], *, show: bool, offload: bool, with_grads: bool
) -> list[tuple[ShardedParam, nn.Parameter]]:
    out = []
    for unit in units:
        unit.group.reshard()
        for param in unit.group.params:
            if param.aliased:
                continue
            value = param.full_value().clone()
            full = nn.Parameter(value.cpu() if offload else value, param.sharded.requires_grad)
            grad = param.sharded.grad
            if with_grads and grad is not None:
                full_grad = param.full_value(grad)
                full.grad = full_grad.cpu() if offload else full_grad
            if show:
                for slot in param.slots:
                    set_param(slot.module, slot.attr, full)
                out.append((param, full))
    return out
