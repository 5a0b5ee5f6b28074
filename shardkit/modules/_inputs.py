"""From a KeyedJaggedTensor to the inputs of each batched group.

[Note: input plan]
A collection fixes an order of its features: group by group (see `_tables`), in the module's
feature order within a group. A KJT whose keys come in that order is used as is; otherwise it is
permuted once (one gather of values). Then each group's ids, lengths and weights are contiguous
slices, shifted by the first row of their table in the group's buffer. The plan is cached per key
order, so a steady stream of batches pays for it once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shardkit import kernels
from shardkit.modules._tables import TableGroup, is_mean
from shardkit.modules.embedding_configs import BaseEmbeddingConfig
from shardkit.sparse import KeyedJaggedTensor

__all__ = [
    "GroupInput",
    "InputPlan",
    "check_ids",
    "group_input",
    "kernel_input",
    "make_plan",
    "mean_as_weights",
]


@dataclass(frozen=True)
class GroupFeatures:
    """The features of one group, in the plan's order."""

    first_key: int  # index of its first feature in the plan's key order
    num_keys: int
    row_base_per_key: tuple[int, ...]  # first row of each feature's table in the group buffer
    mean_per_key: tuple[bool, ...]


@dataclass(frozen=True)
class InputPlan:
    keys: tuple[str, ...]  # the plan's key order (group-major)
    permute: list[int] | None  # KJT key indices to gather, None when already in order
    groups: tuple[GroupFeatures, ...]
    num_embeddings_per_key: tuple[int, ...]
    table_per_key: tuple[str, ...]


@dataclass(frozen=True)
class GroupInput:
    ids: torch.Tensor  # [N_g] int64 rows of the group buffer
    offsets: torch.Tensor  # [num_keys * B + 1] bag boundaries
    lengths: torch.Tensor  # [num_keys * B]
    per_sample_weights: torch.Tensor | None  # [N_g]
    length_per_key: list[int]


def make_plan(
    kjt_keys: Sequence[str],
    configs: Sequence[BaseEmbeddingConfig],
    groups: Sequence[TableGroup],
) -> InputPlan:
    """The key order of the module's groups, and how to get there from ``kjt_keys``."""
    expected = [f for c in configs for f in c.feature_names]
    missing = [f for f in expected if f not in kjt_keys]
    if missing:  # keys the module does not read are ignored, as in TorchRec
        raise ValueError(
            f"the KeyedJaggedTensor lacks the module's features {missing} (it has "
            f"{list(kjt_keys)}). The module looks up {expected}; build the KJT with those keys "
            "(any order; other keys are ignored)"
        )
    order: list[str] = []
    spec = []
    num_embeddings, tables = [], []
    for group in groups:
        first = len(order)
        bases, means = [], []
        for position, index in enumerate(group.table_indices):
            config = configs[index]
            for feature in config.feature_names:
                order.append(feature)
                bases.append(group.tables.row_starts[position])
                means.append(is_mean(config))
                num_embeddings.append(config.num_embeddings)
                tables.append(config.name)
        spec.append(GroupFeatures(first, len(order) - first, tuple(bases), tuple(means)))
    index_of = {k: i for i, k in enumerate(kjt_keys)}
    gather = [index_of[k] for k in order]
    return InputPlan(
        keys=tuple(order),
        permute=None if gather == list(range(len(kjt_keys))) else gather,
        groups=tuple(spec),
        num_embeddings_per_key=tuple(num_embeddings),
        table_per_key=tuple(tables),
    )


def group_input(kjt: KeyedJaggedTensor, features: GroupFeatures) -> GroupInput:
    """Slice ``kjt`` (already in plan order) to one group's kernel inputs."""
    stride = kjt.stride()
    first, last = features.first_key, features.first_key + features.num_keys
    offset_per_key = kjt.offset_per_key()
    length_per_key = kjt.length_per_key()[first:last]
    lo, hi = offset_per_key[first], offset_per_key[last]
    lengths = kjt.lengths()[first * stride : last * stride]
    ids, offsets = kernel_input(
        kjt.values()[lo:hi], lengths, features.row_base_per_key, length_per_key
    )
    weights = kjt.weights_or_none()
    weights = None if weights is None else weights[lo:hi]
    if any(features.mean_per_key):
        mean = _to_device(features.mean_per_key, torch.bool, lengths.device)
        mean = mean.repeat_interleave(stride)
        weights = mean_as_weights(lengths, weights, num_ids=hi - lo, mean=mean)
    return GroupInput(ids, offsets, lengths, weights, length_per_key)


