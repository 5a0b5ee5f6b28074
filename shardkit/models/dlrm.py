"""DLRM (Naumov et al., 2019) and its DCN-v2 and projection variants (``torchrec.models.dlrm``).

Shapes: ``B`` batch, ``F`` sparse features, ``D`` embedding dim (= the dense arch's output),
``N`` dense input features.

    dense [B, N] --DenseArch MLP--> [B, D] --.
                                              +--interaction--> [B, I] --OverArch--> logits [B, 1]
    sparse KJT --EmbeddingBagCollection--> [B, F, D] --'

The interaction is DLRM's pairwise dot products (`InteractionArch`), a low-rank DCN-v2 cross
network over the concatenated features (`InteractionDCNArch`), or the products of two learned
projections (`InteractionProjectionArch`). Module names and state-dict keys are TorchRec's
(``dense_arch.model._mlp.0._linear.weight``, ``over_arch.model.1.weight``, ...), so TorchRec
checkpoints of these models load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules import EmbeddingBagCollection
from shardkit.modules.crossnet import LowRankCrossNet
from shardkit.modules.mlp import MLP
from shardkit.sparse import KeyedJaggedTensor

__all__ = [
    "DLRM",
    "DLRM_DCN",
    "DLRMTrain",
    "DLRMWrapper",
    "DLRM_Projection",
    "DenseArch",
    "InteractionArch",
    "InteractionDCNArch",
    "InteractionProjectionArch",
    "LowRankCrossNet",
    "OverArch",
    "SparseArch",
    "choose",
]


def choose(n: int, k: int) -> int:
    """The binomial coefficient ``n choose k`` (0 outside ``0 <= k <= n``)."""
    if not 0 <= k <= n:
        return 0
    numerator, denominator = 1, 1
    for t in range(1, min(k, n - k) + 1):
        numerator *= n
        denominator *= t
        n -= 1
    return numerator // denominator


class SparseArch(nn.Module):
    """Embedding lookups: KJT -> ``[B, F, D]`` (all tables must share one dim D)."""

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = embedding_bag_collection.embedding_bag_configs()
        if not configs:
            raise ValueError("SparseArch needs an EmbeddingBagCollection with at least one table")
        dims = sorted({c.embedding_dim for c in configs})
        if len(dims) != 1:
            raise ValueError(f"DLRM needs one embedding dim for all tables, got {dims}")
        self.D: int = dims[0]
        self._sparse_feature_names = [f for c in configs for f in c.feature_names]
        self.F: int = len(self._sparse_feature_names)

    @property
    def sparse_feature_names(self) -> list[str]:
        return self._sparse_feature_names

    @property
    def embedding_dim(self) -> int:  # shardkit's name, kept
        return self.D

    @property
    def feature_names(self) -> list[str]:  # shardkit's name, kept
        return self._sparse_feature_names

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features)
        if list(pooled.keys()) == self._sparse_feature_names:
            return pooled.values().view(-1, self.F, self.D)
        by_key = pooled.to_dict()  # a sharded collection may order its keys otherwise
        return torch.cat([by_key[f] for f in self._sparse_feature_names], 1).view(
            -1, self.F, self.D
        )


class DenseArch(nn.Module):
    """MLP over dense features: ``[B, N] -> [B, layer_sizes[-1]]`` (ReLU after every layer)."""

    def __init__(
        self, in_features: int, layer_sizes: Sequence[int], device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.model = MLP(in_features, list(layer_sizes), bias=True, activation="relu",
                         device=device)  # fmt: skip

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


def _combined(dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
    return torch.cat([dense.unsqueeze(1), sparse], dim=1)  # [B, F + 1, D]


class InteractionArch(nn.Module):
    """The dense vector and every pairwise dot product of ``[dense, sparse_1..F]``:
    ``[B, D] x [B, F, D] -> [B, D + (F + 1) F / 2]``."""

    triu_indices: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self.F: int = num_sparse_features
        pairs = torch.triu_indices(self.F + 1, self.F + 1, offset=1)
        self.register_buffer("triu_indices", pairs, persistent=False)

    def output_dim(self, dim: int) -> int:
        return dim + choose(self.F, 2) + self.F

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        combined = _combined(dense_features, sparse_features)
        dots = torch.bmm(combined, combined.transpose(1, 2))  # [B, F + 1, F + 1]
        return torch.cat([dense_features, dots[:, self.triu_indices[0], self.triu_indices[1]]], 1)


class InteractionDCNArch(nn.Module):
    """``crossnet`` over the concatenation of ``[dense, sparse_1..F]``: ``-> [B, (F + 1) D]``."""

    def __init__(self, num_sparse_features: int, crossnet: nn.Module) -> None:
        super().__init__()
        self.F: int = num_sparse_features
        self.crossnet = crossnet

    def output_dim(self, dim: int) -> int:
        return (self.F + 1) * dim

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        return self.crossnet(_combined(dense_features, sparse_features).flatten(1))


class InteractionProjectionArch(nn.Module):
    """Products of two projections of ``[dense, sparse_1..F]`` flattened (``x`` ``[B, (F+1) D]``):
    ``branch1(x)`` as ``[B, P1, D]`` times ``branch2(x)`` as ``[B, D, P2]``, flattened and after the
    dense vector: ``-> [B, D + P1 P2]``."""

    def __init__(
        self, num_sparse_features: int, interaction_branch1: nn.Module,
        interaction_branch2: nn.Module,
    ) -> None:  # fmt: skip
        super().__init__()
        self.F: int = num_sparse_features
        self.interaction_branch1 = interaction_branch1
        self.interaction_branch2 = interaction_branch2

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        batch, dim = dense_features.shape
        flat = _combined(dense_features, sparse_features).reshape(batch, -1)
        left = self.interaction_branch1(flat).reshape(batch, -1, dim)  # [B, P1, D]
        right = self.interaction_branch2(flat).reshape(batch, dim, -1)  # [B, D, P2]
        return torch.cat([dense_features, torch.bmm(left, right).reshape(batch, -1)], dim=1)


class OverArch(nn.Module):
    """MLP to the logits, no activation after the last layer: ``[B, in] -> [B, layer_sizes[-1]]``.

    TorchRec's layout: ``model`` is ``Sequential(MLP(in, layer_sizes[:-1]), Linear)``, so it needs
    at least two layers.
    """

    def __init__(
        self, in_features: int, layer_sizes: Sequence[int], device: torch.device | None = None
    ) -> None:
        super().__init__()
        if len(layer_sizes) <= 1:
            raise ValueError(
                f"over_arch_layer_sizes {list(layer_sizes)}: the over arch needs at least two "
                "layers (an MLP and the final linear layer), e.g. [64, 1]"
            )
        self.model = nn.Sequential(
            MLP(in_features, list(layer_sizes[:-1]), bias=True, activation="relu", device=device),
            nn.Linear(layer_sizes[-2], layer_sizes[-1], bias=True, device=device),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class DLRM(nn.Module):
    """Deep Learning Recommendation Model: ``model(dense [B, N], sparse KJT) -> logits [B, 1]``.

    Args:
        embedding_bag_collection: the tables (one dim D for all).
        dense_in_features: N.
        dense_arch_layer_sizes: the dense MLP; its last size must be D.
        over_arch_layer_sizes: the top MLP (two layers or more); its last size is the number of
            logits (1).
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
        self._cuda_graph_enabled = False
        self.sparse_arch = SparseArch(embedding_bag_collection)
        dim, num_features = self.sparse_arch.D, self.sparse_arch.F
        if not dense_arch_layer_sizes or dense_arch_layer_sizes[-1] != dim:
            raise ValueError(
                f"dense_arch_layer_sizes must end with the embedding dim {dim}, got "
                f"{list(dense_arch_layer_sizes)}"
            )
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes, dense_device)
        self.inter_arch, over_in = self._interaction(num_features, dim, dense_device)
        self.over_arch = OverArch(over_in, over_arch_layer_sizes, dense_device)

    def _interaction(
        self, num_features: int, dim: int, device: torch.device | None
    ) -> tuple[nn.Module, int]:
        """The interaction arch and its output width (subclasses choose another)."""
        arch = InteractionArch(num_features)
        return arch.to(device) if device is not None else arch, arch.output_dim(dim)

    def compile_dense_path(self, compile_mode: str = "reduce-overhead") -> None:
        """``torch.compile`` the dense, interaction and over arches (once)."""
        if self._cuda_graph_enabled:
            return
        # torch.compile's stub returns a plain callable; given a Module it returns a Module
        self.dense_arch = torch.compile(self.dense_arch, mode=compile_mode)  # type: ignore[assignment]
        self.inter_arch = torch.compile(self.inter_arch, mode=compile_mode)  # type: ignore[assignment]
        self.over_arch = torch.compile(self.over_arch, mode=compile_mode)  # type: ignore[assignment]
        self._cuda_graph_enabled = True

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        dense = self.dense_arch(dense_features)  # [B, D]
        sparse = self.sparse_arch(sparse_features)  # [B, F, D]
        return self.over_arch(self.inter_arch(dense_features=dense, sparse_features=sparse))


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
        super().__init__(embedding_bag_collection, dense_in_features, dense_arch_layer_sizes,
                         over_arch_layer_sizes, dense_device)  # fmt: skip

    def _interaction(
        self, num_features: int, dim: int, device: torch.device | None
    ) -> tuple[nn.Module, int]:
        in_features = (num_features + 1) * dim
        crossnet = LowRankCrossNet(in_features, num_layers=self._dcn[0], low_rank=self._dcn[1])
        arch = InteractionDCNArch(num_features, crossnet)
        return arch.to(device) if device is not None else arch, in_features


