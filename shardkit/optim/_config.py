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

from shardkit.optim._layerwise import LAMB, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB
from shardkit.optim.rowwise_adagrad import RowWiseAdagrad
from shardkit.types import ParsableEnum

__all__ = ["EmbOptimType", "FusedOptimizerConfig", "RowWiseAdagrad"]


_FBGEMM_ONLY_RULES = (
    "SHAMPOO", "SHAMPOO_V2",
    "MADGRAD", "EXACT_ROWWISE_WEIGHTED_ADAGRAD", "ENSEMBLE_ROWWISE_ADAGRAD",
    "EMAINPLACE_ROWWISE_ADAGRAD", "NONE",
)  # fmt: skip
# FBGEMM's non-exact variants (updates that may race, for speed): shardkit's exact rule.
_INEXACT = {"SGD": "EXACT_SGD", "ROWWISE_ADAGRAD": "EXACT_ROWWISE_ADAGRAD"}


class _EmbOptimTypeMeta(enum.EnumMeta):
    """FBGEMM's other member names: the exact twin, or an error that says what to use."""

    def __getattr__(cls, name: str):
        if name in _INEXACT:
            return cls[_INEXACT[name]]
        if name in _FBGEMM_ONLY_RULES:
            raise AttributeError(
                f"EmbOptimType.{name}: an FBGEMM-only fused optimizer (shardkit's embedding "
                "kernel has no such rule); use EXACT_ROWWISE_ADAGRAD, EXACT_ADAGRAD, ADAM, "
                "EXACT_SGD, LAMB, LARS_SGD, PARTIAL_ROWWISE_ADAM or PARTIAL_ROWWISE_LAMB"
            )
        return super().__getattr__(name)  # type: ignore[misc]


@enum.unique
class EmbOptimType(ParsableEnum, metaclass=_EmbOptimTypeMeta):
    """Optimizers that run inside the embedding kernel's backward (FBGEMM's names); `parse`
    also takes torch's and TorchRec's spellings (``"sgd"``, ``"rowwise_adagrad"``...).

    FBGEMM's ``SGD`` and ``ROWWISE_ADAGRAD`` (its non-exact, racy variants) give the exact
    members; its other rules (SHAMPOO, MADGRAD, ...) are refused by name. LAMB, LARS_SGD and the
    partial row-wise rules follow FBGEMM's arithmetic (see [Note: layer-wise rules per row]).
    """

    EXACT_SGD = "exact_sgd"
    EXACT_ADAGRAD = "exact_adagrad"
    EXACT_ROWWISE_ADAGRAD = "exact_row_wise_adagrad"
    ADAM = "adam"
    LAMB = "lamb"
    LARS_SGD = "lars_sgd"
    PARTIAL_ROWWISE_ADAM = "partial_row_wise_adam"
    PARTIAL_ROWWISE_LAMB = "partial_row_wise_lamb"

    @property
    def scales_by_row_norms(self) -> bool:
        """Whether the rule scales a row's step by norms over the whole row (LAMB, LARS_SGD,
        PARTIAL_ROWWISE_LAMB: [Note: layer-wise rules per row]), so that a shard holding part
        of each row's columns would step differently from the unsharded table."""
        return self in _ROW_NORM_RULES

    @classmethod
    def _aliases(cls) -> Mapping[str, EmbOptimType]:
        return _ALIASES

    @classmethod
    def _unknown(cls, value: Any) -> str:
        names = sorted({*(m.value for m in cls), *_ALIASES})
        return f"unknown fused optimizer {value!r}; choose one of {names}"


_ROW_NORM_RULES = frozenset(
    {EmbOptimType.LAMB, EmbOptimType.LARS_SGD, EmbOptimType.PARTIAL_ROWWISE_LAMB}
)

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
    "lamb": EmbOptimType.LAMB,
    "lars_sgd": EmbOptimType.LARS_SGD,
    "partial_row_wise_adam": EmbOptimType.PARTIAL_ROWWISE_ADAM,
    "partial_rowwise_adam": EmbOptimType.PARTIAL_ROWWISE_ADAM,
    "partial_row_wise_lamb": EmbOptimType.PARTIAL_ROWWISE_LAMB,
    "partial_rowwise_lamb": EmbOptimType.PARTIAL_ROWWISE_LAMB,
}


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
        momentum: LARS_SGD's momentum (FBGEMM's default 0.9; only LARS_SGD takes it).
        eta: LARS_SGD's trust coefficient (FBGEMM's default 0.001; only LARS_SGD takes it).
    """

    optimizer: EmbOptimType = EmbOptimType.EXACT_ROWWISE_ADAGRAD
    learning_rate: float = 0.01
    eps: float = 1e-8
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    initial_accumulator_value: float = 0.0
    momentum: float = 0.9
    eta: float = 0.001

    def __post_init__(self) -> None:
        object.__setattr__(self, "optimizer", EmbOptimType.parse(self.optimizer))
        if self.learning_rate < 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.optimizer != EmbOptimType.LARS_SGD and (self.momentum, self.eta) != (0.9, 0.001):
            raise ValueError(
                f"momentum ({self.momentum}) and eta ({self.eta}) are LARS_SGD's; "
                f"{self.optimizer.name} does not use them: drop them or use LARS_SGD"
            )
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")

    @classmethod
    def from_fused_params(cls, fused_params: Mapping[str, Any]) -> FusedOptimizerConfig:
        """From TorchRec's ``fused_params`` dict; an unknown key is an error naming the known."""
        known = {f.name for f in fields(cls)}
        refused = set(FBGEMM_ONLY_FUSED_PARAMS) - _lars_keys(fused_params)
        fbgemm_only = sorted(set(fused_params) & refused)
        if fbgemm_only:
            key = fbgemm_only[0]
            raise ValueError(
                f"fused_params key {key!r} ({fused_params[key]!r}): {FBGEMM_ONLY_FUSED_PARAMS[key]}"
            )
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
        """From ``apply_optimizer_in_backward``'s (class, kwargs), e.g. (torch.optim.Adam, {"lr": 1e-3}).

        A class may say which one it fuses as with a ``_shardkit_fused_as`` attribute (TorchRec's
        ``torchrec.optim.optimizers.Adam`` fuses as ``torch.optim.Adam``).
        """
        optimizer_class = getattr(optimizer_class, "_shardkit_fused_as", optimizer_class)
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
        values = {
            "lr": self.learning_rate,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "betas": (self.beta1, self.beta2),
            "initial_accumulator_value": self.initial_accumulator_value,
            "optimizer": self.optimizer.value,
        }
        if self.optimizer == EmbOptimType.LARS_SGD:
            values.update(momentum=self.momentum, eta=self.eta)
        return values


