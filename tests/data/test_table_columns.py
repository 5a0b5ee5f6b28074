"""The vectorized path against the row-at-a-time spec: odd values (padded numbers, ``1_000``,
fills, bags with spaces and empty parts, hashed ids, unknown values) are encoded by
`TableReader` exactly as `FittedSchema.batch` (the row parser and encoder) encodes them; the
encoded-split cache (written once, atomically, reused, invalidated by a changed file); a
missing pyarrow named with the extra to install."""

from __future__ import annotations

import csv
import io
import os
import sys

import pytest
import torch

import shardkit.data._table_cache as table_cache
from shardkit.data import TableReader, scan_table
from shardkit.data._table_schema_load import schema_from_dict
from tests.data.ratings import SCHEMA, write_ratings

ODD = {
    "label": "clicked >= 1",
    "columns": {
        "user": {"type": "categorical", "missing": ["", "?"]},
        "tags": {"type": "multi_hot", "separator": ";"},
        "zip": {"type": "categorical", "ids": "hash", "num_embeddings": 13},
        "age": {"type": "dense", "transform": ["log1p", "standardize"], "fill": 30},
        "score": {"type": "dense", "transform": "bucketize", "buckets": 3},
    },
    "split": {"validation_fraction": 0.5},
}
ROWS = [
    # user, tags, zip, age, score, clicked
    ["u1", "a;b", "123", "20", "1", "1"],
    [" u2 ", " a ; ;c", "99", " 31 ", "1_000", "0"],
    ["?", "", "", "", "2e3", "1.0"],
    ["u1", "b", "123", "1e2", "-4", "0"],
    ["u3", "c;c", "7", "40.", " 5", " 1"],
    ["", ";", "x y", ".5", "+6", "0"],
    ["u2", "a", "99", "-3", "7", "2"],
    ["u9", "zz;a", "5", "8", "8", "0"],
]


def _write(path, rows):
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["user", "tags", "zip", "age", "score", "clicked"])
    writer.writerows(rows)
    path.write_text(text.getvalue())
    return path


def test_columns_encode_every_row_as_the_row_parser_does(tmp_path):
    rows = ROWS * 5
    data = scan_table([_write(tmp_path / "odd.csv", rows)], schema_from_dict(ODD), seed=2)
    assert data.num_rows[0] > 5 and data.num_rows[1] > 5
    for split in ("train", "validation"):
        kinds = data.split.kinds(0, 0, torch.arange(len(rows)).numpy(), None, None, None)
        mine = [r for r, kind in zip(rows, kinds) if kind == (split == "validation")]
        reader = TableReader(data, split=split, batch_size=len(mine), rank=0, world_size=1,
                             shuffle=False, last_batch=None)  # fmt: skip
        (batch,) = list(reader)
        names = ["user", "tags", "zip", "age", "score", "clicked"]
        expected = data.fitted.batch([dict(zip(names, r)) for r in mine])
        torch.testing.assert_close(batch.dense_features, expected.dense_features)
        torch.testing.assert_close(batch.labels, expected.labels)
        got, want = batch.sparse_features, expected.sparse_features
        assert got.keys() == want.keys()
        assert got.values().tolist() == want.values().tolist()
        assert got.lengths().tolist() == want.lengths().tolist()
    user = data.fitted.tables[0]
    assert "?" not in user.vocabulary and "u2" in user.vocabulary  # trimmed, missing dropped


