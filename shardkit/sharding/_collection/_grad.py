"""Identity in forward, a constant factor on the gradient in backward."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["scale_grad"]


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` unchanged, whose gradient is multiplied by ``scale`` on the way back."""
    if scale == 1.0 or not x.requires_grad:
        return x
    return _ScaleGrad.apply(x, scale)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None
