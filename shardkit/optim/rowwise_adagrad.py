"""Row-wise Adagrad: one accumulator per row (TorchRec's ``torchrec.optim.rowwise_adagrad``).

    sum[r] += mean_j(g[r, j]^2)        w[r] -= lr_t * g[r] / (sqrt(sum[r]) + eps)
    lr_t = lr / (1 + (t - 1) * lr_decay)

The usual choice for embedding tables: one float of state per row instead of one per weight. As a
plain optimizer it updates every row (a row whose gradient is zero keeps its weight and its
accumulator); given to `apply_optimizer_in_backward` it runs fused in the embedding kernel and
touches only the rows a batch used.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["RowWiseAdagrad", "adagrad"]

logger = logging.getLogger(__name__)


class RowWiseAdagrad(torch.optim.Optimizer):
    """Adagrad with one accumulator per row of each (2-D) parameter.

    Args:
        params: parameters or param-group dicts.
        lr: learning rate.
        lr_decay: the rate at step t is ``lr / (1 + (t - 1) * lr_decay)``.
        weight_decay: L2 penalty added to the gradient.
        initial_accumulator_value: starting value of each row's accumulator.
        eps: added to the accumulator's square root.
        maximize: ascend instead of descend.

    State per parameter: ``step`` (a 0-d tensor) and ``sum`` ``[rows, 1]``, created here (not at
    the first step) so that a checkpoint can be loaded before training.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise TypeError(
                f"RowWiseAdagrad got unknown argument(s) {sorted(unknown)}; it takes lr, lr_decay, "
                "weight_decay, initial_accumulator_value, eps, maximize (FBGEMM-only arguments "
                "have no effect in shardkit: drop them)"
            )
        for name, value in (("lr", lr), ("lr_decay", lr_decay), ("weight_decay", weight_decay),
                            ("initial_accumulator_value", initial_accumulator_value),
                            ("eps", eps)):  # fmt: skip
            if value < 0:
                raise ValueError(f"RowWiseAdagrad: {name} must be >= 0, got {value}")
        defaults = {
            "lr": lr,
            "lr_decay": lr_decay,
            "eps": eps,
            "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value,
            "maximize": maximize,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for param in group["params"]:
                rows = param.shape[0] if param.dim() else 1
                self.state[param]["step"] = torch.tensor(0.0)
                self.state[param]["sum"] = torch.full(
                    (rows, 1), float(group["initial_accumulator_value"]),
                    dtype=param.dtype, device=param.device,
                )  # fmt: skip

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            with_grad = [p for p in group["params"] if p.grad is not None]
            adagrad(
                with_grad,
                [p.grad for p in with_grad],
                [self.state[p]["sum"] for p in with_grad],
                [self.state[p]["step"] for p in with_grad],
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                lr_decay=group["lr_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
            )
        return loss


def adagrad(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    state_sums: list[torch.Tensor],
    state_steps: list[torch.Tensor],
    *,
    lr: float,
    weight_decay: float,
    lr_decay: float,
    eps: float,
    maximize: bool,
) -> None:
    """One row-wise Adagrad step on each parameter, in place (the functional form).

    Args:
        params: the parameters ``[rows, ...]``.
        grads: their dense gradients, same shapes.
        state_sums: their accumulators ``[rows, 1]``.
        state_steps: their step counters (0-d tensors), incremented here.
        lr, weight_decay, lr_decay, eps, maximize: as `RowWiseAdagrad`.
    """
    if not all(isinstance(t, torch.Tensor) for t in state_steps):
        raise TypeError("adagrad: state_steps must be 0-d tensors (one per parameter)")
    for param, grad, state_sum, step in zip(params, grads, state_sums, state_steps):
        if grad.is_sparse:
            raise RuntimeError(
                "RowWiseAdagrad takes dense gradients; for sparse updates of embedding tables "
                "give it to apply_optimizer_in_backward (fused into the embedding kernel)"
            )
        step += 1
        grad = -grad if maximize else grad
        if weight_decay:
            grad = grad.add(param, alpha=weight_decay)
        rows = param.shape[0] if param.dim() else 1
        state_sum += grad.reshape(rows, -1).pow(2).mean(dim=1, keepdim=True)
        shape = (rows,) + (1,) * (param.dim() - 1) if param.dim() else ()
        std = state_sum.sqrt().add_(eps).reshape(shape)  # broadcast over each row
        clr = lr / (1 + (step.item() - 1) * lr_decay)
        param.addcdiv_(grad, std, value=-clr)