def test_the_cache_is_written_once_and_reused_until_the_file_changes(tmp_path, monkeypatch):
    path = write_ratings(tmp_path / "r.csv", 700)
    schema = schema_from_dict(SCHEMA)
    data = scan_table([path], schema)
    cache = tmp_path / "cache"

    def epoch(data, **kwargs):
        reader = TableReader(data, split="train", batch_size=32, rank=1, world_size=2,
                             cache=cache, prefetch=0, **kwargs)  # fmt: skip
        return reader, [b.sparse_features.values().tolist() for b in reader]

    plain = [b.sparse_features.values().tolist() for b in
             TableReader(data, split="train", batch_size=32, rank=1, world_size=2)]  # fmt: skip
    first, batches = epoch(data)
    assert first._cache.written == 1 and batches == plain
    (folder,) = cache.iterdir()
    assert [p.name for p in folder.iterdir()] == ["train-0-0-0.bin"]  # no temporary left
    writes = []
    monkeypatch.setattr(table_cache, "write_rows", lambda *a: writes.append(a))
    again, batches = epoch(data)  # another run: read from the cache, nothing written
    assert again._cache.written == 0 and not writes and batches == plain
    other_rank = TableReader(
        data, split="train", batch_size=32, rank=0, world_size=3, cache=cache, prefetch=0
    )  # written counts what this process wrote
    list(other_rank)  # another world size reads the same piece's file
    assert other_rank._cache.written == 0
    with path.open("a") as f:  # a changed file: another key, so the entry is written anew
        f.write("1,2,5,978300000,Drama,40,M,3,12345\n")
    os.utime(path, (1, 1))
    changed = scan_table([path], schema)
    monkeypatch.undo()
    reader, _ = epoch(changed)
    assert reader._cache.written == 1 and len(list(cache.iterdir())) == 2


def test_a_cache_write_that_fails_leaves_no_file(tmp_path, monkeypatch):
    path = write_ratings(tmp_path / "r.csv", 300)
    data = scan_table([path], schema_from_dict(SCHEMA))

    def broken(fd):
        raise OSError("disk full")

    monkeypatch.setattr(table_cache.os, "fsync", broken)
    reader = TableReader(data, split="train", batch_size=16, rank=0, world_size=1,
                         cache=tmp_path / "c", prefetch=0)  # fmt: skip
    with pytest.raises(OSError, match="disk full"):
        list(reader)
    (folder,) = (tmp_path / "c").iterdir()
    assert list(folder.iterdir()) == []  # the temporary file is gone, no entry written


def test_a_table_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    path = write_ratings(tmp_path / "r.csv", 50)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(
        ValueError, match=r"r.csv: reading a table needs pyarrow: pip install 'shardkit\[data\]'"
    ):
        scan_table([path], schema_from_dict(SCHEMA))


def test_the_vocabulary_lookup_is_arrows_index_in():
    """Strings of every length (and a vocabulary with strings over 64 bytes: index_in itself),
    from sliced arrays, found as `index_in` finds them; strings of at most 8 bytes alone (found
    by their packed keys), in a vocabulary of short and long strings, too."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from shardkit.data._table_encoded import Vocabulary

    words = ["", "a", "ab", "ba", "abc", "é", "a" * 40, "b" * 63]
    probes = pa.array(["zz", *words, "abcd", "a" * 41, "x"]).slice(1, len(words) + 2)
    short = pa.array(["zz", "a", "ab", "ba", "é", "", "abcdefgh", "abcdefg", "x", "ab"]).slice(1)
    for vocabulary in (pa.array(words[1:]), pa.array([*words[1:], "c" * 70, "abcdefgh"])):
        for probe in (probes, short):
            found = Vocabulary(vocabulary).rows(probe)
            expected = pc.index_in(probe, value_set=vocabulary).fill_null(-1).to_numpy() + 1
            assert found.tolist() == expected.tolist()


def test_exact_sums_are_exact_in_any_order():
    """The fit's sums (see [Note: fitting in parts]) equal exact rational arithmetic, for
    huge, tiny and subnormal values too, and do not depend on the rows' order."""
    from fractions import Fraction

    import numpy as np

    from shardkit.data._table_fit import exact_square_sums, exact_sums

    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(size=500) * 1e9, np.log1p(rng.exponential(5, 500)),
                  np.r_[1e300, -1e-300, 2.0**-1074, 0.0, rng.normal(size=496)],
                  np.ldexp(rng.normal(size=500), rng.integers(-1074, 1000, 500)),  # every scale
                  np.full(500, 1 - 2.0**-53) * 2.0**450], axis=1)  # fmt: skip
    for j in range(x.shape[1]):
        column = x[:, j].tolist()
        assert exact_sums(x)[j] == sum(map(Fraction, column))
        assert exact_square_sums(x)[j] == sum(Fraction(v) ** 2 for v in column)
    shuffled = x[rng.permutation(500)]
    assert exact_sums(shuffled) == exact_sums(x)
    assert exact_square_sums(shuffled) == exact_square_sums(x)