def _lars_keys(fused_params: Mapping[str, Any]) -> set[str]:
    """LARS_SGD's own keys, known when the fused optimizer is LARS_SGD."""
    optimizer = fused_params.get("optimizer")
    try:
        lars = optimizer is not None and EmbOptimType.parse(optimizer) == EmbOptimType.LARS_SGD
    except ValueError:
        lars = False
    return {"momentum", "eta"} if lars else set()


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


def _no_maximize(value: bool) -> dict[str, Any]:
    if value:
        raise ValueError("maximize=True is not supported fused; negate the loss instead")
    return {}


_LR = {"lr": _same("learning_rate"), "weight_decay": _same("weight_decay")}
# TorchRec passes the kwargs of its LAMB-like classes to FBGEMM by FBGEMM's names.
_FBGEMM_ADAM_LIKE = {**_LR, "eps": _same("eps"), "beta1": _same("beta1"), "beta2": _same("beta2")}
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
    RowWiseAdagrad: (
        EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        {
            **_LR,
            "eps": _same("eps"),
            "lr_decay": _no_lr_decay,
            "initial_accumulator_value": _same("initial_accumulator_value"),
            "maximize": _no_maximize,
        },
    ),
    torch.optim.Adam: (EmbOptimType.ADAM, {**_LR, "eps": _same("eps"), "betas": _betas}),
    LAMB: (EmbOptimType.LAMB, _FBGEMM_ADAM_LIKE),
    PartialRowWiseLAMB: (EmbOptimType.PARTIAL_ROWWISE_LAMB, _FBGEMM_ADAM_LIKE),
    PartialRowWiseAdam: (EmbOptimType.PARTIAL_ROWWISE_ADAM, _FBGEMM_ADAM_LIKE),
    LarsSGD: (EmbOptimType.LARS_SGD, {**_LR, "momentum": _same("momentum"), "eta": _same("eta")}),
    torch.optim.SparseAdam: (
        EmbOptimType.ADAM,
        {"lr": _same("learning_rate"), "eps": _same("eps"), "betas": _betas},
    ),
}

_NO_CACHE = (
    "UVM caching is not in shardkit: every table lives whole in its rank's memory (device memory "
    "with NCCL, host memory with gloo); drop the key, and shard bigger tables over more ranks"
)
_LARS_LAMB = "used only by FBGEMM's counter-based or decay-mode variants, not in shardkit"
_LARS_ONLY = "used only by FBGEMM's LARS_SGD: set optimizer to LARS_SGD, or drop the key"

# fused_params keys that TorchRec passes on to FBGEMM and shardkit refuses, with what to do.
FBGEMM_ONLY_FUSED_PARAMS: dict[str, str] = {
    "cache_load_factor": _NO_CACHE,
    "cache_algorithm": _NO_CACHE,
    "cache_precision": _NO_CACHE,
    "cache_reserved_memory": _NO_CACHE,
    "cache_sets": _NO_CACHE,
    "prefetch_pipeline": _NO_CACHE,
    "enforce_hbm": _NO_CACHE,
    "stochastic_rounding": "FBGEMM's stochastic rounding of low-precision weights is not in "
    "shardkit (updates are computed in float32 and rounded to nearest); drop the key",
    "weights_precision": "set the table's data_type in its EmbeddingBagConfig instead",
    "output_dtype": "shardkit returns the tables' dtype; cast the output instead",
    "gradient_clipping": "FBGEMM's per-row gradient clipping is not in shardkit; drop the key "
    "(GradientClippingOptimizer clips the dense parameters' gradients)",
    "max_gradient": "FBGEMM's per-row gradient clipping is not in shardkit; drop the key "
    "(GradientClippingOptimizer clips the dense parameters' gradients)",
    "momentum": _LARS_ONLY,
    "eta": _LARS_ONLY,
    "weight_decay_mode": _LARS_LAMB,
    "counter_based_regularization": _LARS_LAMB,
    "cowclip_regularization": _LARS_LAMB,
    "bounds_check_mode": "shardkit checks ids itself (EmbeddingBagCollection(validate_ids=True), "
    "the default); drop the key",
}
