"""Gradient clipping before the step (``torchrec.optim.clipping``).

[Note: global gradient norm]
With ``enable_global_grad_clip`` and ``param_to_pgs``, a parameter sharded over the ranks of some
process groups holds only its shard's gradient on each rank; its part of the norm is
``sum |g_shard|^p`` all-reduced (summed; max for the inf-norm) over each of its groups. Other
parameters are replicated (every rank has the whole gradient) and count once. The total norm is
``(sharded + replicated) ** (1/p)`` and every rank scales every gradient by
``min(1, max_gradient / (norm + 1e-6))``: the clipping an unsharded model would do. Every rank must
call ``step`` (the all-reduce is a collective).
"""

from __future__ import annotations

import enum
import logging
import math
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from shardkit.compat import is_dtensor
from shardkit.optim._keyed import KeyedOptimizer
from shardkit.optim._wrappers import OptimizerWrapper

__all__ = ["GradientClipping", "GradientClippingOptimizer"]

logger = logging.getLogger(__name__)


@enum.unique
class GradientClipping(enum.Enum):
    """Clip by the total norm, by each value, or not at all."""

    NORM = "norm"
    VALUE = "value"
    NONE = "none"


class GradientClippingOptimizer(OptimizerWrapper):
    """Clips the gradients of the wrapped optimizer's parameters, then steps it.

    Args:
        optimizer: the keyed optimizer to wrap.
        clipping: NORM (scale all gradients so their total ``norm_type``-norm is at most
            ``max_gradient``), VALUE (clamp each value to ``[-max_gradient, max_gradient]``) or
            NONE.
        max_gradient: the bound.
        norm_type: the p of the norm (``"inf"`` or ``float("inf")`` for the largest value).
        enable_global_grad_clip: clip by the norm over all ranks (see
            [Note: global gradient norm]); needs ``param_to_pgs``.
        param_to_pgs: ``{parameter: [process groups it is sharded over]}``.
        track_grad_norm: keep the total norm of each step in ``last_total_grad_norm`` even when
            not clipping by norm.
    """

    def __init__(
        self,
        optimizer: KeyedOptimizer,
        clipping: GradientClipping = GradientClipping.NONE,
        max_gradient: float = 0.1,
        norm_type: float | str = 2.0,
        enable_global_grad_clip: bool = False,
        param_to_pgs: dict[torch.Tensor, list[dist.ProcessGroup]] | None = None,
        track_grad_norm: bool = False,
    ) -> None:
        super().__init__(optimizer)
        self._clipping = GradientClipping(clipping)
        if max_gradient <= 0:
            raise ValueError(
                f"GradientClippingOptimizer: max_gradient must be > 0, got {max_gradient}"
            )
        self._max_gradient = max_gradient
        self._norm_type = float(norm_type)
        self._track_grad_norm = track_grad_norm
        self._last_total_grad_norm: torch.Tensor | None = None
        self._step_num = 0
        self._replicate_params: list[torch.Tensor] = []
        self._sharded_params: dict[tuple, list[torch.Tensor]] = defaultdict(list)
        for group in self.param_groups:
            for param in group["params"]:
                groups = (param_to_pgs or {}).get(param) if enable_global_grad_clip else None
                if groups:
                    self._sharded_params[tuple(groups)].append(param)
                else:
                    self._replicate_params.append(param)
        if self._sharded_params and self._clipping == GradientClipping.VALUE:
            raise ValueError(
                "GradientClippingOptimizer: clipping=VALUE with sharded parameters "
                "(enable_global_grad_clip and param_to_pgs) is not supported; clip by NORM"
            )
        logger.info(
            "gradient clipping %s: %d sharded and %d replicated parameter(s)",
            self._clipping.value,
            sum(len(v) for v in self._sharded_params.values()),
            len(self._replicate_params),
        )

    @property
    def last_total_grad_norm(self) -> torch.Tensor | None:
        """The total gradient norm of the latest step (None before one, or when not known)."""
        return self._last_total_grad_norm

    def step(self, closure: Any = None) -> Any:
        every = self._replicate_params + [p for ps in self._sharded_params.values() for p in ps]
        if any(p.device.type == "meta" for p in every):
            self._last_total_grad_norm = None  # nothing materialised yet: nothing to clip
            return super().step(closure)
        if self._clipping == GradientClipping.NORM:
            self._last_total_grad_norm = self.clip_grad_norm_()
        elif self._clipping == GradientClipping.VALUE:
            if self._track_grad_norm:
                self._last_total_grad_norm, _ = self.compute_total_grad_norm()
            torch.nn.utils.clip_grad_value_(self._replicate_params, clip_value=self._max_gradient)
        elif self._track_grad_norm:
            self._last_total_grad_norm, _ = self.compute_total_grad_norm()
        self._step_num += 1
        return super().step(closure)

    def compute_total_grad_norm(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The total norm over all ranks (see [Note: global gradient norm]) and the local
        gradient tensors it covers."""
        p = self._norm_type
        combine = torch.maximum if p == math.inf else torch.add
        total = torch.tensor(-math.inf if p == math.inf else 0.0)
        grads: list[torch.Tensor] = []
        for groups, params in self._sharded_params.items():
            local = _grads(params)
            grads += local
            norm = _powered_norm(local, p, groups, device=_local(params[0]).device)
            total = combine(total, norm.to(total.device))
        local = _grads(self._replicate_params)
        grads += local
        if local:
            replicated = _powered_norm(local, p, ())
            total = combine(total.to(replicated.device), replicated)
        return (total if p == math.inf else total.pow(1.0 / p)), grads

    def clip_grad_norm_(self) -> torch.Tensor | None:
        """Scale every gradient by ``min(1, max_gradient / (total norm + 1e-6))``; returns the
        total norm (None when no parameter has a gradient)."""
        total, grads = self.compute_total_grad_norm()
        if not grads:
            return None
        scale = torch.clamp(self._max_gradient / (total + 1e-6), max=1.0)
        torch._foreach_mul_(grads, scale.to(grads[0].device))
        return total


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The non-empty local gradients (a DTensor's local shard)."""
    grads = []
    for param in params:
        grad = param.grad
        if grad is None or grad.numel() == 0:
            continue
        grads.append(_local(grad))
    return grads


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, else the tensor (See [Note: DTensor on demand])."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def _powered_norm(
    grads: list[torch.Tensor], p: float, groups: tuple, *, device: torch.device | None = None
) -> torch.Tensor:
    """``sum |g|^p`` (``max |g|`` for p = inf) over ``grads``, reduced over ``groups``; a rank
    without gradients contributes its identity on ``device`` (NCCL carries no CPU tensor)."""
    if not grads:
        norm = torch.tensor(-math.inf if p == math.inf else 0.0, device=device)
    else:
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, p)), p)
        norm = norm if p == math.inf else norm.pow(p)
    for group in groups:
        op = dist.ReduceOp.MAX if p == math.inf else dist.ReduceOp.SUM
        dist.all_reduce(norm, op=op, group=group)
    return norm
