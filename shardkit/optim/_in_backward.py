"""``apply_optimizer_in_backward``: TorchRec's (and torch's) way to ask for a fused optimizer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from shardkit.optim._config import FusedOptimizerConfig

__all__ = ["apply_optimizer_in_backward", "fused_config_of"]

_ATTR = "_shardkit_fused_optimizer"


def apply_optimizer_in_backward(
    optimizer_class: type[torch.optim.Optimizer],
    params: Iterable[torch.nn.Parameter],
    optimizer_kwargs: Mapping[str, Any],
) -> None:
    """Run ``optimizer_class(**optimizer_kwargs)`` on ``params`` as part of backward.

    Parameters of shardkit embedding modules get the optimizer fused into the embedding kernel:
    they never hold a gradient, and only the rows a batch touched are read and written (their
    module exposes the state as ``module.fused_optimizer``). Any other parameter gets its own
    optimizer, stepped by a hook as soon as its gradient is accumulated, which then drops the
    gradient (torch's ``_apply_optimizer_in_backward`` behaviour).

    Args:
        optimizer_class: ``torch.optim.SGD``, ``Adagrad``, ``Adam``, ``SparseAdam`` or
            ``shardkit.optim.RowWiseAdagrad`` (any torch optimizer for non-embedding params).
        params: the parameters.
        optimizer_kwargs: the optimizer's keyword arguments, e.g. ``{"lr": 0.02}``.
    """
    params = list(params)
    fused = None
    try:
        fused = FusedOptimizerConfig.from_optimizer_class(optimizer_class, optimizer_kwargs)
    except ValueError:
        if any(getattr(p, "_shardkit_embedding_table", False) for p in params):
            raise  # embedding tables only take optimizers the kernel can fuse
    for param in params:
        if getattr(param, "_shardkit_embedding_table", False):
            setattr(param, _ATTR, fused)
        else:
            _step_in_hook(param, optimizer_class, dict(optimizer_kwargs))
        # TorchRec's markers, so that code reading them sees what was asked for.
        param._optimizer_classes = [optimizer_class]  # type: ignore[attr-defined]
        param._optimizer_kwargs = [dict(optimizer_kwargs)]  # type: ignore[attr-defined]


def fused_config_of(param: torch.nn.Parameter) -> FusedOptimizerConfig | None:
    """The fused optimizer `apply_optimizer_in_backward` attached to ``param``, if any."""
    return getattr(param, _ATTR, None)


def _step_in_hook(param: torch.nn.Parameter, optimizer_class: type, kwargs: dict) -> None:
    optimizer = optimizer_class([param], **kwargs)
    param._in_backward_optimizers = [optimizer]  # type: ignore[attr-defined]

    def step(p: torch.Tensor) -> None:
        optimizer.step()
        p.grad = None

    param.register_post_accumulate_grad_hook(step)
