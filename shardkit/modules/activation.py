"""Activation modules (``torchrec.modules.activation``)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SwishLayerNorm"]


class SwishLayerNorm(nn.Module):
    """``y = x * sigmoid(LayerNorm(x))``.

    Args:
        input_dims: the trailing dimensions to normalise over (an int for the last one).
        device: where the LayerNorm's parameters live.

    State dict: ``norm.0.weight``, ``norm.0.bias`` (TorchRec's keys).
    """

    def __init__(
        self, input_dims: int | list[int] | torch.Size, device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.norm = nn.Sequential(nn.LayerNorm(input_dims, device=device), nn.Sigmoid())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """``[..., *input_dims] -> [..., *input_dims]``."""
        return input * self.norm(input)
