"""`Fitter`: learns a `FittedSchema` from the training rows of pieces, vectorized, in parts that
merge to the same result however the pieces were shared out among processes.

[Note: fitting in parts]
A process fits the pieces it read; the parts merge (`Fitter.merge`) into exactly what one
process reading every piece fits, for any world size:

- value counts (vocabularies) are integers: summed in any order, then sorted by decreasing
  count, ties by value (UTF-8 byte order, which is code point order). A piece's values of a
  table that all have one length of at most 8 bytes, without a NUL byte (ids such as Criteo's
  8 hex digits), are counted as 64-bit keys, each string's bytes big-endian and
  padded with zeros (`packed_keys`): one key per string and no other, ordered as the strings
  are, so counting and sorting the keys (NumPy's sort, about twice as fast here as hashing the
  strings) gives the same counts and the same order; the keys become strings again only when
  a table's counts meet a piece that has longer values, and for the vocabulary kept;
- dense statistics are exact: each process sums ``x`` and ``x * x`` exactly (`exact_sum`: the
  values are cut into slices on a grid of powers of 2 coarse enough that float64 adds any number
  of a piece's slices without rounding, so each slice's float64 sum is exact; a square is split
  into two float64 without error, Dekker's product), so the sums are the same in any order and
  any cut into pieces or files; the mean and the population standard deviation are computed
  from them in exact rational arithmetic and rounded once;
- a quantile sample (for fitted buckets) keeps the rows with the smallest 64-bit keys of
  ``(file, record key)``: the smallest of the smallest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from shardkit.data._hash import mix_tensor
from shardkit.data._table_columns import Columns, _offsets, dictionary_parts
from shardkit.data._table_fitted import DenseFit, FittedSchema, TableFit, table_order
from shardkit.data._table_schema import ColumnSpec, TableSchema

__all__ = ["Fitter", "decimal_ids", "exact_square_sum", "exact_square_sums", "exact_sum",
           "exact_sums", "packed_keys", "unpacked_strings"]  # fmt: skip

_SAMPLE = 65_536
_COMPACT = 1 << 22  # counted values held before they are summed per value
_HUGE = 2.0**900  # larger values are summed in Python (the vectorized sums' grid needs room)
_SPLIT = 134_217_729.0  # 2**27 + 1: Veltkamp's split of a float64 into two halves


def exact_sum(x: np.ndarray) -> Fraction:
    """The exact sum of finite float64 values (see [Note: fitting in parts])."""
    return exact_sums(x.reshape(-1, 1))[0]


def exact_square_sum(x: np.ndarray) -> Fraction:
    """The exact sum of the squares of finite float64 values."""
    return exact_square_sums(x.reshape(-1, 1))[0]


def exact_sums(x: np.ndarray) -> list[Fraction]:
    """The exact sum of each column of ``x`` (float64 ``[n, D]``, finite)."""
    return _exact(x, None if not x.size or np.abs(x).max() < _HUGE else np.abs(x) < _HUGE,
                  squares=False)  # fmt: skip


def exact_square_sums(x: np.ndarray) -> list[Fraction]:
    """The exact sum of the squares of each column of ``x``."""
    magnitude = np.abs(x)
    tiny = magnitude < 2.0**-400
    if not x.size or (magnitude.max() < 2.0**440 and np.count_nonzero(tiny) == np.count_nonzero(
            magnitude == 0)):  # fmt: skip
        return _exact(x, None, squares=True)
    return _exact(x, (magnitude == 0) | (~tiny & (magnitude < 2.0**440)), squares=True)


def _exact(x: np.ndarray, normal: np.ndarray | None, *, squares: bool) -> list[Fraction]:
    """The vectorized exact sums of ``normal`` values per column (None: all; of their squares:
    Dekker's ``x * x = p + e``, both float64, without error in that range) plus the others' in
    Python."""
    power = 2 if squares else 1
    totals = [Fraction()] * x.shape[1]
    if normal is not None:
        totals = [sum((Fraction(v) ** power for v in x[~normal[:, j], j].tolist()), Fraction())
                  for j in range(x.shape[1])]  # fmt: skip
        x = np.where(normal, x, 0.0)
    rest = np.array(x.T, order="C")  # [D, n]: each column's rounds run on contiguous memory
    parts = [rest]
    if squares:  # in place where it can: fresh temporaries cost page faults
        p = rest * rest
        high = _SPLIT * rest
        low = high - rest
        high -= low  # Veltkamp: high = c - (c - x)
        np.subtract(rest, high, out=low)
        error = high * high
        np.subtract(p, error, out=error)
        np.multiply(low, high, out=rest)
        error -= rest  # - low * high
        error -= rest  # - high * low (the same product)
        np.multiply(low, low, out=rest)
        rest -= error
        parts = [p, rest]
    for part in parts:
        totals = [t + s for t, s in zip(totals, _sliced_sums(part))]
    return totals


def _sliced_sums(rest: np.ndarray) -> list[Fraction]:
    """Per row the exact sum of ``rest`` (float64 ``[D, n]``, every ``|x| < 2**900``; used up).

    Each round cuts the rest ``r`` of a column (``|r| < 2**E``) into the part ``h`` on the grid
    of ``G = 2**g``, ``g = E + bits(n) - 51``: ``h = (r + C) - C`` with ``C = 1.5 * 2**(g + 52)``
    rounds ``r`` to a multiple of ``G`` exactly (``C + r`` lies in one binade, spaced ``G``), and
    ``r - h`` is exact too. Any sum of ``n`` such ``h`` is a multiple of ``G`` below
    ``2**(g + 53)``, so float64 adds them without rounding, in any order. Each round takes about
    ``51 - bits(n)`` bits off ``r``; a rest below 1 is scaled up by a power of 2 (exact) so the
    grid never reaches the subnormals. Rounds end when every rest is 0 (2-3 rounds for data of
    one scale, at most ~70 for a column spanning the whole float64 range)."""
    num_columns, n = rest.shape
    totals = [Fraction()] * num_columns
    if not n:
        return totals
    headroom = (n + 1).bit_length() + 1
    sliced = np.empty_like(rest)
    scale = np.zeros(num_columns, dtype=np.int64)  # rest = (x - summed) * 2**scale
    while True:
        largest = np.abs(rest, out=sliced).max(axis=1)
        live = np.flatnonzero(largest > 0)
        if not len(live):
            return totals
        _, top = np.frexp(largest)  # every |rest| < 2**top
        up = np.where(top < 0, -top, 0)
        scale, top = scale + up, top + up
        while up.any():  # powers of 2 up to 2**1000 at a time: exact, never infinite
            step = np.minimum(up, 1000)
            rest *= np.ldexp(1.0, step)[:, None]
            up = up - step
        grid = np.ldexp(1.5, top + headroom + 1)[:, None]  # C of each column: 1.5 * 2**(g + 52)
        np.add(rest, grid, out=sliced)  # in place: fresh temporaries cost page faults
        sliced -= grid
        rest -= sliced
        sums = sliced.sum(axis=1)
        for j in live.tolist():
            totals[j] += Fraction(float(sums[j])) / (1 << int(scale[j]))


class Fitter:
    """One process's part of the fit (see [Note: fitting in parts])."""

    def __init__(self, schema: TableSchema) -> None:
        import pyarrow as pa

        self.pa = pa
        self.schema = schema
        self.tables = table_order(schema)
        self.keys = tuple(c.name for columns in self.tables.values() for c in columns)
        self.counted = [name for name, cols in self.tables.items() if cols[0].ids != "hash"]
        self.table_of = [c.table for columns in self.tables.values() for c in columns]
        self.counts: dict[str, list[Any]] = {name: [] for name in self.counted}
        self.held = dict.fromkeys(self.counted, 0)
        self.summed = dict.fromkeys(self.counted, 0)
        self.log1p = np.array(["log1p" in c.transform for c in schema.dense], dtype=bool)
        self.sampled = [j for j, c in enumerate(schema.dense)
                        if "bucketize" in c.transform and c.boundaries is None]  # fmt: skip
        self.pieces: dict[tuple[int, ...], dict[str, Any]] = {}
        self.rows = self.positives = 0

    def piece(self, file: int, keys: np.ndarray, columns: Columns, train: np.ndarray
              ) -> dict[str, Any]:  # fmt: skip
        """What a piece's training rows (``train``: bool ``[n]``; ``keys`` the rows' record
        keys) add to the fit, for `accept` (this part runs in any thread)."""
        rows = int(train.sum())
        per_table: dict[str, list[tuple[Any, np.ndarray]]] = {}
        for table, (values, lengths) in zip(self.table_of, columns.bags):
            if table in self.counts:
                one_each = len(values) == len(lengths) and bool((lengths == 1).all())
                per_table.setdefault(table, []).append(
                    (values, train if one_each else np.repeat(train, lengths))
                )
        counts = {table: self._count(parts) for table, parts in per_table.items()}
        dense = columns.dense[train]
        dense[:, self.log1p] = np.log1p(np.maximum(dense[:, self.log1p], 0.0))
        standard = [j for j, c in enumerate(self.schema.dense) if "standardize" in c.transform]
        sums = dict(zip(standard, zip(exact_sums(dense[:, standard]),
                                      exact_square_sums(dense[:, standard]))))  # fmt: skip
        part: dict[str, Any] = {"n": rows, "positives": int(columns.labels[train].sum()),
                                "counts": counts, "sums": [
            sums.get(j, (Fraction(), Fraction())) for j in range(len(self.schema.dense))]}  # fmt: skip
        if self.sampled and rows:
            mixed = mix_tensor(file, torch.from_numpy(np.ascontiguousarray(keys[train])))
            key = mixed.numpy().view(np.uint64)
            keep = np.argsort(key, kind="stable")[:_SAMPLE]
            part["sample"] = (key[keep], dense[keep][:, self.sampled])
        return part

    def _count(self, parts: list[tuple[Any, np.ndarray]]) -> Any:
        """The training values' counts of a table's features: as 64-bit keys (`Keyed`, see
        [Note: fitting in parts]) when every value packs into one, else (``values`` and
        ``counts``) from a hash pass (`dictionary_encode`) and a `bincount` of the training
        rows' codes."""
        pa = self.pa
        if any(dictionary_parts(v) is not None for v, _ in parts):
            return self._count_weighted([_weighted(v, t) for v, t in parts])
        train = np.concatenate([t for _, t in parts]) if len(parts) > 1 else parts[0][1]
        keys = [packed_keys(v) for v, _ in parts]
        packed = [k for k in keys if k is not None]
        if len(packed) == len(keys):
            joined = np.concatenate(packed) if len(packed) > 1 else packed[0]
            distinct, counts = np.unique(joined[train], return_counts=True)
            return Keyed(distinct, counts.astype(np.int64))
        numbers = [decimal_ids(v) for v, _ in parts]
        if all(k is not None for k in numbers):
            return Numbered.counted(np.concatenate(numbers)[train])  # type: ignore[arg-type]
        dictionary, codes = _encode([v for v, _ in parts])
        counts = np.bincount(codes[train], minlength=len(dictionary))
        seen = counts > 0
        return pa.StructArray.from_arrays(
            [dictionary.filter(pa.array(seen)), pa.array(counts[seen])],
            names=["values", "counts"],
        )

    def _count_weighted(self, parts: list[tuple[Any, np.ndarray]]) -> Any:
        """`_count` of values each counted ``weight`` times (int64; a multi-hot column's
        distinct values weighted by their training rows, see `_weighted`): the same counts."""
        pa = self.pa
        weights = np.concatenate([w for _, w in parts])
        keys = [packed_keys(v, any_length=True) for v, _ in parts]
        packed = [k for k in keys if k is not None]
        if len(packed) == len(keys):
            distinct, inverse = np.unique(np.concatenate(packed), return_inverse=True)
            counts = np.bincount(inverse.reshape(-1), weights=weights, minlength=len(distinct))
            seen = counts > 0
            return Keyed(distinct[seen], counts[seen].astype(np.int64))
        dictionary, codes = _encode([v for v, _ in parts])
        counts = np.bincount(codes, weights=weights, minlength=len(dictionary)).astype(np.int64)
        seen = counts > 0
        return pa.StructArray.from_arrays(
            [dictionary.filter(pa.array(seen)), pa.array(counts[seen])],
            names=["values", "counts"],
        )

    def accept(self, position: tuple[int, ...], part: dict[str, Any]) -> None:
        """A piece's part (`piece`), in the calling thread."""
        self.rows += part["n"]
        self.positives += part.pop("positives")
        for table, counted in part.pop("counts").items():
            self.counts[table].append(counted)
            self.held[table] += len(counted)
            # summed when the held counts double since the last sum (amortized linear time)
            if self.held[table] > 2 * self.summed[table] + _COMPACT:
                self.counts[table] = [self._compact(self.counts[table])]
                self.held[table] = self.summed[table] = len(self.counts[table][0])
        self.pieces[position] = part

    def _compact(self, counted: list[Any]) -> Any:
        """Value counts summed per value: `Keyed` when all are, else a struct array of
        ``values`` and ``counts``."""
        pa = self.pa
        if len(counted) == 1:
            return counted[0]
        kinds = {type(c) for c in counted}
        if len(kinds) == 1 and kinds <= {Keyed, Numbered}:
            return kinds.pop().summed(counted)
        counted = [c.strings() if isinstance(c, Keyed) else c for c in counted]
        counts = np.concatenate([np.asarray(c.field("counts")) for c in counted])
        dictionary, codes = _encode([c.field("values") for c in counted])
        summed = np.bincount(codes, weights=counts, minlength=len(dictionary))
        return pa.StructArray.from_arrays(
            [dictionary, pa.array(summed.astype(np.int64))], names=["values", "counts"]
        )

    def part(self) -> dict[str, Any]:
        """What this process learnt, to merge (picklable)."""
        counts = {t: self._compact(c) if c else None for t, c in self.counts.items()}
        return {"counts": counts, "pieces": self.pieces, "rows": self.rows,
                "positives": self.positives}  # fmt: skip

    def merge(self, parts: Sequence[dict[str, Any]]) -> FittedSchema:
        """Every process's part -> the fitted schema (the same from any split of the pieces)."""
        tables = []
        for name, columns in self.tables.items():
            counted = [p["counts"][name] for p in parts if p["counts"].get(name) is not None]
            tables.append(self._table(name, columns, counted))
        pieces = {k: v for p in parts for k, v in p["pieces"].items()}
        ordered = [pieces[k] for k in sorted(pieces)]
        dense = tuple(self._dense(j, c, ordered) for j, c in enumerate(self.schema.dense))
        rows, positives = sum(p["rows"] for p in parts), sum(p["positives"] for p in parts)
        stats = {"train_rows": rows, "train_positives": positives}
        return FittedSchema(self.schema, tuple(tables), dense, stats)

    def _table(self, name: str, columns: list[ColumnSpec], counted: list[Any]) -> TableFit:
        first = columns[0]
        features = tuple(c.name for c in columns)
        if first.ids == "hash":
            assert first.num_embeddings is not None
            return TableFit(name, features, "hash", first.num_embeddings, first.pooling)
        kept: list[str] = []
        if counted:
            summed = self._compact(counted)
            if isinstance(summed, Numbered):  # few distinct values: sorted as strings below
                summed = summed.strings()
            if isinstance(summed, Keyed):
                often = summed.counts >= first.min_count  # only these can be kept: sorted
                keys, counts = summed.keys[often], summed.counts[often]
                order = np.lexsort((keys, -counts))  # by decreasing count, then by value
                enough = len(order)
                if first.num_embeddings is not None:
                    enough = min(enough, first.num_embeddings - 1)
                kept = unpacked_strings(keys[order[:enough]]).to_pylist()
                rows = first.num_embeddings or len(kept) + 1
                return TableFit(name, features, "vocabulary", rows, first.pooling, tuple(kept))
            counts = np.asarray(summed.field("counts"))
            often = self.pa.array(counts >= first.min_count)  # only these can be kept: sorted
            table = self.pa.table({"values": summed.field("values").filter(often),
                                   "counts": summed.field("counts").filter(often)})  # fmt: skip
            order = _compute().sort_indices(
                table, sort_keys=[("counts", "descending"), ("values", "ascending")]
            )
            enough = len(order)
            if first.num_embeddings is not None:
                enough = min(enough, first.num_embeddings - 1)
            kept = table.column("values").take(order[:enough]).to_pylist()
        rows = first.num_embeddings or len(kept) + 1
        return TableFit(name, features, "vocabulary", rows, first.pooling, tuple(kept))

    def _dense(self, j: int, column: ColumnSpec, pieces: list[dict[str, Any]]) -> DenseFit:
        log1p = bool(self.log1p[j])
        if "standardize" in column.transform:
            n = sum(part["n"] for part in pieces)
            if not n:
                return DenseFit(column.name, log1p, 0.0, 1.0)
            mean = sum((part["sums"][j][0] for part in pieces), Fraction()) / n
            variance = sum((part["sums"][j][1] for part in pieces), Fraction()) / n - mean * mean
            std = math.sqrt(float(variance))
            return DenseFit(column.name, log1p, float(mean), std if std > 0 else 1.0)
        if "bucketize" in column.transform:
            bounds = column.boundaries
            if bounds is None:
                bounds = self._quantiles(self.sampled.index(j), column.buckets, pieces)
            return DenseFit(column.name, log1p, boundaries=tuple(bounds))
        return DenseFit(column.name, log1p)

    @staticmethod
    def _quantiles(at: int, buckets: int, pieces: list[dict[str, Any]]) -> tuple[float, ...]:
        samples = [p["sample"] for p in pieces if "sample" in p]
        if not samples:
            return ()
        keys = np.concatenate([k for k, _ in samples])
        values = np.concatenate([v[:, at] for _, v in samples])
        values = np.sort(values[np.lexsort((values, keys))[:_SAMPLE]])
        cuts = [float(values[len(values) * i // buckets]) for i in range(1, buckets)]
        return tuple(sorted(set(cuts)))


class Keyed:
    """Value counts of strings packed as 64-bit keys (`packed_keys`): ``keys`` uint64 sorted
    and distinct, ``counts`` int64."""

    def __init__(self, keys: np.ndarray, counts: np.ndarray) -> None:
        self.keys, self.counts = keys, counts

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def summed(cls, parts: Sequence[Keyed]) -> Keyed:
        """The parts' counts summed per key (a sort, then a sum over each run of one key)."""
        keys = np.concatenate([p.keys for p in parts])
        counts = np.concatenate([p.counts for p in parts])
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        return cls(keys[starts], np.add.reduceat(counts, starts) if len(keys) else counts)

    def strings(self) -> Any:
        """The same counts as a struct array of ``values`` (strings) and ``counts``."""
        import pyarrow as pa

        return pa.StructArray.from_arrays([unpacked_strings(self.keys), pa.array(self.counts)],
                                          names=["values", "counts"])  # fmt: skip


class Numbered(Keyed):
    """Value counts of decimal ids (`decimal_ids`) as their numbers: ``keys`` int64 sorted
    and distinct (the numbers' order, not the strings'), ``counts`` int64."""

    @staticmethod
    def counted(numbers: np.ndarray) -> Numbered:
        """The counts of ``numbers`` (int64, >= 0): a `bincount` when they are small enough
        (ids such as MovieLens's 1 to 6040), else a sort."""
        if len(numbers) and int(numbers.max()) < 4 * len(numbers) + (1 << 16):
            counts = np.bincount(numbers)
            distinct = np.flatnonzero(counts)
            return Numbered(distinct.astype(np.int64), counts[distinct].astype(np.int64))
        distinct, counts = np.unique(numbers, return_counts=True)
        return Numbered(distinct.astype(np.int64), counts.astype(np.int64))

    def strings(self) -> Any:
        import pyarrow as pa

        return pa.StructArray.from_arrays(
            [pa.array(self.keys).cast(pa.string()), pa.array(self.counts)],
            names=["values", "counts"],
        )


def decimal_ids(values: Any) -> np.ndarray | None:
    """Each string of an Arrow string array as the number it writes (int64), when every one is
    a decimal id written one way only: 1 to 18 ASCII digits, no leading zero but in "0" itself
    (so strings and numbers are one-to-one and the strings come back as the numbers' decimal
    text); else None (a null, a sign, a space, "007", "1.0", "": counted as strings)."""
    n = len(values)
    if values.null_count:
        return None
    if not n:
        return np.zeros(0, dtype=np.int64)
    offsets, text = _offsets(values)
    lengths = np.diff(offsets)
    if int(lengths.min()) < 1 or int(lengths.max()) > 18:
        return None
    digits = text[int(offsets[0]) : int(offsets[-1])] - np.uint8(48)  # '0'..'9' -> 0..9
    if int(digits.max()) > 9:
        return None
    if bool(((text[offsets[:-1]] == 48) & (lengths > 1)).any()):  # a leading zero
        return None
    import pyarrow as pa

    return np.asarray(values.cast(pa.int64())).astype(np.int64, copy=False)


def packed_keys(values: Any, *, any_length: bool = False) -> np.ndarray | None:
    """Each string of an Arrow string array as a 64-bit key: its bytes big-endian, padded with
    zero bytes to 8, so distinct strings have distinct keys and the keys' order is the strings'
    (UTF-8 byte order). None when a string is longer than 8 bytes, holds a NUL byte, or is
    null, and, unless ``any_length``, when the strings differ in length: only strings of one
    length are packed from a view of their bytes; others would need a gather of every byte,
    slower than hashing the strings when a column has few distinct values."""
    n = len(values)
    if values.null_count:
        return None
    offsets, text = _offsets(values)
    if not n:
        return np.zeros(0, dtype=np.uint64)
    first, last = int(offsets[0]), int(offsets[-1])
    width, lengths = (last - first) // n, np.diff(offsets)
    if width <= 8 and (last - first) % n == 0 and int(lengths.min()) == width:
        raw = text[first:last].reshape(n, width)  # all one length (Criteo's 8 hex digits)
        if width and not raw.all():
            return None
        if width == 8:
            return raw.reshape(-1).view(">u8").astype(np.uint64)
        padded = np.zeros((n, 8), dtype=np.uint8)
        padded[:, :width] = raw
        return padded.view(">u8").reshape(n).astype(np.uint64)
    if not any_length or int(lengths.max()) > 8:
        return None
    place = offsets[:-1, None].astype(np.int64) + np.arange(8)
    inside = np.arange(8) < lengths[:, None]
    raw = np.where(inside, text[np.minimum(place, len(text) - 1)], 0).astype(np.uint8)
    if not (raw.astype(bool) | ~inside).all():
        return None
    return raw.view(">u8").reshape(n).astype(np.uint64)


def unpacked_strings(keys: np.ndarray) -> Any:
    """The strings of `packed_keys`' keys, as an Arrow string array."""
    import pyarrow as pa

    raw = np.ascontiguousarray(keys.astype(">u8")).view(np.uint8).reshape(-1, 8)
    inside = raw != 0  # a string's bytes: the non-zero ones, all before its padding
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(inside.sum(axis=1), out=offsets[1:])
    return pa.LargeStringArray.from_buffers(
        len(keys), pa.py_buffer(offsets), pa.py_buffer(raw[inside].tobytes())
    ).cast(pa.string())


def _weighted(values: Any, train: np.ndarray) -> tuple[Any, np.ndarray]:
    """A feature's values and training mask as (distinct values, how many training rows'
    bags hold each): a dictionary array counts its indices, others weigh each value 0 or 1."""
    parts = dictionary_parts(values)
    if parts is None:
        return values, train.astype(np.int64)
    dictionary, indices = parts
    return dictionary, np.bincount(indices[train], minlength=len(dictionary))


def _encode(arrays: list[Any]) -> tuple[Any, np.ndarray]:
    """One hash pass over Arrow string arrays without concatenating them (a chunked array's
    chunks share one dictionary): the distinct values and each value's code, in order."""
    import pyarrow as pa

    encoded = _compute().dictionary_encode(pa.chunked_array(arrays, type=arrays[0].type))
    if not encoded.num_chunks:
        return pa.array([], arrays[0].type), np.zeros(0, dtype=np.int64)
    codes = [np.asarray(chunk.indices) for chunk in encoded.chunks]
    return encoded.chunk(encoded.num_chunks - 1).dictionary, np.concatenate(codes)


def _compute() -> Any:
    import pyarrow.compute

    return pyarrow.compute