@pytest.mark.parametrize("whole_seconds", [True, False])
def test_the_per_user_order_is_by_user_time_and_position(whole_seconds):
    """The time split's sort (packed integer keys for whole seconds, else stable sorts) is the
    order of (user, time, position) tuples, and the rows it picks by rank (from the sorted keys
    unpacked, for whole seconds) are that order's."""
    import numpy as np

    from shardkit.data._table_split import _by_user_time_position, _ranked

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 50, 3000)
    times = rng.integers(0, 40, 3000).astype(np.float64) + 978_300_000
    if not whole_seconds:
        times += rng.random(3000)
    positions = np.arange(3000)
    order = _by_user_time_position(codes, times, positions)
    expected = sorted(range(3000), key=lambda i: (codes[i], times[i], positions[i]))
    assert order.tolist() == expected
    ranks = rng.integers(0, 3000, 40)
    picked_times, picked_positions = _ranked(codes, times, positions, ranks)
    assert picked_times.tolist() == [times[expected[r]] for r in ranks]
    assert picked_positions.tolist() == [expected[r] for r in ranks]


def test_strings_with_spaces_at_either_end_are_found():
    """`_may_have_spaces` (which decides whether a column is trimmed) finds every string that
    Python's strip would change, at its start or its end, in slices too, and passes clean
    ASCII."""
    import pyarrow as pa

    from shardkit.data._table_columns import _may_have_spaces

    cases = [["a", "b"], ["a "], [" a"], ["", "a\t"], ["b\u3000", ""], ["\n"], ["ab", "", "cd"],
             ["x", "é"], ["~!", None, "z"]]  # fmt: skip
    for values in cases:
        for start in range(len(values)):
            part = pa.array(values, pa.string()).slice(start)
            rest = [v for v in values[start:] if v is not None]
            if any(v != v.strip() for v in rest):
                assert _may_have_spaces(part), values[start:]
            elif all(v.isascii() and v for v in rest):  # an empty one may read a neighbour
                assert not _may_have_spaces(part), values[start:]


def test_short_values_counted_as_keys_fit_what_counting_strings_fits(tmp_path, monkeypatch):
    """Values of at most 8 bytes are counted as 64-bit keys (`packed_keys`): distinct strings
    get distinct keys, in the strings' byte order, and come back unchanged. A table whose
    pieces mix short values with long ones (counted as strings), summed every few pieces, fits
    the vocabulary (values, order, ``min_count``, ``num_embeddings``) that counting every value
    as a string fits."""
    import numpy as np
    import pyarrow as pa

    import shardkit.data._table_fit as table_fit
    import shardkit.data._table_pieces as table_pieces

    values = ["", "a", "ab", "a\u00e9", "zz", "12345678", "1234567", "\u00e9", "~", "Z"]
    keys = table_fit.packed_keys(pa.array(values), any_length=True)
    assert [values[i] for i in np.argsort(keys)] == sorted(values, key=str.encode)
    assert len(set(keys.tolist())) == len(values)
    assert table_fit.unpacked_strings(keys).to_pylist() == values
    assert table_fit.packed_keys(pa.array(values)) is None  # lengths differ
    for width in (2, 8):  # one length: packed from a view of the bytes, the same keys
        same = pa.array(
            [
                v
                for v in [
                    "ab",
                    "\u00e9",
                    "zz",
                    "Z0",
                    "~~",
                    "12345678",
                    "1234567~",
                    "\u00e9\u00e9\u00e9\u00e9",
                ]
                if len(v.encode()) == width
            ]
        ).slice(1)
        expected = table_fit.packed_keys(pa.array(same.to_pylist()), any_length=True).tolist()
        assert table_fit.packed_keys(same).tolist() == expected
        assert (
            table_fit.unpacked_strings(table_fit.packed_keys(same)).to_pylist() == same.to_pylist()
        )
    assert table_fit.packed_keys(pa.array(["123456789"]), any_length=True) is None  # 9 bytes
    assert table_fit.packed_keys(pa.array(["a\0b"]), any_length=True) is None

    rows = [[f"u{(i * 7) % 23 % (3 + i % 9)}", f"{(i * 13) % 41:08x}" if i < 900 else
             f"long-code-{i % 4}", str(i % 3 == 0)] for i in range(1200)]  # fmt: skip
    path = tmp_path / "codes.csv"
    path.write_text("user,code,clicked\n" + "".join(",".join(r) + "\n" for r in rows))
    schema = schema_from_dict({"label": "clicked", "split": {"validation_fraction": 0.2},
                               "columns": {"user": {"type": "categorical", "min_count": 3},
                                           "code": {"type": "categorical",
                                                    "num_embeddings": 30}}})  # fmt: skip
    monkeypatch.setattr(table_pieces, "PIECE_BYTES", 2000)
    monkeypatch.setattr(table_fit, "_COMPACT", 20)
    packed = table_fit.packed_keys
    seen = []
    monkeypatch.setattr(table_fit, "packed_keys", lambda v: seen.append(packed(v)) or seen[-1])
    keyed = scan_table([path], schema, threads=1)
    assert any(k is None for k in seen) and any(k is not None for k in seen)
    monkeypatch.setattr(table_fit, "packed_keys", lambda v: None)
    strings = scan_table([path], schema, threads=1)
    assert len(keyed.pieces) > 3
    assert keyed.fitted.to_dict() == strings.fitted.to_dict()
    vocabulary = {t.name: t.vocabulary for t in keyed.fitted.tables}
    assert len(vocabulary["code"]) == 29 and "long-code-1" in vocabulary["code"]


