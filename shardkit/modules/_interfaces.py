"""TorchRec's interfaces of the embedding collections and the helpers around their outputs
(``torchrec.modules.embedding_modules``)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = [
    "EmbeddingBagCollectionInterface",
    "EmbeddingCollectionInterface",
    "get_embedding_names_by_table",
    "process_pooled_embeddings",
    "reorder_inverse_indices",
]


class EmbeddingBagCollectionInterface(abc.ABC, nn.Module):
    """What a pooled collection provides: ``forward(KJT) -> KeyedTensor``, its configs and
    whether it is weighted. shardkit's `EmbeddingBagCollection` is registered as one."""

    @abc.abstractmethod
    def forward(self, features: Any) -> Any:
        """A KeyedJaggedTensor in, a KeyedTensor of pooled embeddings out."""

    @abc.abstractmethod
    def embedding_bag_configs(self) -> list[Any]:
        """The tables' `EmbeddingBagConfig`s."""

    @abc.abstractmethod
    def is_weighted(self) -> bool:
        """Whether the input carries a weight per id."""


class EmbeddingCollectionInterface(abc.ABC, nn.Module):
    """What a sequence collection provides: ``forward(KJT) -> {feature: JaggedTensor}``.
    shardkit's `EmbeddingCollection` is registered as one."""

    @abc.abstractmethod
    def forward(self, features: Any) -> Any:
        """A KeyedJaggedTensor in, a JaggedTensor of embeddings per feature out."""

    @abc.abstractmethod
    def embedding_configs(self) -> list[Any]:
        """The tables' `EmbeddingConfig`s."""

    @abc.abstractmethod
    def need_indices(self) -> bool:
        """Whether outputs carry the looked-up ids as their weights."""

    @abc.abstractmethod
    def embedding_dim(self) -> int:
        """The dimension of every table."""

    @abc.abstractmethod
    def embedding_names_by_table(self) -> list[list[str]]:
        """Each table's output names."""


def get_embedding_names_by_table(tables: Sequence[Any]) -> list[list[str]]:
    """Each table's output names: its feature names, as ``"<feature>@<table>"`` where several
    tables read the same feature."""
    seen: dict[str, int] = {}
    for config in tables:
        for feature in config.feature_names:
            seen[feature] = seen.get(feature, 0) + 1
    return [
        [f"{f}@{config.name}" if seen[f] > 1 else f for f in config.feature_names]
        for config in tables
    ]


def process_pooled_embeddings(
    pooled_embeddings: list[torch.Tensor], inverse_indices: torch.Tensor
) -> torch.Tensor:
    """``[B_i, D_i]`` per feature -> ``[B, sum(D_i)]``; with ``inverse_indices`` ``[F, B]`` (not
    empty), feature ``i``'s rows are first expanded by ``pooled[i][inverse_indices[i]]``."""
    if inverse_indices.numel() > 0:
        pooled_embeddings = [
            pooled.index_select(0, index)
            for pooled, index in zip(pooled_embeddings, inverse_indices.unbind(0))
        ]
    return torch.cat(pooled_embeddings, dim=1)


def reorder_inverse_indices(
    inverse_indices: tuple[list[str], torch.Tensor] | None, feature_names: list[str]
) -> torch.Tensor:
    """The rows of ``inverse_indices`` (keys, ``[F, B]``) in the order of ``feature_names``
    (``"<feature>@<table>"`` names read ``<feature>``'s row); empty for None."""
    if inverse_indices is None:
        return torch.empty(0)
    keys, indices = inverse_indices
    position = {key: i for i, key in enumerate(keys)}
    rows = [position[name.split("@")[0]] for name in feature_names]
    return indices.index_select(0, torch.tensor(rows, device=indices.device))
