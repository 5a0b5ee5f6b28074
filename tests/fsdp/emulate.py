"""The single-process spec of data-parallel training with mixed precision, step for step.

Each "rank" runs forward and backward on its chunk of the global batch with a copy of the model
whose parameters are cast to ``param_dtype`` (what FSDP gathers), its gradients are cast to
float32 (the reduce dtype) and summed over micro-batches, and the ranks' sums are averaged (the
reduction): then clipping and the optimizer step run on the float32 model. Without a
``param_dtype`` this is the unsharded model trained on the global batch.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator

import torch
from torch import nn

from tests.fsdp.models import loss_fn


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks run one thread each: same kernels, same rounding
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def rank_grads(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    param_dtype: torch.dtype | None,
    scale: float = 1.0,
) -> tuple[list[torch.Tensor | None], float]:
    """One rank's float32 gradients (and loss) of ``scale * loss`` with parameters (and inputs)
    in ``param_dtype``."""
    low = copy.deepcopy(model)
    if param_dtype is not None:
        for param in low.parameters():
            param.data = param.data.to(param_dtype)
        x = x.to(param_dtype)
    loss = loss_fn(low, x, y) * scale
    loss.backward()
    grads = [None if p.grad is None else p.grad.float() for p in low.parameters()]
    return grads, float(loss.detach())


def averaged_grads(
    model: nn.Module,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    world_size: int,
    *,
    param_dtype: torch.dtype | None,
) -> float:
    """Set ``model``'s ``.grad`` to the ranks' average of their summed micro-batch gradients
    (each micro-batch's loss divided by their number); returns the mean loss."""
    per_rank, total = [], 0.0
    for rank in range(world_size):
        summed: list[torch.Tensor | None] | None = None
        for x, y in micro_batches:
            chunk = (x.chunk(world_size)[rank], y.chunk(world_size)[rank])
            grads, loss = rank_grads(
                model, *chunk, param_dtype=param_dtype, scale=1 / len(micro_batches)
            )
            total += loss
            summed = grads if summed is None else [_add(a, b) for a, b in zip(summed, grads)]
        per_rank.append(summed)
    for index, param in enumerate(model.parameters()):
        grads = [g[index] for g in per_rank if g[index] is not None]
        param.grad = torch.stack(grads).mean(0) if grads else None
    return total / world_size


def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else a + b


def train_reference(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: list[list[tuple[torch.Tensor, torch.Tensor]]],
    world_size_of: Callable[[int], int],
    *,
    param_dtype: torch.dtype | None,
    max_norm: float,
) -> list[tuple[float, float]]:
    """(loss, gradient norm before clipping) of each step."""
    out = []
    with one_thread():
        for step, micro_batches in enumerate(steps):
            loss = averaged_grads(
                model, micro_batches, world_size_of(step), param_dtype=param_dtype
            )
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            optimizer.zero_grad()
            out.append((loss, float(norm)))
    return out
