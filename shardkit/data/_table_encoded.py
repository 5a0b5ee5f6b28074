"""Encoded table rows as tensors (`EncodedRows`), made from checked columns by a fitted schema's
vocabularies and transforms, vectorized (`ColumnEncoder`), and the vectorized shuffle buffer.

[Note: encoded rows]
``EncodedRows`` holds ``n`` rows: labels float32 ``[n]``, dense float32 ``[n, D]``, the
categorical features' ids as one int64 matrix ``single [n, S]`` (one id per row and feature,
-1 for an empty bag: a missing value), and per multi-hot feature the rows' ids flattened
(int64) with their lengths (int64 ``[n]``), e.g. two rows with genres ``Drama|War`` and
``Comedy``: ids ``[3, 7, 1]``, lengths ``[2, 1]``. ``layout`` says where each feature (in the
fitted schema's key order) lives: ``j >= 0`` column ``j`` of ``single``, ``~k`` multi-hot
feature ``k``. Taking, slicing and joining rows is then one tensor op for all the categorical
features together, whatever their number (a Criteo-shaped table has 26), instead of one to
five ops per feature. A batch is ``B`` rows: its KJT's values are the features' ids one after
another (key-major) and its lengths the features' lengths. Ids: a vocabulary table maps each
value through a hash table of the vocabulary built once (`Vocabulary`: row ``k + 1`` for
``vocabulary[k]``, 0 for any other value), a hashed table hashes each distinct value of a
piece once (`hash_id`). Dense values: ``log1p(max(x, 0))``, then standardized or bucketized
(``torch.bucketize(right=True)`` is ``bisect_right``), in float64 and then rounded to
float32, as the row encoder does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardkit.data._batch import Batch
from shardkit.data._hash import mix_tensor
from shardkit.data._table_columns import Columns, dictionary_parts
from shardkit.data._table_rows import hash_id
from shardkit.data._table_schema import ColumnType
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["ColumnEncoder", "EncodedRows", "Vocabulary", "feature_layout", "shuffle_buffer",
           "string_hashes"]  # fmt: skip


def feature_layout(fitted: Any) -> tuple[int, ...]:
    """Where each feature of a `FittedSchema` lives in `EncodedRows` (see [Note: encoded
    rows]): categorical features are the columns of ``single`` in key order, multi-hot ones
    ``~k``."""
    types = {c.name: c.type for c in fitted.schema.columns}
    layout, singles, multis = [], 0, 0
    for key in fitted.keys:
        if types[key] is ColumnType.MULTI_HOT:
            layout.append(~multis)
            multis += 1
        else:
            layout.append(singles)
            singles += 1
    return tuple(layout)


@dataclass(frozen=True, eq=False)
class EncodedRows:
    """``n`` encoded rows (see [Note: encoded rows])."""

    labels: torch.Tensor
    dense: torch.Tensor
    single: torch.Tensor
    ids: tuple[torch.Tensor, ...]
    lengths: tuple[torch.Tensor, ...]
    layout: tuple[int, ...]

    def __len__(self) -> int:
        return self.labels.shape[0]

    @staticmethod
    def empty(num_dense: int, layout: tuple[int, ...], rows: int = 0) -> EncodedRows:
        """``rows`` rows with no ids, dense zeros and label 0 (padding)."""
        singles = sum(1 for j in layout if j >= 0)
        multis = len(layout) - singles
        none = torch.zeros(0, dtype=torch.int64)
        lengths = torch.zeros(rows, dtype=torch.int64)
        return EncodedRows(torch.zeros(rows), torch.zeros(rows, num_dense),
                           torch.full((rows, singles), -1, dtype=torch.int64),
                           (none,) * multis, (lengths,) * multis, layout)  # fmt: skip

    @staticmethod
    def cat(parts: Sequence[EncodedRows]) -> EncodedRows:
        if len(parts) == 1:
            return parts[0]
        features = range(len(parts[0].ids))
        return EncodedRows(
            torch.cat([p.labels for p in parts]),
            torch.cat([p.dense for p in parts]),
            torch.cat([p.single for p in parts]),
            tuple(torch.cat([p.ids[f] for p in parts]) for f in features),
            tuple(torch.cat([p.lengths[f] for p in parts]) for f in features),
            parts[0].layout,
        )

    def slice(self, start: int, stop: int) -> EncodedRows:
        """Rows ``start .. stop - 1``."""
        if start == 0 and stop >= len(self):
            return self
        ids, lengths = [], []
        for values, counts in zip(self.ids, self.lengths):
            first = int(counts[:start].sum()) if start else 0
            lengths.append(counts[start:stop])
            ids.append(values[first : first + int(lengths[-1].sum())])
        return EncodedRows(self.labels[start:stop], self.dense[start:stop],
                           self.single[start:stop], tuple(ids), tuple(lengths),
                           self.layout)  # fmt: skip

    def take(self, index: torch.Tensor) -> EncodedRows:
        """The rows ``index`` (int64 ``[m]``), in that order."""
        ids, lengths = [], []
        for values, counts in zip(self.ids, self.lengths):
            picked = counts.index_select(0, index)
            ends = torch.cumsum(counts, 0)
            starts = (ends - counts).index_select(0, index)
            new_ends = torch.cumsum(picked, 0)
            total = int(new_ends[-1]) if len(new_ends) else 0
            # each picked id's place in `values`: its row's start + its place in the row
            within = torch.arange(total) - torch.repeat_interleave(new_ends - picked, picked,
                                                                   output_size=total)  # fmt: skip
            place = torch.repeat_interleave(starts, picked, output_size=total) + within
            ids.append(values.index_select(0, place))
            lengths.append(picked)
        return EncodedRows(self.labels.index_select(0, index), self.dense.index_select(0, index),
                           self.single.index_select(0, index), tuple(ids), tuple(lengths),
                           self.layout)  # fmt: skip

    def batch(self, keys: Sequence[str], weights: torch.Tensor | None = None) -> Batch:
        """The rows as a `Batch` (dense ``[B, D]``, a key-major KJT, labels ``[B]``)."""
        values: list[torch.Tensor] = []
        lengths: list[torch.Tensor] = []
        n = len(self)
        by_key = self.single.t().contiguous().view(-1)  # [S * n]: key-major, as the KJT wants
        present = by_key >= 0
        layout, at = self.layout, 0
        while at < len(layout):
            first = layout[at]
            if first < 0:
                values.append(self.ids[~first])
                lengths.append(self.lengths[~first].to(torch.int32))
                at += 1
                continue
            last = at  # categorical features next to each other: taken together
            while last + 1 < len(layout) and layout[last + 1] == layout[last] + 1:
                last += 1
            count = last - at + 1
            block = by_key[first * n : (first + count) * n]
            mask = present[first * n : (first + count) * n]
            values.append(block if bool(mask.all()) else block.masked_select(mask))
            lengths.append(mask.to(torch.int32))
            at = last + 1
        none = torch.zeros(0, dtype=torch.int64)
        sparse = KeyedJaggedTensor(
            keys=list(keys),
            values=torch.cat(values) if values else none,
            lengths=torch.cat(lengths) if lengths else none.to(torch.int32),
            stride=n,
        )
        return Batch(dense_features=self.dense, sparse_features=sparse, labels=self.labels,
                     weights=weights)  # fmt: skip


class ColumnEncoder:
    """Checked columns -> `EncodedRows` with a fitted schema (see [Note: encoded rows])."""

    def __init__(self, fitted: Any) -> None:  # a FittedSchema
        import pyarrow as pa

        table_of = {f: t for t in fitted.tables for f in t.features}
        self.layout = feature_layout(fitted)
        self.keys = fitted.keys
        self.lookups: list[tuple[Any, int]] = []  # (Vocabulary or None, hashed rows)
        vocabularies: dict[str, Vocabulary] = {}
        for key in fitted.keys:
            table = table_of[key]
            if table.ids == "hash":
                self.lookups.append((None, table.num_embeddings))
            else:
                if table.name not in vocabularies:
                    vocabularies[table.name] = Vocabulary(
                        pa.array(list(table.vocabulary), pa.string())
                    )
                self.lookups.append((vocabularies[table.name], 0))
        dense = fitted.dense
        self.log1p = torch.tensor([d.log1p for d in dense], dtype=torch.bool)
        self.standard = [(j, d.mean, d.std) for j, d in enumerate(dense) if d.mean is not None]
        self.buckets = [(j, torch.tensor(d.boundaries, dtype=torch.float64),
                         1.0 / max(len(d.boundaries), 1))
                        for j, d in enumerate(dense) if d.boundaries is not None]  # fmt: skip

    def encode(self, columns: Columns) -> EncodedRows:
        n = len(columns)
        single = np.full((n, sum(1 for j in self.layout if j >= 0)), -1, dtype=np.int64)
        ids, lengths = [], []
        for key, j, (vocabulary, hashed), (values, counts) in zip(
            self.keys, self.layout, self.lookups, columns.bags
        ):
            parts = dictionary_parts(values)  # a multi-hot column's few distinct values
            distinct = values if parts is None else parts[0]
            found = _hashed(distinct, hashed) if hashed else vocabulary.rows(distinct)
            found = np.asarray(found, dtype=np.int64)
            if parts is not None:
                found = found[parts[1]]
            if j < 0:
                ids.append(torch.from_numpy(found))
                lengths.append(torch.from_numpy(counts))
            elif len(found) == n and bool((counts == 1).all()):
                single[:, j] = found
            elif len(found) and int(counts.max()) > 1:
                raise ValueError(f"column '{key}' holds lists (up to {int(counts.max())} values "
                                 "in a row) but is declared categorical, one value per row: "
                                 "declare it type = \"multi_hot\"")  # fmt: skip
            else:
                single[counts.astype(bool), j] = found
        dense = torch.from_numpy(columns.dense).clone()
        if bool(self.log1p.any()):
            dense[:, self.log1p] = torch.log1p(dense[:, self.log1p].clamp(min=0.0))
        for j, mean, std in self.standard:
            dense[:, j] = (dense[:, j] - mean) / std
        for j, bounds, scale in self.buckets:
            dense[:, j] = (
                torch.bucketize(dense[:, j].contiguous(), bounds, right=True).double() * scale
            )
        labels = torch.from_numpy(columns.labels).float()
        return EncodedRows(labels, dense.float(), torch.from_numpy(single), tuple(ids),
                           tuple(lengths), self.layout)  # fmt: skip


class Vocabulary:
    """Values -> rows of a vocabulary table (``vocabulary[k]`` -> ``k + 1``, others 0), with a
    hash table built once: each string's 64-bit hash (`string_hashes`), the vocabulary's sorted;
    a value's candidate row is found by binary search and kept if the strings are equal (so a
    collision can never map a value wrongly). Arrow's `index_in` would hash the whole
    vocabulary again for every piece. Long strings (over 64 bytes) use `index_in`."""

    def __init__(self, values: Any) -> None:
        import pyarrow as pa

        from shardkit.data._table_fit import packed_keys

        self.values = values
        # values of at most 8 bytes as 64-bit keys (`packed_keys`, one key per string): a
        # value whose bytes pack is found by its key alone, no hash and no string compare
        short = np.flatnonzero(np.diff(_string_offsets(values)) <= 8)
        keys = packed_keys(values.take(pa.array(short)), any_length=True) if len(short) else None
        self.keys: np.ndarray | None = None
        self.key_rows = np.zeros(0, dtype=np.int64)
        if keys is not None:
            order = np.argsort(keys)
            self.keys, self.key_rows = keys[order], short[order] + 1
        hashes = string_hashes(values)
        self.order: np.ndarray | None = None
        self.sorted = np.zeros(0, dtype=np.uint64)
        if hashes is not None:
            order = np.argsort(hashes, kind="stable")
            self.sorted = hashes[order]
            if not (len(order) > 1 and bool((self.sorted[1:] == self.sorted[:-1]).any())):
                self.order = order  # else two values share a hash: look up with index_in

    def rows(self, values: Any) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc

        from shardkit.data._table_fit import packed_keys

        if self.keys is not None and len(self.keys):
            keys = packed_keys(values)
            if keys is not None:
                at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
                return np.where(self.keys[at] == keys, self.key_rows[at], 0)
        order = self.order
        hashes = string_hashes(values) if order is not None and len(self.sorted) else None
        if hashes is None or order is None:
            if not len(self.values):
                return np.zeros(len(values), dtype=np.int64)
            return pc.index_in(values, value_set=self.values).fill_null(-1).to_numpy() + 1
        at = np.minimum(np.searchsorted(self.sorted, hashes), len(self.sorted) - 1)
        candidate = order[at]
        same = (self.sorted[at] == hashes) & np.asarray(
            pc.equal(values, self.values.take(pa.array(candidate))).fill_null(False)
        )
        return np.where(same, candidate + 1, 0).astype(np.int64)


def _string_offsets(values: Any) -> np.ndarray:
    """An Arrow string array's offsets ``[n + 1]``, int64."""
    _, offsets, _ = values.buffers()
    kind = np.int64 if str(values.type) == "large_string" else np.int32
    return np.frombuffer(offsets, dtype=kind)[
        values.offset : values.offset + len(values) + 1
    ].astype(np.int64)