class DLRM_Projection(DLRM):  # TorchRec's name
    """DLRM whose interaction multiplies two learned projections (`InteractionProjectionArch`).

    Args: as `DLRM`, plus ``interaction_branch1_layer_sizes`` and
    ``interaction_branch2_layer_sizes``: the two projections' MLPs, each ending with a multiple
    of D (``P1 * D`` and ``P2 * D``).
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: Sequence[int],
        over_arch_layer_sizes: Sequence[int],
        interaction_branch1_layer_sizes: Sequence[int],
        interaction_branch2_layer_sizes: Sequence[int],
        dense_device: torch.device | None = None,
    ) -> None:
        self._branches = (list(interaction_branch1_layer_sizes),
                          list(interaction_branch2_layer_sizes))  # fmt: skip
        super().__init__(embedding_bag_collection, dense_in_features, dense_arch_layer_sizes,
                         over_arch_layer_sizes, dense_device)  # fmt: skip

    def _interaction(
        self, num_features: int, dim: int, device: torch.device | None
    ) -> tuple[nn.Module, int]:
        in_features = (num_features + 1) * dim
        projected = []
        for number, sizes in enumerate(self._branches, start=1):
            if not sizes or sizes[-1] % dim:
                raise ValueError(
                    f"interaction_branch{number}_layer_sizes {sizes} must end with a multiple of "
                    f"the embedding dim {dim}"
                )
            projected.append(sizes[-1] // dim)
        branch1, branch2 = (DenseArch(in_features, sizes, device) for sizes in self._branches)
        arch = InteractionProjectionArch(num_features, branch1, branch2)
        return arch, dim + projected[0] * projected[1]


class DLRMTrain(nn.Module):
    """Wraps a DLRM for training (TorchRec's interface): ``model(batch) -> (loss, (loss, logits,
    labels))`` with binary cross-entropy on the logits. ``batch`` has ``dense_features``,
    ``sparse_features`` and ``labels`` (e.g. `shardkit.datasets.utils.Batch`)."""

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


class DLRMWrapper(DLRM):
    """DLRM over TorchRec's test ``ModelInput`` (``float_features``, ``idlist_features``,
    ``label``): ``(loss, logits)`` in training, ``logits`` in eval."""

    def forward(self, model_input: Any) -> Any:  # type: ignore[override]
        pred = super().forward(model_input.float_features, model_input.idlist_features)
        if self.training:
            loss = nn.functional.binary_cross_entropy_with_logits(pred.squeeze(), model_input.label)
            return loss, pred
        return pred
