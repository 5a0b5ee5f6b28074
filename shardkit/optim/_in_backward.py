"""``apply_optimizer_in_backward``: TorchRec's (and torch's) way to ask for a fused optimizer.

[Note: in-backward markers]
Three functions mark parameters for an optimizer that runs in backward: shardkit's
`apply_optimizer_in_backward`, TorchRec's (which calls torch's) and torch's
``torch.distributed.optim._apply_optimizer_in_backward``. All leave torch's markers on each
parameter: ``_optimizer_classes`` and ``_optimizer_kwargs`` (what was asked) and
``_in_backward_optimizers`` (which `in_backward_optimizer_filter` reads to keep the parameter
away from the dense optimizer). An embedding table of a shardkit collection never gets a
gradient: its optimizer runs fused in the embedding kernel, and `fused_config_of` reads the
request from shardkit's own marker or, when torch's function marked the table, from torch's
markers, so a collection trains the same whichever function was called.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from shardkit.optim._config import FusedOptimizerConfig
from shardkit.optim.fused import EmptyFusedOptimizer

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
    gradient (torch's ``_apply_optimizer_in_backward``, which this calls). See
    [Note: in-backward markers].

    Args:
        optimizer_class: ``torch.optim.SGD``, ``Adagrad``, ``Adam``, ``SparseAdam``,
            ``shardkit.optim.RowWiseAdagrad`` or ``shardkit.optim.optimizers``' classes for
            embedding tables; any torch optimizer for other parameters.
        params: the parameters.
        optimizer_kwargs: the optimizer's keyword arguments, e.g. ``{"lr": 0.02}``.
    """
    params = list(params)
    tables = [p for p in params if getattr(p, "_shardkit_embedding_table", False)]
    dense = [p for p in params if not getattr(p, "_shardkit_embedding_table", False)]
    if tables:  # only optimizers the kernel can fuse; the error names the ones it can
        fused = FusedOptimizerConfig.from_optimizer_class(optimizer_class, optimizer_kwargs)
        for param in tables:
            setattr(param, _ATTR, fused)
            param._optimizer_classes = [optimizer_class]  # type: ignore[attr-defined]
            param._optimizer_kwargs = [dict(optimizer_kwargs)]  # type: ignore[attr-defined]
            param._in_backward_optimizers = [EmptyFusedOptimizer()]  # type: ignore[attr-defined]
    if dense:
        # torch.distributed.optim takes seconds to import: only when it is needed.
        from torch.distributed.optim import _apply_optimizer_in_backward

        _apply_optimizer_in_backward(optimizer_class, dense, dict(optimizer_kwargs))


def fused_config_of(param: torch.Tensor) -> FusedOptimizerConfig | None:
    """The fused optimizer asked for ``param`` (a table) with any of the three functions of
    [Note: in-backward markers], or None."""
    config = getattr(param, _ATTR, None)
    if config is not None or not getattr(param, "_shardkit_embedding_table", False):
        return config
    classes = getattr(param, "_optimizer_classes", None)
    if not classes:
        return None
    if len(classes) != 1:
        names = [c.__qualname__ for c in classes]
        raise ValueError(
            f"an embedding table was given {len(classes)} in-backward optimizers {names}; the "
            "embedding kernel fuses one: call apply_optimizer_in_backward once per table"
        )
    kwargs = param._optimizer_kwargs[0]  # type: ignore[attr-defined]  # a marker set with classes
    return FusedOptimizerConfig.from_optimizer_class(classes[0], kwargs)
