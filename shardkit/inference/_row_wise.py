"""Row-wise sharded quantized tables: each rank holds a block of a large table's stored rows.

[Note: row-wise quantized serving]
A row-wise table ``t`` of ``R`` rows is cut into ``W`` blocks of ``ceil(R / W)`` rows (the last
shorter), block ``r`` on rank ``r``. Each block is served as a table of its own, ``t@r`` (a view
of the stored rows ``[start_r, start_r + rows_r)``: the quantized formats keep each row's scale
and bias in the row, so a block of rows is a table), with SUM pooling and float32 output, and
each of the table's features ``f`` becomes the features ``f@0 .. f@{W-1}``:

1. before sending, each bag of ``f`` is split by block (`bucketize`): bag ``b`` of ``f@r``
   holds the ids of bag ``b`` of ``f`` that fall in block ``r``, minus ``start_r``, in their
   order (and their per-id weights);
2. the table-wise path ([Note: sharded quantized serving]) sends ``f@r`` to rank ``r``, looks
   it up there and sends the pooled partial sums ``[B, D]`` back;
3. `combine` adds the ``W`` partial sums of each bag in float32, in rank order, divides by the
   bag's length for MEAN pooling (0 for an empty bag), and casts to the module's output dtype.

So a bag's sum is the same float32 products added in another order than the unsharded module
adds them: equal up to float32 summation order (at most ``(L - 1) * eps`` of the sum of the
terms' magnitudes for a bag of ``L`` ids), then rounded to the output dtype once.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from shardkit.kernels import KernelPath
from shardkit.modules import PoolingType
from shardkit.sharding import bucket_rows
from shardkit.sparse import JaggedTensor, KeyedTensor
from shardkit.types import split_evenly

__all__ = ["RowBlocks", "block_state", "bucketize", "combine", "place_by_budget", "split_tables"]


@dataclasses.dataclass(frozen=True)
class RowBlocks:
    """The blocks of one row-wise table: block ``r`` is rows ``[starts[r], starts[r + 1])``."""

    table: str
    starts: tuple[int, ...]  # [W + 1]
    features: tuple[str, ...]
    mean: bool

    def part(self, name: str, rank: int) -> str:
        """The name of ``name``'s (a table's or feature's) part on ``rank``."""
        return f"{name}@{rank}"


def split_tables(
    configs: Sequence[Any], row_wise: Sequence[str], world: int
) -> tuple[list[Any], dict[str, RowBlocks]]:
    """The configs with each ``row_wise`` table replaced by its ``world`` blocks (named
    ``t@r``, features ``f@r``, SUM pooling), in place; and ``{table: RowBlocks}``."""
    out, blocks = [], {}
    for config in configs:
        if config.name not in row_wise:
            out.append(config)
            continue
        rows = config.num_embeddings
        if rows < world:
            raise ValueError(
                f"row_wise sharding of quantized table {config.name!r} needs num_embeddings "
                f"({rows}) >= ranks ({world}); place it table-wise"
            )
        starts = tuple(itertools.accumulate(split_evenly(rows, world), initial=0))
        mean = getattr(config, "pooling", PoolingType.SUM) == PoolingType.MEAN
        block = RowBlocks(config.name, starts, tuple(config.feature_names), mean)
        blocks[config.name] = block
        for r in range(world):
            out.append(dataclasses.replace(
                config, name=block.part(config.name, r), num_embeddings=starts[r + 1] - starts[r],
                feature_names=[block.part(f, r) for f in config.feature_names],
                pooling=PoolingType.SUM,
            ))  # fmt: skip
    return out, blocks


def block_state(state: Mapping[str, torch.Tensor], blocks: Mapping[str, RowBlocks], rank: int):
    """``state`` (an unsharded quantized collection's) with each row-wise table's weight
    replaced by this rank's block of stored rows, under the block's name."""
    out = {}
    for key, value in state.items():
        prefix, table, rest = key.split(".", 2)
        if table not in blocks:
            out[key] = value
            continue
        block = blocks[table]
        rows = value[block.starts[rank] : block.starts[rank + 1]]
        out[f"{prefix}.{block.part(table, rank)}.{rest}"] = rows
    return out


def bucketize(by_key: dict[str, JaggedTensor], blocks: Mapping[str, RowBlocks]) -> None:
    """Replace, in ``by_key``, each row-wise feature ``f`` by its parts ``f@r`` (see
    [Note: row-wise quantized serving], step 1), grouped by the training input dist's
    `bucket_rows` (a counting partition for few ranks, a sort for many; always the eager
    form, so that a serving process never builds the compiled kernel for it)."""
    for block in blocks.values():
        num_blocks = len(block.starts) - 1
        for f in block.features:
            bags = by_key.pop(f)
            shard_lengths, rebased, weights, _ = bucket_rows(
                bags.values().to(torch.int64),  # [N]
                lengths=bags.lengths().to(torch.int64),  # [B]
                weights=bags.weights_or_none(),
                row_starts=block.starts[:-1],
                kernel=KernelPath.EAGER,  # serving never waits on a first-use C++ build
            )  # shard_lengths [W, B]; rebased [N], grouped by block
            counts = shard_lengths.sum(dim=1).tolist()  # one host read per feature
            values = rebased.split(counts)
            parts = [None] * num_blocks if weights is None else weights.split(counts)
            for r in range(num_blocks):
                by_key[block.part(f, r)] = JaggedTensor(
                    values=values[r], lengths=shard_lengths[r], weights=parts[r]
                )


def combine(
    by_key: Mapping[str, torch.Tensor],
    features: Sequence[str],
    dims: Sequence[int],
    lengths: Mapping[str, torch.Tensor],
    blocks: Mapping[str, RowBlocks],
    output_dtype: torch.dtype,
) -> KeyedTensor:
    """``[B, sum(dims)]`` in ``features``' order from ``by_key`` (each feature's ``[B, D]``
    pooled rows: a table-wise feature's in ``output_dtype``, a row-wise one's parts in
    float32): see [Note: row-wise quantized serving], step 3. ``lengths``: each row-wise
    feature's bag lengths ``[B]`` (for MEAN pooling)."""
    of_feature = {f: b for b in blocks.values() for f in b.features}
    columns = []
    for f in features:
        block = of_feature.get(f)
        if block is None:
            columns.append(by_key[f].to(output_dtype))
            continue
        parts = [by_key[block.part(f, r)] for r in range(len(block.starts) - 1)]
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        if block.mean:
            total = total / lengths[f].clamp(min=1).unsqueeze(1).to(total.dtype)
        columns.append(total.to(output_dtype))  # cast once, after the float32 sum
    values = torch.cat(columns, dim=1)
    return KeyedTensor(list(features), list(dims), values)


def place_by_budget(
    table_bytes: Mapping[str, int], world: int, budget_bytes: int | None
) -> tuple[dict[str, int], list[str]]:
    """``({table: rank}, row-wise tables)``: tables over ``budget_bytes`` (one rank's share)
    go row-wise; the others are dealt table-wise, largest first, each onto the rank holding the
    fewest bytes (row-wise blocks counted)."""
    row_wise = [t for t, n in table_bytes.items() if budget_bytes is not None and n > budget_bytes]
    load = [sum(-(-table_bytes[t] // world) for t in row_wise)] * world
    placement = {}
    rest = sorted((t for t in table_bytes if t not in row_wise), key=lambda t: -table_bytes[t])
    for table in rest:
        rank = load.index(min(load))
        placement[table] = rank
        load[rank] += table_bytes[table]
    return placement, row_wise
