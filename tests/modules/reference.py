"""The plain-PyTorch reference for embedding collections: one nn.EmbeddingBag per table."""

from __future__ import annotations

import torch

from shardkit.modules import EmbeddingBagConfig, PoolingType
from shardkit.optim import (
    LAMB,
    EmbOptimType,
    LarsSGD,
    PartialRowWiseAdam,
    PartialRowWiseLAMB,
    RowWiseAdagrad,
)


class ReferenceEBC(torch.nn.Module):
    """What EmbeddingBagCollection must compute, the slow obvious way."""

    def __init__(
        self, configs: list[EmbeddingBagConfig], weights: dict[str, torch.Tensor], sparse: bool
    ):
        super().__init__()
        self.configs = configs
        self.bags = torch.nn.ModuleDict()
        for config in configs:
            bag = torch.nn.EmbeddingBag(
                config.num_embeddings, config.embedding_dim, mode="sum", sparse=sparse
            )
            bag.weight.data.copy_(weights[config.name])
            self.bags[config.name] = bag

    def forward(self, kjt) -> torch.Tensor:
        by_key = kjt.to_dict()
        pooled = []
        for config in self.configs:
            for feature in config.feature_names:
                jt = by_key[feature]
                lengths = jt.lengths()
                weights = jt.weights_or_none()
                if config.pooling == PoolingType.MEAN:
                    per_id = (1.0 / lengths.clamp(min=1).float()).repeat_interleave(lengths)
                    weights = per_id if weights is None else weights * per_id
                offsets = jt.offsets()[:-1]
                pooled.append(
                    self.bags[config.name](jt.values(), offsets, per_sample_weights=weights)
                )
        return torch.cat(pooled, dim=1)


def reference_optimizer(kind: EmbOptimType, params, lr: float):
    return {
        EmbOptimType.EXACT_SGD: lambda: torch.optim.SGD(params, lr=lr),
        EmbOptimType.EXACT_ADAGRAD: lambda: torch.optim.Adagrad(params, lr=lr, eps=1e-8),
        EmbOptimType.EXACT_ROWWISE_ADAGRAD: lambda: RowWiseAdagrad(params, lr=lr, eps=1e-8),
        EmbOptimType.ADAM: lambda: torch.optim.SparseAdam(params, lr=lr, eps=1e-8),
        # FBGEMM's rules: shardkit's dense optimizers on sparse gradients (their arithmetic is
        # tested against an independent reference in tests/optim/test_layerwise.py)
        EmbOptimType.LAMB: lambda: LAMB(params, lr=lr, eps=1e-8),
        EmbOptimType.LARS_SGD: lambda: LarsSGD(params, lr=lr),
        EmbOptimType.PARTIAL_ROWWISE_ADAM: lambda: PartialRowWiseAdam(params, lr=lr, eps=1e-8),
        EmbOptimType.PARTIAL_ROWWISE_LAMB: lambda: PartialRowWiseLAMB(params, lr=lr, eps=1e-8),
    }[kind]()


def is_sparse_reference(kind: EmbOptimType) -> bool:
    """torch has sparse-gradient SGD/Adagrad/SparseAdam; row-wise Adagrad takes dense grads
    (the same result: untouched rows get a zero gradient, which changes neither weight nor state)."""
    return kind != EmbOptimType.EXACT_ROWWISE_ADAGRAD
