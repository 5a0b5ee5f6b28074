"""DeepFM (Guo et al., 2017) as TorchRec's ``SimpleDeepFMNN`` (``torchrec.models.deepfm``).

Shapes: ``B`` batch, ``F`` sparse features, ``D`` embedding dim, ``N`` dense features, ``H`` the
dense arch's hidden size, ``P`` the deep-FM width.

    dense [B, N] --DenseArch--> [B, D] ----------------------------.
    sparse KJT --EmbeddingBagCollection--> KeyedTensor [B, F * D] --+--FMInteractionArch-->
        [dense, DeepFM(dense, sparse_1..F) [B, P], FM(...) [B, 1]] [B, D + P + 1]
        --OverArch (linear, sigmoid)--> [B, 1]

Note that TorchRec's over arch ends with a sigmoid: the model returns probabilities, not logits.
Module names and state-dict keys are TorchRec's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardkit.modules import EmbeddingBagCollection
from shardkit.modules.deepfm import DeepFM, FactorizationMachine
from shardkit.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = [
    "DenseArch",
    "FMInteractionArch",
    "OverArch",
    "SimpleDeepFMNN",
    "SimpleDeepFMNNWrapper",
    "SparseArch",
]


class SparseArch(nn.Module):
    """The embedding lookups: KJT -> `KeyedTensor` of pooled embeddings."""

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self.embedding_bag_collection(features)


class DenseArch(nn.Module):
    """Two linear layers with ReLUs: ``[B, N] -> [B, H] -> [B, D]``."""

    def __init__(self, in_features: int, hidden_layer_size: int, embedding_dim: int) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(in_features, hidden_layer_size),
            nn.ReLU(),
            nn.Linear(hidden_layer_size, embedding_dim),
            nn.ReLU(),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class FMInteractionArch(nn.Module):
    """``[dense [B, D], DeepFM [B, P], FM [B, 1]]`` over the dense vector and each sparse
    feature's pooled embedding: ``-> [B, D + P + 1]``.

    Args:
        fm_in_features: D + F * D (the flattened inputs' width).
        sparse_feature_names: the features, in order.
        deep_fm_dimension: P.
    """

    def __init__(
        self, fm_in_features: int, sparse_feature_names: list[str], deep_fm_dimension: int
    ) -> None:
        super().__init__()
        self.sparse_feature_names = list(sparse_feature_names)
        self.deep_fm = DeepFM(
            dense_module=nn.Sequential(nn.Linear(fm_in_features, deep_fm_dimension), nn.ReLU())
        )
        self.fm = FactorizationMachine()

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedTensor) -> torch.Tensor:
        if not self.sparse_feature_names:
            return dense_features
        by_key = sparse_features.to_dict()
        inputs = [dense_features] + [by_key[name] for name in self.sparse_feature_names]
        return torch.cat([dense_features, self.deep_fm(inputs), self.fm(inputs)], dim=1)


class OverArch(nn.Module):
    """A linear layer and a sigmoid: ``[B, in_features] -> [B, 1]`` probabilities."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(in_features, 1), nn.Sigmoid())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class SimpleDeepFMNN(nn.Module):
    """DeepFM: ``model(dense [B, N], sparse KJT) -> probabilities [B, 1]``.

    Args:
        num_dense_features: N.
        embedding_bag_collection: the tables (one dim D for all).
        hidden_layer_size: H, the dense arch's hidden width.
        deep_fm_dimension: P, the deep-FM output width.
    """

    def __init__(
        self,
        num_dense_features: int,
        embedding_bag_collection: EmbeddingBagCollection,
        hidden_layer_size: int,
        deep_fm_dimension: int,
    ) -> None:
        super().__init__()
        configs = embedding_bag_collection.embedding_bag_configs()
        if not configs:
            raise ValueError("SimpleDeepFMNN needs an EmbeddingBagCollection with a table")
        dims = sorted({c.embedding_dim for c in configs})
        if len(dims) != 1:
            raise ValueError(f"SimpleDeepFMNN needs one embedding dim for all tables, got {dims}")
        dim = dims[0]
        feature_names = [f for c in configs for f in c.feature_names]
        self.sparse_arch = SparseArch(embedding_bag_collection)
        self.dense_arch = DenseArch(num_dense_features, hidden_layer_size, dim)
        self.inter_arch = FMInteractionArch(
            fm_in_features=dim * (1 + len(feature_names)),
            sparse_feature_names=feature_names,
            deep_fm_dimension=deep_fm_dimension,
        )
        self.over_arch = OverArch(dim + deep_fm_dimension + 1)

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        dense = self.dense_arch(dense_features)  # [B, D]
        sparse = self.sparse_arch(sparse_features)  # KeyedTensor [B, F * D]
        return self.over_arch(self.inter_arch(dense_features=dense, sparse_features=sparse))


class SimpleDeepFMNNWrapper(SimpleDeepFMNN):
    """SimpleDeepFMNN over TorchRec's test ``ModelInput``: ``(loss, probabilities)`` in training
    (TorchRec's loss: BCE-with-logits applied to the probabilities), else the probabilities."""

    def forward(self, model_input: Any) -> Any:  # type: ignore[override]
        pred = super().forward(model_input.float_features, model_input.idlist_features)
        if self.training:
            loss = nn.functional.binary_cross_entropy_with_logits(pred.squeeze(), model_input.label)
            return loss, pred
        return pred