def test_decimal_ids_counted_as_numbers_fit_what_counting_strings_fits(tmp_path, monkeypatch):
    """Ids of several lengths written as decimal numbers one way only ("1" to "6040", as
    MovieLens's) are counted as their numbers (`decimal_ids`: a `bincount`, or a sort for large
    ones); "007", "+5", "1.0", "-1" and spaces are not such ids, so a piece holding one counts
    strings, and pieces of either kind merge. The fitted schema (vocabulary values, order by
    count then string, ``min_count``, ``num_embeddings``) is the one counting strings fits and
    the one a Python count gives."""
    import collections

    import pyarrow as pa

    import shardkit.data._table_fit as table_fit
    import shardkit.data._table_pieces as table_pieces

    assert table_fit.decimal_ids(pa.array(["7", "0", "10", "6040"])).tolist() == [7, 0, 10, 6040]
    for odd in ("007", "+5", "1.0", "-1", " 3", "", "1e3", "\u0663", "1234567890123456789"):
        assert table_fit.decimal_ids(pa.array(["12", odd])) is None, odd
    assert table_fit.decimal_ids(pa.array(["12", None])) is None
    assert table_fit.decimal_ids(pa.array(["x", "12", "3"]).slice(1)).tolist() == [12, 3]

    odd = {300: "007", 310: "007", 320: "007", 301: "7", 302: "+5", 312: "+5", 900: "05",
           910: "05"}  # fmt: skip
    rows = [[odd.get(i, str((i * 37) % 1013 % (5 + i % 97))),
             str(10**12 + i % 7 if i % 2 else i % 11), str(i % 3 == 0)] for i in range(1200)]  # fmt: skip
    path, other = tmp_path / "ids.csv", tmp_path / "validation.csv"
    for file, part in ((path, rows), (other, rows[:50])):
        file.write_text("user,item,clicked\n" + "".join(",".join(r) + "\n" for r in part))
    schema = schema_from_dict({"label": "clicked", "columns": {
        "user": {"type": "categorical", "min_count": 2},
        "item": {"type": "categorical", "num_embeddings": 12}}})  # fmt: skip
    monkeypatch.setattr(table_pieces, "PIECE_BYTES", 2000)
    monkeypatch.setattr(table_fit, "_COMPACT", 20)
    decimal = table_fit.decimal_ids
    seen = []
    monkeypatch.setattr(table_fit, "decimal_ids", lambda v: seen.append(decimal(v)) or seen[-1])
    numbered = scan_table([path], schema, validation_paths=[other], threads=1)
    assert any(k is None for k in seen) and sum(k is not None for k in seen) > 4
    monkeypatch.setattr(table_fit, "decimal_ids", lambda v: None)
    strings = scan_table([path], schema, validation_paths=[other], threads=1)
    assert len(numbered.pieces) > 4
    assert numbered.fitted.to_dict() == strings.fitted.to_dict()
    vocabulary = {t.name: t.vocabulary for t in numbered.fitted.tables}
    for column, min_count, most in (("user", 2, None), ("item", 1, 11)):
        counts = collections.Counter(r[column == "item"] for r in rows)
        expected = sorted((v for v, c in counts.items() if c >= min_count),
                          key=lambda v: (-counts[v], v.encode()))[:most]  # fmt: skip
        assert list(vocabulary[column]) == expected
    assert {"007", "7", "+5", "05"} <= set(vocabulary["user"])


