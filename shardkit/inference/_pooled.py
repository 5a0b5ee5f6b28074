"""The pooled rows of sharded quantized serving, grouped by the dtype they travel in.

[Note: pooled rows on the wire]
A table-wise table's pooled rows are final: its rank pools them as the unsharded module does
(float32 sums cast to the module's output dtype) and sends them in that dtype, so a
half-output collection sends half the bytes of float32. A row-wise block's rows are partial
sums that `combine` adds in float32 before one cast ([Note: row-wise quantized serving]), so
they travel in float32. Each dtype is one group: its tables on each rank (one local quantized
collection per group, pooling in the group's dtype) and one all-to-all of its rows. Every rank
builds the same groups, in the same order, from the configs alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from shardkit.quant import EmbeddingBagCollection as QuantEmbeddingBagCollection

__all__ = ["PooledGroup", "pooled_groups"]


@dataclasses.dataclass(frozen=True)
class PooledGroup:
    """The tables whose pooled rows travel in ``dtype``: ``features_of[r]`` the features rank
    ``r`` looks up, ``local`` this rank's tables of the group (None if it has none)."""

    dtype: torch.dtype
    features_of: list[list[str]]
    local: QuantEmbeddingBagCollection | None


def pooled_groups(
    configs: Sequence[Any],
    *,
    placement: Mapping[str, int],
    partial: set[str],
    output_dtype: torch.dtype,
    state: Mapping[str, torch.Tensor],
    weighted: bool,
    rank: int,
    world: int,
) -> list[PooledGroup]:
    """One `PooledGroup` per wire dtype (see [Note: pooled rows on the wire]): the tables in
    ``partial`` (row-wise blocks) in float32, the others in ``output_dtype``; one group when
    both are float32. ``state`` holds this rank's tables' stored rows."""

    def dtype_of(config: Any) -> torch.dtype:
        return torch.float32 if config.name in partial else output_dtype

    groups = []
    for dtype in dict.fromkeys(dtype_of(c) for c in configs):  # in first-appearance order
        members = [c for c in configs if dtype_of(c) == dtype]
        features_of = [
            [f for c in members if placement[c.name] == r for f in c.feature_names]
            for r in range(world)
        ]
        mine = [c for c in members if placement[c.name] == rank]
        local = _subset(state, mine, weighted, dtype) if mine else None
        groups.append(PooledGroup(dtype, features_of, local))
    return groups


def _subset(
    state: Mapping[str, torch.Tensor], configs: list[Any], weighted: bool, dtype: torch.dtype
) -> QuantEmbeddingBagCollection:
    """The tables ``configs`` of ``state``, pooling in float32 and giving ``dtype``."""
    local = QuantEmbeddingBagCollection(configs, weighted, device="cpu", output_dtype=dtype)
    names = {c.name for c in configs}
    local.load_state_dict({k: v for k, v in state.items() if k.split(".")[1] in names})
    return local
