"""Which optimizer runs fused into backward, and with what hyperparameters.

Two ways to ask, as in TorchRec: a ``fused_params`` dict (``{"optimizer":
EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05, "eps": 1e-8}``), or
``apply_optimizer_in_backward(torch.optim.Adagrad, params, {"lr": 0.05})``. Both end up as one
`FusedOptimizerConfig`. Unknown keys are errors, never ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from shardkit.types import ParsableEnum

__all__ = ["EmbOptimType", "FusedOptimizerConfig", "RowWiseAdagrad"]


@enum.unique
class EmbOptimType(ParsableEnum):
    """Optimizers that run inside the embedding kernel's backward (FBGEMM's names); `parse`
    also takes torch's and TorchRec's spellings (``"sgd"``, ``"rowwise_adagrad"``...)."""

    EXACT_SGD = "exact_sgd"
    EXACT_ADAGRAD = "exact_adagrad"
    EXACT_ROWWISE_ADAGRAD = "exact_row_wise_adagrad"
    ADAM = "adam"

    @classmethod
    def _aliases(cls) -> Mapping[str, EmbOptimType]:
        return _ALIASES

    @classmethod
    def _unknown(cls, value: Any) -> str:
        names = sorted({*(m.value for m in cls), *_ALIASES})
        return f"unknown fused optimizer {value!r}; choose one of {names}"


_ALIASES = {
    "sgd": EmbOptimType.EXACT_SGD,
    "exact_sgd": EmbOptimType.EXACT_SGD,
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
    "exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "row_wise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "exact_row_wise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "adam": EmbOptimType.ADAM,
    "sparse_adam": EmbOptimType.ADAM,
}


class RowWiseAdagrad(torch.optim.Optimizer):
    """Adagrad with one accumulator per row: ``state[r] += mean(g[r]**2)``,
    ``w[r] -= lr * g[r] / (sqrt(state[r]) + eps)``.

    The usual choice for embedding tables (memory: one float per row instead of one per weight).
    Usable as a plain optimizer on 2-D parameters, and as the class given to
    `apply_optimizer_in_backward` to fuse it into the embedding kernel.
    """

    def __init__(
        self, params: Any, lr: float = 0.01, eps: float = 1e-8, weight_decay: float = 0.0
    ) -> None:
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if group["weight_decay"]:
                    grad = grad.add(param, alpha=group["weight_decay"])
                state = self.state[param]
                if "momentum1" not in state:
                    state["momentum1"] = torch.zeros(param.shape[0], device=param.device)
                acc = state["momentum1"]
                acc.add_(grad.pow(2).reshape(param.shape[0], -1).mean(1))
                scale = acc.sqrt().add_(group["eps"]).reciprocal_().mul_(-group["lr"])
                param.add_(grad * scale.view(-1, *([1] * (param.dim() - 1))))
        return loss


@dataclass(frozen=True)
class FusedOptimizerConfig:
    """One fused optimizer and its hyperparameters.

    Args:
        optimizer: which update rule.
        learning_rate: step size.
        eps: added to the square root of the accumulator (Adagrad, row-wise Adagrad, Adam).
        weight_decay: L2 penalty added to the gradient of the rows a batch touches.
        beta1: Adam's first-moment decay.
        beta2: Adam's second-moment decay.
        initial_accumulator_value: starting value of (row-wise) Adagrad's accumulator.
    """

    optimizer: EmbOptimType = EmbOptimType.EXACT_ROWWISE_ADAGRAD
    learning_rate: float = 0.01
    eps: float = 1e-8
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    initial_accumulator_value: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "optimizer", EmbOptimType.parse(self.optimizer))
        if self.learning_rate < 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")

    @classmethod
    def from_fused_params(cls, fused_params: Mapping[str, Any]) -> FusedOptimizerConfig:
        """From TorchRec's ``fused_params`` dict; an unknown key is an error naming the known."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(fused_params) - known)
        if unknown:
            raise ValueError(
                f"unknown fused_params key(s) {unknown}; the fused optimizer understands "
                f"{sorted(known)}"
            )
        if "optimizer" not in fused_params:
            raise ValueError(
                "fused_params needs 'optimizer' (e.g. EmbOptimType.EXACT_ROWWISE_ADAGRAD)"
            )
        return cls(**fused_params)

    @classmethod
    def from_optimizer_class(
        cls, optimizer_class: type, optimizer_kwargs: Mapping[str, Any]
    ) -> FusedOptimizerConfig:
        """From ``apply_optimizer_in_backward``'s (class, kwargs), e.g. (torch.optim.Adam, {"lr": 1e-3})."""
        if optimizer_class not in _BY_CLASS:
            names = sorted(c.__module__ + "." + c.__qualname__ for c in _BY_CLASS)
            raise ValueError(
                f"{optimizer_class.__qualname__} cannot run fused in the embedding kernel; "
                f"use one of {names}"
            )
        kind, translate = _BY_CLASS[optimizer_class]
        unknown = sorted(set(optimizer_kwargs) - set(translate))
        if unknown:
            raise ValueError(
                f"{optimizer_class.__qualname__} kwargs {unknown} are not supported fused; "
                f"supported: {sorted(translate)}"
            )
        values: dict[str, Any] = {"optimizer": kind}
        for key, value in optimizer_kwargs.items():
            values.update(translate[key](value))
        return cls(**values)

    def hyperparameters(self) -> dict[str, Any]:
        """The values an LR scheduler or user may change, as an optimizer param group holds them."""
        return {
            "lr": self.learning_rate,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "betas": (self.beta1, self.beta2),
            "initial_accumulator_value": self.initial_accumulator_value,
            "optimizer": self.optimizer.value,
        }


def _same(name: str):
    return lambda value: {name: value}


def _betas(value: tuple[float, float]) -> dict[str, float]:
    beta1, beta2 = value
    return {"beta1": beta1, "beta2": beta2}


def _no_momentum(value: float) -> dict[str, Any]:
    if value:
        raise ValueError(f"SGD momentum ({value}) is not supported fused; use momentum=0 or Adam")
    return {}


def _no_lr_decay(value: float) -> dict[str, Any]:
    if value:
        raise ValueError(f"Adagrad lr_decay ({value}) is not supported fused; use lr_decay=0")
    return {}


_LR = {"lr": _same("learning_rate"), "weight_decay": _same("weight_decay")}
_BY_CLASS: dict[type, tuple[EmbOptimType, dict[str, Any]]] = {
    torch.optim.SGD: (EmbOptimType.EXACT_SGD, {**_LR, "momentum": _no_momentum}),
    torch.optim.Adagrad: (
        EmbOptimType.EXACT_ADAGRAD,
        {
            **_LR,
            "eps": _same("eps"),
            "lr_decay": _no_lr_decay,
            "initial_accumulator_value": _same("initial_accumulator_value"),
        },
    ),
    RowWiseAdagrad: (EmbOptimType.EXACT_ROWWISE_ADAGRAD, {**_LR, "eps": _same("eps")}),
    torch.optim.Adam: (EmbOptimType.ADAM, {**_LR, "eps": _same("eps"), "betas": _betas}),
    torch.optim.SparseAdam: (
        EmbOptimType.ADAM,
        {"lr": _same("learning_rate"), "eps": _same("eps"), "betas": _betas},
    ),
}
