"""This rank's KJT, checked and split per feature, ready for the input exchange."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardkit.modules import BaseEmbeddingConfig, PoolingType, mean_as_weights
from shardkit.sharding._input_dist import SourceBatch
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["source_batch"]


def source_batch(
    features: KeyedJaggedTensor,
    configs: Sequence[BaseEmbeddingConfig],
    *,
    weighted: bool,
    with_weights: bool,
    validate_ids: bool,
) -> SourceBatch:
    """Per feature (module order): lengths, int64 ids and float weights (MEAN folded in).

    Problems are returned in ``error`` rather than raised, so that this rank still takes part in
    the header exchange and all ranks raise together (see [Note: input exchange]).
    """
    error = _check(features, configs, weighted)
    if error is None and validate_ids:
        try:
            features.validate()
        except ValueError as exc:
            error = str(exc)
    if error is not None:
        return SourceBatch(features.stride() if features.keys() else 0, [], [], None, error)
    by_key = features.to_dict()
    lengths, values, weights = [], [], []
    for config in configs:
        for feature in config.feature_names:
            jt = by_key[feature]
            ids = jt.values().long()
            if validate_ids:
                problem = _check_ids(ids, feature, config)
                if problem is not None:
                    return SourceBatch(features.stride(), [], [], None, problem)
            lengths.append(jt.lengths().long())
            values.append(ids)
            if with_weights:
                weights.append(_weights(jt, config))
    return SourceBatch(features.stride(), lengths, values, weights if with_weights else None)


def _check(
    features: KeyedJaggedTensor, configs: Sequence[BaseEmbeddingConfig], weighted: bool
) -> str | None:
    expected = [f for c in configs for f in c.feature_names]
    keys = features.keys()
    missing = [f for f in expected if f not in keys]
    extra = [k for k in keys if k not in set(expected)]
    if missing or extra:
        return (
            f"the KeyedJaggedTensor's keys do not match the module's features: missing "
            f"{missing}, extra {extra}. The module looks up {expected}"
        )
    if features.variable_stride_per_key():
        return f"a sharded collection needs one batch size for all keys, got {features.stride_per_key()}"
    if weighted and features.weights_or_none() is None:
        return "this collection is weighted but the KJT has no weights"
    return None


def _check_ids(ids: torch.Tensor, feature: str, config: BaseEmbeddingConfig) -> str | None:
    if ids.numel() == 0:
        return None
    bad = (ids < 0) | (ids >= config.num_embeddings)
    if not bool(bad.any()):
        return None
    position = int(bad.nonzero()[0, 0])
    return (
        f"feature '{feature}' (table '{config.name}'): id {int(ids[position])} at position "
        f"{position} of the feature's values is out of range: ids must satisfy 0 <= id < "
        f"num_embeddings = {config.num_embeddings}"
    )


def _weights(jt, config: BaseEmbeddingConfig) -> torch.Tensor:
    """``[N]`` float weights of the feature's ids: its own (or 1), MEAN folded in."""
    weights = jt.weights_or_none()
    weights = None if weights is None else weights.float()
    num_ids = jt.values().numel()
    if getattr(config, "pooling", PoolingType.SUM) == PoolingType.MEAN:
        return mean_as_weights(jt.lengths(), weights, num_ids=num_ids)
    return torch.ones(num_ids) if weights is None else weights
