"""This rank's KJT, checked and split per feature, ready for the input exchange."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardkit.modules import (
    BaseEmbeddingConfig,
    PoolingType,
    expand_variable_batch,
    mean_as_weights,
)
from shardkit.sharding._dist._input import SourceBatch
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["expanded_features", "source_batch", "variable_batch_inverse"]


def source_batch(
    features: KeyedJaggedTensor,
    configs: Sequence[BaseEmbeddingConfig],
    *,
    weighted: bool,
    with_weights: bool,
    validate_ids: bool,
    device: torch.device,
    inverse: torch.Tensor | str | None = None,
    expanded: KeyedJaggedTensor | None = None,
) -> SourceBatch:
    """Per feature (module order): lengths, int64 ids and float weights (MEAN folded in).

    Problems are returned in ``error`` rather than raised, so that this rank still takes part in
    the header exchange and all ranks raise together (see [Note: input exchange]).

    A variable batch (VBE) needs ``inverse``, from `variable_batch_inverse`: its features are
    sent deduplicated, with their own ``strides``, except those in ``expanded`` (the
    data-parallel ones, looked up locally, already expanded to the full batch).
    """
    if isinstance(inverse, str):  # the inverse indices were refused
        return SourceBatch(features.stride() if features.keys() else 0, [], [], None, inverse)
    error = _check(features, configs, weighted, device, variable=inverse is not None)
    if error is None and validate_ids:
        try:
            features.validate()
        except ValueError as exc:
            error = str(exc)
    if error is not None:
        return SourceBatch(features.stride() if features.keys() else 0, [], [], None, error)
    by_key = features.to_dict()
    if inverse is not None and expanded is not None:
        by_key.update(expanded.to_dict())
    lengths, values, weights = [], [], []
    for config in configs:
        for feature in config.feature_names:
            jt = by_key[feature]
            lengths.append(jt.lengths().long())
            values.append(jt.values().long())
            if with_weights:
                weights.append(_weights(jt, config))
    size = features.stride() if inverse is None else inverse.shape[1]
    if inverse is not None:
        local = set() if expanded is None else set(expanded.keys())
        deduplicated = [f not in local for c in configs for f in c.feature_names]
        _drop_unused_bags(lengths, values, weights, inverse, deduplicated)
    if validate_ids:
        problem = _check_ids(values, configs)
        if problem is not None:
            return SourceBatch(size, [], [], None, problem)
    strides = None if inverse is None else [n.numel() for n in lengths]
    return SourceBatch(size, lengths, values, weights if with_weights else None, strides=strides)


# [Note: bags no example uses]
# A variable batch may carry a deduplicated bag that no example's inverse index picks. The
# unsharded module expands first, so it never looks that bag up; were it sent, its rows would
# get a zero gradient, which Adam's moments or weight decay still turn into an update. The
# source empties such bags (length 0, ids and weights dropped) before the exchange: one device
# read per step finds them, and a batch without any pays nothing more.


def _drop_unused_bags(lengths, values, weights, inverse, deduplicated) -> None:
    """Empty, in place, the bags of the ``deduplicated`` features (lists per feature, module
    order) that no example's ``inverse`` (``[F, B]``) picks. See [Note: bags no example uses]."""
    chosen = [f for f, dedup in enumerate(deduplicated) if dedup and lengths[f].numel()]
    if not chosen:
        return
    used = [  # (no bincount: on a GPU it reads the largest index back to the host)
        torch.zeros(lengths[f].numel(), dtype=torch.bool, device=inverse.device).index_fill_(
            0, inverse[f].long(), True
        )
        for f in chosen
    ]
    unused = torch.stack([(~u).sum() for u in used]).tolist()  # one read of the device
    for f, keep, n in zip(chosen, used, unused):
        if not n:
            continue
        kept_ids = torch.repeat_interleave(keep, lengths[f], output_size=values[f].numel())
        values[f] = values[f][kept_ids]
        if weights:
            weights[f] = weights[f][kept_ids]
        lengths[f] = lengths[f] * keep


def variable_batch_inverse(
    features: KeyedJaggedTensor, feature_names: Sequence[str]
) -> torch.Tensor | str | None:
    """``[F, B]`` int64: for each of ``feature_names`` the bag of each example of a variable
    batch (VBE); None for a plain batch (or one without inverse indices, which `source_batch`
    refuses); a message where the inverse indices are refused. Reads the device once."""
    found = features.inverse_indices_or_none()
    if not features.variable_stride_per_key() or found is None:
        return None
    keys, index = found
    missing = [f for f in feature_names if f not in keys]
    if missing or index.dim() != 2 or index.shape[0] != len(keys):
        return (
            f"inverse_indices must be (keys, [len(keys), B]) with a row for every feature the "
            f"collection looks up; got keys {list(keys)}, shape {list(index.shape)}, missing "
            f"{missing}"
        )
    rows = index[[list(keys).index(f) for f in feature_names]].long()  # [F, B]
    strides = dict(zip(features.keys(), features.stride_per_key()))
    limits = [strides.get(f, 0) for f in feature_names]
    if not rows.numel():
        return rows
    low, high = torch.stack([rows.amin(1), rows.amax(1)]).tolist()  # one read of the device
    if min(low) < 0 or any(h >= n for h, n in zip(high, limits)):
        return (
            f"inverse_indices of features {list(feature_names)} must pick a bag of their own "
            f"key (0 <= index < bags {limits}); got indices from {low} to {high} per feature"
        )
    return rows


def _check(
    features: KeyedJaggedTensor,
    configs: Sequence[BaseEmbeddingConfig],
    weighted: bool,
    device: torch.device,
    *,
    variable: bool = False,
) -> str | None:
    expected = [f for c in configs for f in c.feature_names]
    keys = features.keys()
    missing = [f for f in expected if f not in keys]
    if missing:  # keys the module does not read are ignored, as in TorchRec
        return (
            f"the KeyedJaggedTensor lacks the module's features {missing} (it has {keys}). "
            f"The module looks up {expected}"
        )
    if features.variable_stride_per_key() and not variable:
        return (
            "a sharded collection needs one batch size for all keys, or inverse_indices "
            f"saying which bag each example uses; got {features.stride_per_key()}"
        )
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
    present = [i for i, ids in enumerate(values) if ids.numel()]
    if not present:
        return None
    # Each feature's smallest and largest id (one pass each); where they are in range, all are.
    bounds = torch.stack([t for i in present for t in values[i].aminmax()]).tolist()
    lows, highs = bounds[0::2], bounds[1::2]
    flags = [low < 0 or high >= limits[i] for i, low, high in zip(present, lows, highs)]
    if not any(flags):
        return None
    index = present[flags.index(True)]
    ids, (feature, table) = values[index], names[index]
    position = int(((ids < 0) | (ids >= limits[index])).nonzero()[0, 0])
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


def expanded_features(
    features: KeyedJaggedTensor, inverse: torch.Tensor | str | None, names: Sequence[str]
) -> KeyedJaggedTensor | None:
    """A variable batch's features ``names`` (the data-parallel ones, looked up where they
    are) expanded to the full batch; None for a plain batch, no such features, or input
    `source_batch` refuses in step with the other ranks."""
    if not isinstance(inverse, torch.Tensor) or not names:
        return None
    if any(f not in features.keys() for f in names):  # noqa: SIM118 (a KJT)
        return None
    return expand_variable_batch(features, keys=list(dict.fromkeys(names)))
