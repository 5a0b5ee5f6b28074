"""DLRM (Naumov et al., 2019) and its DCN-v2 variant, with TorchRec's constructor arguments.

Shapes: ``B`` batch, ``F`` sparse features, ``D`` embedding dim (= the dense arch's output),
``N`` dense input features.

    dense [B, N] --DenseArch MLP--> [B, D] --.
                                              +--Interaction--> [B, I] --OverArch MLP--> logits [B, 1]
    sparse KJT --EmbeddingBagCollection--> [B, F, D] --'

`InteractionArch` is DLRM's pairwise dot products; `InteractionDCNArch` feeds the concatenated
features through a low-rank DCN-v2 cross network instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules import EmbeddingBagCollection
from shardkit.sparse import KeyedJaggedTensor

__all__ = [
    "DLRM",
    "DLRM_DCN",
    "DLRMTrain",
    "DenseArch",
    "InteractionArch",
    "InteractionDCNArch",
    "LowRankCrossNet",
    "OverArch",
    "SparseArch",
]


def _mlp(in_features: int, layer_sizes: Sequence[int], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for index, size in enumerate(layer_sizes):
        layers.append(nn.Linear(in_features, size))
        if last_activation or index < len(layer_sizes) - 1:
            layers.append(nn.ReLU())
        in_features = size
    return nn.Sequential(*layers)


class SparseArch(nn.Module):
    """Embedding lookups: KJT -> ``[B, F, D]`` (all tables must share one dim)."""

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        dims = {c.embedding_dim for c in embedding_bag_collection.embedding_bag_configs()}
        if len(dims) != 1:
            raise ValueError(f"DLRM needs one embedding dim for all tables, got {sorted(dims)}")
        self.embedding_dim = dims.pop()
        self.feature_names = [
            f for c in embedding_bag_collection.embedding_bag_configs() for f in c.feature_names
        ]

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features)
        return pooled.values().view(-1, len(self.feature_names), self.embedding_dim)


class DenseArch(nn.Module):
    """MLP over dense features: ``[B, N] -> [B, layer_sizes[-1]]`` (ReLU after every layer)."""

    def __init__(self, in_features: int, layer_sizes: Sequence[int]) -> None:
        super().__init__()
        self.model = _mlp(in_features, layer_sizes, last_activation=True)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class InteractionArch(nn.Module):
    """Dense vector and every pairwise dot product of ``[dense, sparse_1..F]``:
    ``[B, D] x [B, F, D] -> [B, D + (F + 1) F / 2]``."""

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self.num_sparse_features = num_sparse_features
        pairs = torch.triu_indices(num_sparse_features + 1, num_sparse_features + 1, offset=1)
        self.register_buffer("triu_indices", pairs, persistent=False)

    def output_dim(self, dim: int) -> int:
        f = self.num_sparse_features
        return dim + (f + 1) * f // 2

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        combined = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # [B, F + 1, D]
        dots = torch.bmm(combined, combined.transpose(1, 2))  # [B, F + 1, F + 1]
        return torch.cat([dense, dots[:, self.triu_indices[0], self.triu_indices[1]]], dim=1)


class LowRankCrossNet(nn.Module):
    """DCN-v2's cross network with low-rank weights: ``x_{l+1} = x_0 * (V_l(U_l x_l) + b_l) + x_l``."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int) -> None:
        super().__init__()
        if num_layers < 1 or low_rank < 1:
            raise ValueError(
                f"need num_layers >= 1 and low_rank >= 1, got {num_layers}, {low_rank}"
            )
        self.down = nn.ModuleList(
            nn.Linear(in_features, low_rank, bias=False) for _ in range(num_layers)
        )
        self.up = nn.ModuleList(nn.Linear(low_rank, in_features) for _ in range(num_layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for down, up in zip(self.down, self.up):
            x = x0 * up(down(x)) + x
        return x


class InteractionDCNArch(nn.Module):
    """Concatenate ``[dense, sparse_1..F]`` and cross them: ``-> [B, (F + 1) D]``."""

    def __init__(self, num_sparse_features: int, crossnet: nn.Module) -> None:
        super().__init__()
        self.num_sparse_features = num_sparse_features
        self.crossnet = crossnet

    def output_dim(self, dim: int) -> int:
        return (self.num_sparse_features + 1) * dim

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        combined = torch.cat([dense.unsqueeze(1), sparse], dim=1).flatten(1)
        return self.crossnet(combined)


class OverArch(nn.Module):
    """MLP to the logits; no activation after the last layer."""

    def __init__(self, in_features: int, layer_sizes: Sequence[int]) -> None:
        super().__init__()
        self.model = _mlp(in_features, layer_sizes, last_activation=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class DLRM(nn.Module):
    """Deep Learning Recommendation Model: ``model(dense [B, N], sparse KJT) -> logits [B, 1]``.

    Args:
        embedding_bag_collection: the tables (one dim D for all).
        dense_in_features: N.
        dense_arch_layer_sizes: the dense MLP; its last size must be D.
        over_arch_layer_sizes: the top MLP; its last size is the number of logits (1).
        dense_device: where the dense layers live.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: Sequence[int],
        over_arch_layer_sizes: Sequence[int],
        dense_device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        dim = self.sparse_arch.embedding_dim
        if not dense_arch_layer_sizes or dense_arch_layer_sizes[-1] != dim:
            raise ValueError(
                f"dense_arch_layer_sizes must end with the embedding dim {dim}, got "
                f"{list(dense_arch_layer_sizes)}"
            )
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes)
        self.inter_arch = self._interaction(len(self.sparse_arch.feature_names), dim)
        self.over_arch = OverArch(self.inter_arch.output_dim(dim), over_arch_layer_sizes)
        if dense_device is not None:
            for arch in (self.dense_arch, self.inter_arch, self.over_arch):
                arch.to(dense_device)

    def _interaction(self, num_sparse_features: int, dim: int) -> nn.Module:
        return InteractionArch(num_sparse_features)

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        dense = self.dense_arch(dense_features)
        sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(dense, sparse))


class DLRM_DCN(DLRM):  # TorchRec's name
    """DLRM with a low-rank DCN-v2 cross network as the interaction.

    Args: as `DLRM`, plus ``dcn_num_layers`` and ``dcn_low_rank_dim``.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: Sequence[int],
        over_arch_layer_sizes: Sequence[int],
        dcn_num_layers: int,
        dcn_low_rank_dim: int,
        dense_device: torch.device | None = None,
    ) -> None:
        self._dcn = (dcn_num_layers, dcn_low_rank_dim)
        super().__init__(
            embedding_bag_collection,
            dense_in_features,
            dense_arch_layer_sizes,
            over_arch_layer_sizes,
            dense_device,
        )

    def _interaction(self, num_sparse_features: int, dim: int) -> nn.Module:
        in_features = (num_sparse_features + 1) * dim
        crossnet = LowRankCrossNet(in_features, *self._dcn)
        return InteractionDCNArch(num_sparse_features, crossnet)


class DLRMTrain(nn.Module):
    """Wraps a DLRM for training (TorchRec's interface): ``model(batch) -> (loss, (loss, logits,
    labels))`` with binary cross-entropy on the logits. ``batch`` has ``dense_features``,
    ``sparse_features`` and ``labels`` (e.g. `shardkit.data.Batch`)."""

    def __init__(self, dlrm_module: DLRM) -> None:
        super().__init__()
        self.model = dlrm_module
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(
        self, batch: Any
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = self.loss_fn(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())
