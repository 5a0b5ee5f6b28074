"""The fused update rules: each updates only the rows a batch touched.

[Note: fused row updates]
The embedding kernel hands each rule a chunk of unique rows ``rows`` ``[U]`` and their summed
gradients ``grads`` ``[U, D]`` (duplicates inside and across bags already added together), so
no dense gradient of a table is ever made. Rules read the rows' state, update it, and add the
step to the weights with one ``index_add_`` (which reads and writes each row once). ``grads`` is
scratch: rules may overwrite it. Rows not in the batch are untouched: the semantics of torch's
sparse optimizers (SGD/Adagrad with sparse gradients, SparseAdam) and of FBGEMM's fused ones.
Weight decay, when asked for, is L2 on the touched rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from shardkit.optim._config import EmbOptimType
from shardkit.optim._layerwise import LAYERWISE_RULES

__all__ = ["STATE_SHAPES", "apply_rule", "new_state"]

State = dict[str, torch.Tensor]


def new_state(
    kind: EmbOptimType,
    rows: int,
    dim: int,
    device: torch.device,
    initial: float = 0.0,
    *,
    prepare: Callable[[torch.Tensor], object] | None = None,
) -> State:
    """Zero (or ``initial``) optimizer state for a ``[rows, dim]`` table; ``prepare`` (if given)
    sees each buffer after its allocation and before its first write (e.g. to advise its pages:
    `shardkit.kernels.advise_new_table`)."""
    state = {}
    for name, shape in STATE_SHAPES[kind](rows, dim).items():
        state[name] = torch.empty(shape, device=device)
        if prepare is not None:
            prepare(state[name])
    reset_state(kind, state, initial)
    return state


def reset_state(kind: EmbOptimType, state: State, initial: float = 0.0) -> None:
    """Write the state's starting values in place: zeros, and ``initial`` in Adagrad's
    accumulator (also after ``to_empty``, whose memory holds whatever was there)."""
    for name, buffer in state.items():
        starts_at = initial if kind in _ADAGRADS and name == "momentum1" else 0.0
        buffer.fill_(starts_at)


def apply_rule(
    kind: EmbOptimType,
    weight: torch.Tensor,
    state: State,
    rows: torch.Tensor,
    grads: torch.Tensor,
    hyper: Mapping[str, Any],
    step: int,
) -> None:
    """Update ``weight[rows]`` (and ``state``) in place. See [Note: fused row updates]."""
    grads = grads.float()
    if (
        kind.value in LAYERWISE_RULES
    ):  # weight decay is in the rule: [Note: layer-wise rules per row]
        rule = LAYERWISE_RULES[kind.value][0]
        delta = rule(state, rows, grads, weight.index_select(0, rows).float(), hyper, step)
        weight.index_add_(0, rows, delta.to(weight.dtype))
        return
    if hyper["weight_decay"]:
        grads.add_(weight.index_select(0, rows).float(), alpha=hyper["weight_decay"])
    delta = _RULES[kind](state, rows, grads, hyper, step)
    weight.index_add_(0, rows, delta.to(weight.dtype))


def _sgd(state: State, rows: torch.Tensor, grads: torch.Tensor, hyper: Any, step: int):
    return grads.mul_(-hyper["lr"])


def _adagrad(state: State, rows: torch.Tensor, grads: torch.Tensor, hyper: Any, step: int):
    acc = state["momentum1"].index_select(0, rows).addcmul_(grads, grads)
    state["momentum1"].index_copy_(0, rows, acc)
    return grads.div_(acc.sqrt_().add_(hyper["eps"])).mul_(-hyper["lr"])


def _rowwise_adagrad(state: State, rows: torch.Tensor, grads: torch.Tensor, hyper: Any, step: int):
    # Few ops per chunk: at a few MiB per chunk, dispatch costs as much as arithmetic.
    norm = torch.linalg.vector_norm(grads, dim=1)
    acc = state["momentum1"].index_select(0, rows).addcmul_(norm, norm, value=1 / grads.shape[1])
    state["momentum1"].index_copy_(0, rows, acc)
    return grads.mul_((-hyper["lr"] / acc.sqrt_().add_(hyper["eps"])).unsqueeze(1))


def _adam(state: State, rows: torch.Tensor, grads: torch.Tensor, hyper: Any, step: int):
    beta1, beta2 = hyper["betas"]
    avg = state["exp_avg"].index_select(0, rows).mul_(beta1).add_(grads, alpha=1 - beta1)
    avg_sq = state["exp_avg_sq"].index_select(0, rows).mul_(beta2)
    avg_sq.addcmul_(grads, grads, value=1 - beta2)
    state["exp_avg"].index_copy_(0, rows, avg)
    state["exp_avg_sq"].index_copy_(0, rows, avg_sq)
    # SparseAdam's arithmetic: bias corrections folded into the step size.
    step_size = hyper["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    return avg.div_(avg_sq.sqrt_().add_(hyper["eps"])).mul_(-step_size)


_RULES: dict[EmbOptimType, Callable[..., torch.Tensor]] = {
    EmbOptimType.EXACT_SGD: _sgd,
    EmbOptimType.EXACT_ADAGRAD: _adagrad,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: _rowwise_adagrad,
    EmbOptimType.ADAM: _adam,
}

STATE_SHAPES: dict[EmbOptimType, Callable[[int, int], dict[str, tuple[int, ...]]]] = {
    EmbOptimType.EXACT_SGD: lambda rows, dim: {},
    EmbOptimType.EXACT_ADAGRAD: lambda rows, dim: {"momentum1": (rows, dim)},
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: lambda rows, dim: {"momentum1": (rows,)},
    EmbOptimType.ADAM: lambda rows, dim: {"exp_avg": (rows, dim), "exp_avg_sq": (rows, dim)},
    **{EmbOptimType(name): shapes for name, (_, shapes) in LAYERWISE_RULES.items()},
}
_ADAGRADS = (EmbOptimType.EXACT_ADAGRAD, EmbOptimType.EXACT_ROWWISE_ADAGRAD)