def string_hashes(values: Any, longest: int = 64) -> np.ndarray | None:
    """A 64-bit hash of each string of an Arrow string array (its bytes and length),
    vectorized over positions; None when a string is longer than ``longest`` bytes."""
    _, offsets, data = values.buffers()
    kind = np.int64 if str(values.type) == "large_string" else np.int32
    at = np.frombuffer(offsets, dtype=kind)[values.offset : values.offset + len(values) + 1]
    at = at.astype(np.int64)
    lengths = np.diff(at)
    if len(lengths) and int(lengths.max()) > longest:
        return None
    text = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(1, np.uint8)
    text = text if len(text) else np.zeros(1, np.uint8)
    starts = at[:-1]
    with np.errstate(over="ignore"):
        h = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        for j in range(int(lengths.max()) if len(lengths) else 0):
            byte = text[np.minimum(starts + j, len(text) - 1)].astype(np.uint64)
            stepped = (h ^ byte) * np.uint64(0x100000001B3)  # FNV-1a's step, 64-bit
            stepped ^= stepped >> np.uint64(29)
            h = np.where(lengths > j, stepped, h)  # a string's hash: its own bytes only
        h ^= h >> np.uint64(31)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
    return h


def _hashed(values: Any, num_embeddings: int) -> np.ndarray:
    """`hash_id` of each value, computed once per distinct value."""
    import pyarrow.compute as pc

    distinct = pc.unique(values)
    rows = np.array([hash_id(v, num_embeddings) for v in distinct.to_pylist()], dtype=np.int64)
    return rows[pc.index_in(values, value_set=distinct).to_numpy()] if len(rows) else rows


def shuffle_buffer(chunks: Iterator[EncodedRows], size: int, seed: int) -> Iterator[EncodedRows]:
    """A shuffle buffer of ``size`` rows, vectorized: each part of ``m <= size`` rows read
    joins the buffer's rows and ``m`` random ones of the ``size + m`` leave (as a row-at-a-time
    buffer emits a random slot per row read); at the end the rest leave in random order. The
    order is a seeded hash (`mix_tensor`), the same on every torch release."""
    held: EncodedRows | None = None
    draw = 0

    def order(n: int) -> torch.Tensor:
        nonlocal draw
        draw += 1
        return torch.argsort(mix_tensor(seed, draw, torch.arange(n)))

    for chunk in chunks:
        for start in range(0, len(chunk), size):
            part = chunk.slice(start, min(start + size, len(chunk)))
            pool = part if held is None else EncodedRows.cat([held, part])
            if len(pool) <= size:
                held = pool
                continue
            shuffled = order(len(pool))
            yield pool.take(shuffled[: len(pool) - size])
            held = pool.take(shuffled[len(pool) - size :])
    if held is not None and len(held):
        yield held.take(order(len(held)))
