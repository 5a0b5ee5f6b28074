"""TorchRec's optimizer classes for the embedding kernel, and the filter that splits a model's
parameters into those updated in backward and the rest (``torchrec.optim.optimizers``).

In TorchRec ``SGD``, ``Adagrad`` and ``Adam`` here are placeholders that only name an FBGEMM
kernel for `apply_optimizer_in_backward`. In shardkit they name the same fused rules and are also
working optimizers (torch's), so a dense parameter given one trains too. So are ``LAMB``,
``LarsSGD``, ``PartialRowWiseAdam`` and ``PartialRowWiseLAMB``: FBGEMM's rules, fused into the
embedding kernel or run as dense optimizers (see [Note: layer-wise rules per row]).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from shardkit.optim._layerwise import LAMB, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB

__all__ = [
    "LAMB",
    "SGD",
    "Adagrad",
    "Adam",
    "LarsSGD",
    "PartialRowWiseAdam",
    "PartialRowWiseLAMB",
    "in_backward_optimizer_filter",
]


def in_backward_optimizer_filter(
    named_parameters: Iterable[tuple[str, nn.Parameter]], include: bool = False
) -> Iterator[tuple[str, nn.Parameter]]:
    """The ``(name, parameter)`` pairs updated in backward (``include=True``) or the others
    (default), by the ``_in_backward_optimizers`` marker that `apply_optimizer_in_backward` (ours,
    TorchRec's or torch's) and sharded tables carry::

        dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                      lambda params: torch.optim.Adam(params, lr=1e-3))
    """
    for name, param in named_parameters:
        if hasattr(param, "_in_backward_optimizers") == include:
            yield name, param


def _checked(cls: type, kwargs: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise TypeError(
            f"{cls.__qualname__} got unknown argument(s) {unknown}; it takes {list(known)} "
            "(FBGEMM-only arguments have no effect in shardkit: drop them)"
        )


class SGD(torch.optim.SGD):
    """torch's SGD; fused into the embedding kernel as EXACT_SGD (momentum 0)."""

    _shardkit_fused_as = torch.optim.SGD

    def __init__(self, params: Iterable[Any], **kwargs: Any) -> None:
        _checked(SGD, kwargs, ("lr", "momentum", "dampening", "weight_decay", "nesterov",
                               "maximize", "foreach", "differentiable", "fused"))  # fmt: skip
        super().__init__(params, **kwargs)


class Adagrad(torch.optim.Adagrad):
    """torch's Adagrad; fused into the embedding kernel as EXACT_ADAGRAD."""

    _shardkit_fused_as = torch.optim.Adagrad

    def __init__(self, params: Iterable[Any], **kwargs: Any) -> None:
        _checked(Adagrad, kwargs, ("lr", "lr_decay", "weight_decay", "initial_accumulator_value",
                                   "eps", "foreach", "maximize", "differentiable", "fused"))  # fmt: skip
        super().__init__(params, **kwargs)


class Adam(torch.optim.Adam):
    """torch's Adam; fused into the embedding kernel as ADAM (the rows a batch touched, with
    SparseAdam's arithmetic)."""

    _shardkit_fused_as = torch.optim.Adam

    def __init__(self, params: Iterable[Any], **kwargs: Any) -> None:
        _checked(Adam, kwargs, ("lr", "betas", "eps", "weight_decay", "amsgrad", "foreach",
                                "maximize", "capturable", "differentiable", "fused"))  # fmt: skip
        super().__init__(params, **kwargs)