def kernel_input(
    ids: torch.Tensor,
    lengths: torch.Tensor,
    row_bases: Sequence[int],
    ids_per_segment: Sequence[int] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batched kernel's ``(ids, offsets)`` (see `lookup`) from ids of single tables.

    Args:
        ids: ``[N]`` int32 or int64 rows of their own tables, in segments: the ids of one table each
            (one feature, or one feature's ids from one rank).
        lengths: ``[num_bags]`` ids per bag, bags in the order of ``ids``.
        row_bases: ``[S]`` first row of each segment's table in the stack (`BatchedTables`).
        ids_per_segment: ``[S]`` ids in each segment (they add up to ``N``).

    Returns:
        ``ids`` ``[N]`` int64, shifted to rows of the stack (a new tensor whenever shifted), and bag boundaries ``[num_bags + 1]``.
    """
    if not any(row_bases):
        ids = ids.long()
    elif isinstance(ids_per_segment, torch.Tensor):
        bases = _to_device(row_bases, torch.int64, ids.device)
        counts = ids_per_segment.to(ids.device)
        ids = ids.long() + torch.repeat_interleave(bases, counts, output_size=ids.numel())
    elif _shift_compiled(ids, row_bases, ids_per_segment):
        ids = kernels.shift_ids(ids, list(row_bases), list(ids_per_segment))
    else:
        # one pass, segment by segment: each segment's ids are copied or shifted straight into
        # the new tensor (no index, and no copy of the whole then a second pass to shift it)
        source, ids = ids, torch.empty(ids.shape, dtype=torch.int64, device=ids.device)
        start = 0
        for base, count in zip(row_bases, ids_per_segment):
            piece, out = source[start : start + count], ids[start : start + count]
            if base and source.dtype == torch.int64:
                torch.add(piece, base, out=out)
            else:  # int32 ids: widened first (an int32 add would wrap past 2**31 rows)
                out.copy_(piece)
                if base:
                    out.add_(base)
            start += count
        if start < source.numel():  # ids past the segments (none when they add up to N)
            ids[start:].copy_(source[start:])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return ids, offsets


def _shift_compiled(ids: torch.Tensor, row_bases: Sequence[int], counts: Sequence[int]) -> bool:
    """Whether the compiled operator shifts these ids (the loop below is its spec): CPU ids of
    int64 or int32, a count per base, outside torch.compile's tracing, and the compiled kernel
    in effect (see [Note: the ids' shift in one pass] in shardkit/kernels/csrc/buckets.cpp)."""
    return (
        ids.device.type == "cpu"
        and ids.dtype in (torch.int64, torch.int32)
        and len(row_bases) == len(counts)
        and not torch.compiler.is_compiling()
        and kernels.kernel_path() == kernels.KernelPath.COMPILED
    )


def _to_device(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on ``device``. ``non_blocking``: from host memory a GPU copy need not
    wait for the kernels already queued (a blocking one would), and the list is staged before
    the call returns, so it is safe."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def mean_as_weights(
    lengths: torch.Tensor,
    weights: torch.Tensor | None,
    *,
    num_ids: int,
    mean: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-id weights that make SUM pooling compute MEAN: each id of a MEAN bag weighted by
    1 / (its bag's length), times its own weight.

    Args:
        lengths: ``[num_bags]`` ids per bag.
        weights: ``[N]`` per-id weights, or None (all 1).
        num_ids: ``N``, the sum of ``lengths`` (known to the caller without a device sync).
        mean: ``[num_bags]`` bool, the bags pooled by MEAN (None: all of them).

    Returns:
        ``[N]`` float weights.
    """
    scale = 1.0 / lengths.clamp(min=1).float()
    if mean is not None:
        scale = torch.where(mean, scale, torch.ones_like(scale))
    per_id = torch.repeat_interleave(scale, lengths, output_size=num_ids)
    return per_id if weights is None else weights * per_id


def check_ids(kjt: KeyedJaggedTensor, plan: InputPlan) -> None:
    """Every id of key k must be in ``[0, num_embeddings of k's table)``; name the first that isn't."""
    values = kjt.values()
    offsets = kjt.offset_per_key()
    limits = plan.num_embeddings_per_key
    # Keys with one limit next to each other in values (a table's features, tables of one size;
    # keys with no ids between them) are one run: one pass per run, no [N] tensor of limits, one
    # host read for all runs (a GPU syncs once).
    runs: list[list[int]] = []  # [first key, end key), keys with ids, one limit
    for k in range(len(offsets) - 1):
        if offsets[k + 1] == offsets[k]:
            continue
        if runs and limits[runs[-1][0]] == limits[k]:
            runs[-1][1] = k + 1
        else:
            runs.append([k, k + 1])
    if not runs:
        return
    bounds = torch.stack(
        [torch.stack(torch.aminmax(values[offsets[a] : offsets[b]])) for a, b in runs]
    ).tolist()
    for (first, end), (low, high) in zip(runs, bounds):
        if low >= 0 and high < limits[first]:
            continue
        for key in range(first, end):  # the run's first key holding an id out of range
            _check_key_ids(values[offsets[key] : offsets[key + 1]], key, plan)


def _check_key_ids(ids: torch.Tensor, key: int, plan: InputPlan) -> None:
    """Raise, naming the first of ``ids`` (key ``key``'s) outside its table, if one is."""
    limit = plan.num_embeddings_per_key[key]
    outside = (ids < 0) | (ids >= limit)
    if ids.numel() and bool(outside.any()):
        position = int(outside.nonzero()[0, 0])
        raise ValueError(
            f"feature '{plan.keys[key]}' (table '{plan.table_per_key[key]}'): id "
            f"{int(ids[position])} at position {position} of the feature's values is "
            f"out of range: ids must satisfy 0 <= id < num_embeddings = {limit}. Map ids into "
            "range (e.g. id % num_embeddings), or pass validate_ids=False to skip this check"
        )
