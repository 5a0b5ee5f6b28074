"""Gradient clipping by the norm of the whole (unsharded) model's gradient.

Each rank holds disjoint rows of each sharded gradient, so ``sum |g|^p`` over its shards, summed
over the shard group, is the global ``sum |g|^p`` (MAX for the infinity norm). Replicas hold the
same rows, so the replicate group is not summed over; whole gradients (NO_SHARD, parameters not
managed by a unit) are counted once, locally. The same factor then scales every gradient.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.fsdp._param import local_of
from shardkit.fsdp._state import FSDPState, get_state

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(module: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scale all gradients so that their global ``norm_type``-norm is at most ``max_norm``.

    Returns the global norm before clipping (the value ``torch.nn.utils.clip_grad_norm_`` returns
    on the unsharded model). Call it on the outermost unit, on every rank.
    """
    state = get_state(module)
    if state is None or not state.is_root:
        raise ValueError(
            f"clip_grad_norm_ must be called on the outermost fully sharded module, got "
            f"{type(module).__name__}{'' if state is None else f' (unit {state.name!r})'}; call "
            "it on the model you run forward on"
        )
    state.context.finish_pending_reduce()
    p = float(norm_type)
    grouped, whole = _grads(module, state)
    device = _device(state)
    parts = []
    for group, grads in grouped:
        local = _power_sum(grads, p, device=device)
        op = dist.ReduceOp.MAX if math.isinf(p) else dist.ReduceOp.SUM
        reduced = comm.all_reduce(local, op=op, group=group)
        assert isinstance(reduced, torch.Tensor)
        parts.append(reduced)
    parts.append(_power_sum(whole, p, device=device))
    stacked = torch.stack([part.to(torch.float32).reshape(()) for part in parts])
    total = stacked.max() if math.isinf(p) else stacked.sum() ** (1.0 / p)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for _, grads in grouped:
        _scale(grads, scale)
    _scale(whole, scale)
    return total


def _grads(
    module: nn.Module, root: FSDPState
) -> tuple[list[tuple[dist.ProcessGroup, list[torch.Tensor]]], list[torch.Tensor]]:
    """Sharded gradients by shard group (groups in a fixed order), and whole gradients."""
    grouped: dict[int, tuple[dist.ProcessGroup, list[torch.Tensor]]] = {}
    managed: set[int] = set()
    whole: list[torch.Tensor] = []
    for unit in root.context.units:
        for param in unit.group.params:
            managed.add(id(param.sharded))
            grad = None if param.sharded.grad is None else local_of(param.sharded.grad)
            group = param.mesh_info.shard_group
            if param.whole or group is None:
                if grad is not None:
                    whole.append(grad)
                continue
            entry = grouped.setdefault(id(group), (group, []))
            if grad is not None:
                entry[1].append(grad)
    for other in module.parameters():
        if id(other) not in managed and other.grad is not None:
            whole.append(local_of(other.grad))
    return list(grouped.values()), whole


def _device(root: FSDPState) -> torch.device:
    for unit in root.context.units:
        for param in unit.group.params:
            return param.mesh_info.device
    return torch.device("cpu")


def _power_sum(grads: list[torch.Tensor], p: float, *, device: torch.device) -> torch.Tensor:
    """``sum |g|^p`` (``max |g|`` for p = inf) in float32 on ``device``."""
    grads = [g for g in grads if g.numel()]
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    norms = torch.stack(
        [torch.linalg.vector_norm(g.to(device), p, dtype=torch.float32) for g in grads]
    )
    return norms.max() if math.isinf(p) else (norms**p).sum()


def _scale(grads: list[torch.Tensor], scale: torch.Tensor) -> None:
    for grad in grads:
        grad.mul_(scale.to(grad.device, grad.dtype))
