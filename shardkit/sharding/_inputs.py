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
    device: torch.device,
) -> SourceBatch:
    """Per feature (module order): lengths, int64 ids and float weights (MEAN folded in).

    Problems are returned in ``error`` rather than raised, so that this rank still takes part in
    the header exchange and all ranks raise together (see [Note: input exchange]).
    """
    error = _check(features, configs, weighted, device)
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
            lengths.append(jt.lengths().long())
            values.append(jt.values().long())
            if with_weights:
                weights.append(_weights(jt, config))
    if validate_ids:
        problem = _check_ids(values, configs)
        if problem is not None:
            return SourceBatch(features.stride(), [], [], None, problem)
    return SourceBatch(features.stride(), lengths, values, weights if with_weights else None)


def _check(
    features: KeyedJaggedTensor,
    configs: Sequence[BaseEmbeddingConfig],
    weighted: bool,
    device: torch.device,
) -> str | None:
    expected = [f for c in configs for f in c.feature_names]
    keys = features.keys()
    missing = [f for f in expected if f not in keys]
    if missing:  # keys the module does not read are ignored, as in TorchRec
        return (
            f"the KeyedJaggedTensor lacks the module's features {missing} (it has {keys}). "
            f"The module looks up {expected}"
        )
    if features.variable_stride_per_key():
        return f"a sharded collection needs one batch size for all keys, got {features.stride_per_key()}"
    if weighted and features.weights_or_none() is None:
        return "this collection is weighted but the KJT has no weights"
    where = features.values().device
    if where != device:
        return (
            f"the KeyedJaggedTensor is on {where} but the sharded collection computes on "
            f"{device}; move the batch there first (kjt.to({str(device)!r}, non_blocking=True); "
            "TrainPipelineSparseDist does it for you)"
        )
    return None


def _check_ids(values: list[torch.Tensor], configs: Sequence[BaseEmbeddingConfig]) -> str | None:
    """Every id in ``[0, num_embeddings)`` of its table; name the first that isn't. One read of
    the device for the whole batch (see [Note: host-side sizes])."""
    limits = [c.num_embeddings for c in configs for _ in c.feature_names]
    names = [(f, c.name) for c in configs for f in c.feature_names]
    bad = [(ids < 0) | (ids >= limit) for ids, limit in zip(values, limits)]
    if not bad:
        return None
    flags = torch.stack([b.any() for b in bad]).tolist()
    if not any(flags):
        return None
    index = flags.index(True)
    ids, (feature, table) = values[index], names[index]
    position = int(bad[index].nonzero()[0, 0])
    return (
        f"feature '{feature}' (table '{table}'): id {int(ids[position])} at position "
        f"{position} of the feature's values is out of range: ids must satisfy 0 <= id < "
        f"num_embeddings = {limits[index]}"
    )


def _weights(jt, config: BaseEmbeddingConfig) -> torch.Tensor:
    """``[N]`` float weights of the feature's ids: its own (or 1), MEAN folded in."""
    weights = jt.weights_or_none()
    weights = None if weights is None else weights.float()
    num_ids = jt.values().numel()
    if getattr(config, "pooling", PoolingType.SUM) == PoolingType.MEAN:
        return mean_as_weights(jt.lengths(), weights, num_ids=num_ids)
    if weights is None:
        return torch.ones(num_ids, device=jt.values().device)
    return weights