def test_multi_hot_bags_split_once_per_distinct_text_are_each_rows_split():
    """A multi-hot column of few distinct texts is split, trimmed and checked once per text,
    each row then taking its text's values: the same values, lengths and order as splitting
    every row (Python's split of the stripped text, stripped parts, missing ones dropped)."""
    import pyarrow as pa

    from shardkit.data._table_columns import ColumnParser

    schema = schema_from_dict(ODD)
    parser = ColumnParser(schema, ("user", "tags", "zip"))
    spec = next(c for c in schema.columns if c.name == "tags")
    texts = [r[1] for r in ROWS]
    split_once = []
    split = parser._split
    parser._split = lambda *a: split_once.append(1) or split(*a)  # type: ignore[method-assign]
    for rows, once in ((texts, 0), (texts * 5, 1), ((texts * 5)[3:], 1)):
        values, lengths = parser._bag(pa.array(rows), spec, {})
        bags = [[p.strip() for p in r.strip().split(";") if p.strip() not in spec.missing]
                for r in rows]  # fmt: skip
        assert lengths.tolist() == [len(b) for b in bags]
        assert values.to_pylist() == [v for b in bags for v in b]
        assert len(split_once) == once
        split_once.clear()


def test_multi_hot_values_are_counted_once_per_distinct_value_weighted_by_training_rows(tmp_path):
    """A multi-hot column of few distinct texts reaches the fit as a dictionary array: its
    distinct values are counted weighted by the training rows' bags holding them (values of
    validation rows only are not counted); the vocabulary is the training rows' `Counter`."""
    import collections

    rows = [[f"u{i % 7}", ("a;b", " a ; ;c", "", "c;c", ";", "zz;a", "b;a;d")[i % 7 if i % 11
             else 5], "1", "2" if i % 13 else "two", "3", str(i % 2)] for i in range(84)]  # fmt: skip
    schema = schema_from_dict({**ODD, "columns": {**ODD["columns"], "tags": {
        "type": "multi_hot", "separator": ";", "min_count": 2}}})  # fmt: skip
    data = scan_table([_write(tmp_path / "tags.csv", rows)], schema, seed=3, skip_bad_rows=True)
    assert data.skipped == 7  # the ages "two": the pieces' bags are filtered
    train = data.split.kinds(0, 0, torch.arange(len(rows)).numpy(), None, None, None) == 0
    good = [i for i, r in enumerate(rows) if r[3] != "two"]
    assert 10 < int(train[good].sum()) < len(good) - 10
    counts = collections.Counter(p.strip() for i in good if train[i]
                                 for p in rows[i][1].strip().split(";") if p.strip())  # fmt: skip
    expected = sorted((v for v, c in counts.items() if c >= 2), key=lambda v: (-counts[v], v))
    tags = next(t for t in data.fitted.tables if t.name == "tags")
    assert list(tags.vocabulary) == expected
    mine = [rows[i] for i in good if train[i]]  # the reader's bags of the kept rows (filtered)
    reader = TableReader(data, split="train", batch_size=len(mine), rank=0, world_size=1,
                         shuffle=False, last_batch=None)  # fmt: skip
    (batch,) = list(reader)
    names = ["user", "tags", "zip", "age", "score", "clicked"]
    want = data.fitted.batch([dict(zip(names, r)) for r in mine]).sparse_features
    assert batch.sparse_features.values().tolist() == want.values().tolist()
    assert batch.sparse_features.lengths().tolist() == want.lengths().tolist()
