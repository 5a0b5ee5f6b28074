"""FBGEMM's layer-wise (trust-ratio) and partial row-wise rules: LAMB, LARS-SGD, partial row-wise
Adam and partial row-wise LAMB, fused into the embedding kernel and as dense optimizers.

[Note: layer-wise rules per row]
FBGEMM treats each embedding row as a "layer": LAMB and LARS scale a row's step by the ratio of
the row's weight norm to its update's (or gradient's) norm. The rules below take the rows a
batch touched, ``rows`` ``[U]``, their summed gradients ``grads`` ``[U, D]`` and their current
weights ``weights`` ``[U, D]`` (all float32), update the state in place and return the step to
add, with FBGEMM's arithmetic (``codegen/genscript/optimizers.py``):

- weight decay is part of the update (``+ weight_decay * w``), not added to the gradient first;
- bias corrections use the optimizer's step count ``t``: ``m / (1 - beta ** t)``;
- "partial row-wise" keeps the second moment as one number per row (the mean of ``g ** 2``).

Where FBGEMM divides by a norm that is zero (an update of all zeros, or LARS with a zero gradient
and no decay) it would write NaN into the row; here that row does not move. LAMB's ratio is zero
for a row whose weights are all zero, so such a row never moves (as in FBGEMM).

A table-wise or row-wise shard holds whole rows, so sharded tables update as the unsharded one.
A shard with part of each row's columns (column-wise, table-column-wise, grid) would take the
norms of its own columns, as TorchRec's column shards (each its own FBGEMM table) do, and step
unlike the unsharded table: shardkit refuses LAMB, LARS_SGD and PARTIAL_ROWWISE_LAMB fused into
such shards (`EmbOptimType.scales_by_row_norms`), and its planner never proposes the FUSED kernel
for them there (tests/sharding/test_layerwise_fused.py, tests/planner/test_planner.py). A DENSE
table's optimizer is the user's, so its columns may be split; the sharded collection then marks
its dense parameters (``_shardkit_column_split_tables``: every such table of the collection, the
same on every rank) and the dense `LAMB`, `LarsSGD` and `PartialRowWiseLAMB` below refuse them.

The same rules serve the dense optimizers below, which treat dimension 0 of each parameter as its
rows (a 1-D parameter is one row) and update every row, as torch's optimizers do; given a sparse
gradient (``nn.EmbeddingBag(sparse=True)``) they update only its rows, as the fused kernel does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

__all__ = ["LAMB", "LAYERWISE_RULES", "LarsSGD", "PartialRowWiseAdam", "PartialRowWiseLAMB"]

State = dict[str, torch.Tensor]


def _moment(state: State, name: str, rows: torch.Tensor, value: torch.Tensor, beta: float):
    """``state[name][rows] = beta * state[name][rows] + (1 - beta) * value``; the new rows."""
    new = state[name].index_select(0, rows).mul_(beta).add_(value, alpha=1 - beta)
    state[name].index_copy_(0, rows, new)
    return new


def _trust_step(update: torch.Tensor, weights: torch.Tensor, lr: float) -> torch.Tensor:
    """``-lr * (|w| / |update|) * update`` row by row; rows with a zero update stay."""
    weight_norm = torch.linalg.vector_norm(weights, dim=1)
    update_norm = torch.linalg.vector_norm(update, dim=1)
    ratio = torch.where(update_norm > 0, weight_norm / update_norm, torch.zeros_like(weight_norm))
    return update.mul_((-lr * ratio).unsqueeze(1))


def _lamb(state: State, rows, grads, weights, hyper: Mapping[str, Any], step: int):
    beta1, beta2 = hyper["betas"]
    m1 = _moment(state, "momentum1", rows, grads, beta1)
    m2 = _moment(state, "momentum2", rows, grads * grads, beta2)
    denom = m2.div_(1 - beta2**step).sqrt_().add_(hyper["eps"])
    update = m1.div(1 - beta1**step).div_(denom).add_(weights, alpha=hyper["weight_decay"])
    return _trust_step(update, weights, hyper["lr"])


def _partial_rowwise_lamb(state: State, rows, grads, weights, hyper: Mapping[str, Any], step: int):
    beta1, beta2 = hyper["betas"]
    m2 = _moment(state, "momentum2", rows, grads.pow(2).mean(dim=1), beta2)  # [U]
    m1 = _moment(state, "momentum1", rows, grads, beta1)
    inv = m2.div(1 - beta2**step).sqrt_().add_(hyper["eps"]).reciprocal_().unsqueeze(1)
    update = m1.div(1 - beta1**step).mul_(inv).add_(weights, alpha=hyper["weight_decay"])
    return _trust_step(update, weights, hyper["lr"])


def _partial_rowwise_adam(state: State, rows, grads, weights, hyper: Mapping[str, Any], step: int):
    beta1, beta2 = hyper["betas"]
    m2 = _moment(state, "momentum2", rows, grads.pow(2).mean(dim=1), beta2)  # [U]
    m1 = _moment(state, "momentum1", rows, grads, beta1)
    denom = m2.div(1 - beta2**step).sqrt_().add_(hyper["eps"]).unsqueeze(1)
    update = m1.div(1 - beta1**step).div_(denom).add_(weights, alpha=hyper["weight_decay"])
    return update.mul_(-hyper["lr"])


def _lars_sgd(state: State, rows, grads, weights, hyper: Mapping[str, Any], step: int):
    decay = hyper["weight_decay"]
    weight_norm = torch.linalg.vector_norm(weights, dim=1)
    denom = torch.linalg.vector_norm(grads, dim=1).add_(weight_norm, alpha=decay)
    scaled = hyper["lr"] * hyper["eta"] * weight_norm
    adjusted_lr = torch.where(denom > 0, scaled / denom, torch.zeros_like(denom))  # [U]
    velocity = grads.add(weights, alpha=decay).mul_(adjusted_lr.unsqueeze(1))
    m1 = state["momentum1"].index_select(0, rows).mul_(hyper["momentum"]).add_(velocity)
    state["momentum1"].index_copy_(0, rows, m1)
    return m1.neg()


Rule = Callable[..., torch.Tensor]
# name -> (rule, state shapes for a [rows, dim] table)
LAYERWISE_RULES: dict[str, tuple[Rule, Callable[[int, int], dict[str, tuple[int, ...]]]]] = {
    "lamb": (_lamb, lambda rows, dim: {"momentum1": (rows, dim), "momentum2": (rows, dim)}),
    "lars_sgd": (_lars_sgd, lambda rows, dim: {"momentum1": (rows, dim)}),
    "partial_row_wise_adam": (
        _partial_rowwise_adam,
        lambda rows, dim: {"momentum1": (rows, dim), "momentum2": (rows,)},
    ),
    "partial_row_wise_lamb": (
        _partial_rowwise_lamb,
        lambda rows, dim: {"momentum1": (rows, dim), "momentum2": (rows,)},
    ),
}


class _RowRuleOptimizer(torch.optim.Optimizer):
    """A dense optimizer running one of the rules above on every row of each parameter."""

    _RULE = ""
    _KNOWN: tuple[str, ...] = ()
    _ROW_NORMS = False  # the rule scales a row's step by norms over the whole row

    def __init__(self, params: Iterable[Any], **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(self._KNOWN))
        if unknown:
            raise TypeError(
                f"{type(self).__qualname__} got unknown argument(s) {unknown}; it takes "
                f"{list(self._KNOWN)} (FBGEMM's names; lr is its learning_rate)"
            )
        values = {**_DEFAULTS, **kwargs}
        if values["lr"] < 0 or values["eps"] <= 0 or values["weight_decay"] < 0:
            raise ValueError(
                f"{type(self).__qualname__}: lr ({values['lr']}) and weight_decay "
                f"({values['weight_decay']}) must be >= 0 and eps ({values['eps']}) > 0"
            )
        defaults = {
            "lr": values["lr"], "eps": values["eps"], "weight_decay": values["weight_decay"],
            "betas": (values["beta1"], values["beta2"]), "momentum": values["momentum"],
            "eta": values["eta"],
        }  # fmt: skip
        super().__init__(params, defaults)
        self._refuse_column_shards()

    def _refuse_column_shards(self) -> None:
        """See [Note: layer-wise rules per row]: a rule with row norms on column shards."""
        if not self._ROW_NORMS:
            return
        for group in self.param_groups:
            for param in group["params"]:
                split = getattr(param, "_shardkit_column_split_tables", ())
                if split:
                    raise ValueError(
                        f"{type(self).__qualname__} scales each row's step by norms over the "
                        f"whole row, but it was given the dense parameters of a sharded "
                        f"collection whose DENSE tables {list(split)} are split by columns (each "
                        "shard would take the norms of its own columns, unlike the unsharded "
                        "module); plan those tables table_wise, row_wise, table_row_wise or "
                        "data_parallel, or step them with a rule without row norms (e.g. "
                        "PartialRowWiseAdam or torch.optim.Adam)"
                    )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: torch.Tensor, group: Mapping[str, Any]) -> None:
        """One step of ``param`` (rows: dimension 0). A sparse gradient updates only its rows,
        as the fused kernel does (see [Note: fused row updates])."""
        rule, shapes = LAYERWISE_RULES[self._RULE]
        weight = param.view(param.shape[0] if param.dim() else 1, -1)  # [R, D]
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            for name, shape in shapes(*weight.shape).items():
                state[name] = torch.zeros(shape, device=param.device)
        state["step"] += 1
        grad = param.grad
        assert grad is not None  # step() updates only the parameters that have a gradient
        if grad.is_sparse:
            grad = grad.coalesce()
            rows, grads = grad.indices()[0], grad.values().reshape(-1, weight.shape[1]).float()
        else:
            rows = torch.arange(weight.shape[0], device=param.device)
            grads = grad.reshape(weight.shape).float()
        moments = {k: v for k, v in state.items() if k != "step"}
        weights = weight.index_select(0, rows).float()
        step = rule(moments, rows, grads, weights, group, int(state["step"]))
        weight.index_add_(0, rows, step.to(weight.dtype))


_DEFAULTS = {
    "lr": 0.01,
    "eps": 1e-8,
    "weight_decay": 0.0,
    "beta1": 0.9,
    "beta2": 0.999,
    "momentum": 0.9,
    "eta": 0.001,
}  # fmt: skip  (FBGEMM's SplitTableBatchedEmbeddingBagsCodegen defaults)
_ADAM_LIKE = ("lr", "eps", "beta1", "beta2", "weight_decay")


class LAMB(_RowRuleOptimizer):
    """FBGEMM's LAMB (``EmbOptimType.LAMB``); see [Note: layer-wise rules per row].

    Args:
        params: the parameters (or param groups).
        lr, eps, beta1, beta2, weight_decay: FBGEMM's (defaults 0.01, 1e-8, 0.9, 0.999, 0).
    """

    _RULE, _KNOWN, _ROW_NORMS = "lamb", _ADAM_LIKE, True


class PartialRowWiseLAMB(_RowRuleOptimizer):
    """FBGEMM's LAMB with a per-row second moment (``EmbOptimType.PARTIAL_ROWWISE_LAMB``)."""

    _RULE, _KNOWN, _ROW_NORMS = "partial_row_wise_lamb", _ADAM_LIKE, True


class PartialRowWiseAdam(_RowRuleOptimizer):
    """FBGEMM's Adam with a per-row second moment (``EmbOptimType.PARTIAL_ROWWISE_ADAM``)."""

    _RULE, _KNOWN = "partial_row_wise_adam", _ADAM_LIKE


class LarsSGD(_RowRuleOptimizer):
    """FBGEMM's LARS-SGD (``EmbOptimType.LARS_SGD``).

    Args:
        params: the parameters (or param groups).
        lr, eta, momentum, weight_decay: FBGEMM's (defaults 0.01, 0.001, 0.9, 0).
    """

    _RULE, _KNOWN, _ROW_NORMS = "lars_sgd", ("lr", "eta", "momentum", "weight_decay"), True
