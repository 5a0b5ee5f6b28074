"""DeepFM's two halves over a list of embeddings (``torchrec.modules.deepfm``; Guo et al., 2017).

Each takes a list of tensors ``[B, ...]`` (e.g. ``[B, F_i, D]`` per group of features), flattens
each to ``[B, n_i]`` and concatenates them to ``x`` ``[B, N]``:

    DeepFM                dense_module(x)
    FactorizationMachine  0.5 * ((sum_i x_i)^2 - sum_i x_i^2)   -> [B, 1]

(TorchRec's definition: the pairwise interaction term of a factorisation machine over the N
flattened values, each one scalar feature.)
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DeepFM", "FactorizationMachine"]


def _flatten(embeddings: list[torch.Tensor]) -> torch.Tensor:
    if not embeddings:
        raise ValueError("DeepFM/FactorizationMachine: got no embeddings (an empty list)")
    return torch.cat([e.flatten(1) for e in embeddings], dim=1)  # [B, N]


class DeepFM(nn.Module):
    """The deep half: ``dense_module`` over the flattened, concatenated embeddings.

    Args:
        dense_module: maps ``[B, N]`` to the output (e.g. an `MLP`).
    """

    def __init__(self, dense_module: nn.Module) -> None:
        super().__init__()
        self.dense_module = dense_module

    def forward(self, embeddings: list[torch.Tensor]) -> torch.Tensor:
        return self.dense_module(_flatten(embeddings))


class FactorizationMachine(nn.Module):
    """The second-order interaction term: ``list of [B, ...] -> [B, 1]`` (no parameters)."""

    def forward(self, embeddings: list[torch.Tensor]) -> torch.Tensor:
        x = _flatten(embeddings)
        total = x.sum(dim=1, keepdim=True)  # [B, 1]
        squares = (x * x).sum(dim=1, keepdim=True)  # [B, 1]
        return 0.5 * (total * total - squares)
