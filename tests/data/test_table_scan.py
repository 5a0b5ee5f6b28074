"""The table scan: vocabularies (frequency order, min_count, the unseen row, hashing, shared
tables), dense transforms fitted on the training split, the four splits, gzip / several files /
folders / Parquet read alike, and every bad input refused with file, line and column (or
skipped and counted)."""

from __future__ import annotations

import ctypes
import itertools
import math
import platform
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardkit.compat import glibc_function
from shardkit.data import FittedSchema, TableReader, scan_table
from shardkit.data._table_rows import hash_id
from shardkit.data._table_schema_load import schema_from_dict
from shardkit.kernels import _pages
from tests.data.ratings import SCHEMA, T0, write_ratings, write_ratings_parquet

THP = _pages.thp_mode()

TINY = """user,item,tags,age,clicked,day
u1,a,x|y,20,1,1
u1,b,y,30,0,2
u2,a,,40,1,3
u3,a,z|x|y,50,0,4
u2,c,x,60,1,5
u1,a,y,70,0,6
"""


def _schema(columns, *, label="clicked", split=None):
    return schema_from_dict({"label": label, "columns": columns,
                             "split": split or {"time_column": "day", "time_cut": 6}})  # fmt: skip


def _write(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _validation_batch(data):
    reader = TableReader(data, split="validation", batch_size=1000, rank=0, world_size=1)
    (batch,) = list(reader)
    return batch


def test_vocabularies_are_frequency_ordered_with_an_unseen_row(tmp_path):
    """Training rows are days 1-5 (the cut is day 6): user counts u1 2, u2 2, u3 1; item a 3,
    b 1, c 1; tags x 3, y 3, z 1."""
    schema = _schema({"user": {"type": "categorical", "min_count": 2}, "item": "categorical",
                      "tags": {"type": "multi_hot", "pooling": "mean"}})  # fmt: skip
    data = scan_table([_write(tmp_path, TINY)], schema)
    tables = {t.name: t for t in data.fitted.tables}
    assert tables["user"].vocabulary == ("u1", "u2")  # u3 is rare: row 0
    assert tables["item"].vocabulary == ("a", "b", "c")  # ties by value
    assert tables["tags"].vocabulary == ("x", "y", "z") and tables["tags"].pooling == "mean"
    assert data.fitted.num_embeddings_per_feature == (3, 4, 4)
    assert data.num_rows == (5, 1)
    batch = data.fitted.batch([{"user": "u3", "item": "b", "tags": "y|new|x", "clicked": "1"},
                               {"user": "u1", "item": "zzz", "tags": ""}])  # fmt: skip
    kjt = batch.sparse_features
    assert kjt["user"].values().tolist() == [0, 1]
    assert kjt["item"].values().tolist() == [2, 0]
    assert kjt["tags"].values().tolist() == [2, 0, 1] and kjt["tags"].lengths().tolist() == [3, 0]
    assert batch.labels.tolist() == [1.0, 0.0]
    missing = data.fitted.batch([{"user": "", "item": " ", "tags": "|"}]).sparse_features
    assert missing.lengths().tolist() == [0, 0, 0]  # a missing value is an empty bag


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
@pytest.mark.skipif(THP == "always", reason="a block mapped anew may fault 2 MiB at a time")
def test_the_scan_keeps_its_temporaries_mapped(tmp_path, monkeypatch):
    """The scan fixes glibc's heap thresholds before it reads (`shardkit.kernels.steady_heap`,
    [Note: table scan]), so that a piece's temporaries stay mapped for the next piece. Checked
    while a piece is read, from glibc's starting thresholds (a fresh process's: 128 KiB): a
    block of 8 MiB written, freed and written again faults nothing in the second time, where
    without the scan's thresholds it is mapped anew (2,048 faults)."""
    from shardkit.data import _table_scan
    from shardkit.kernels import _heap

    for name in (*_heap._USER_MALLOC_VARS, _heap.ENV_VAR, "LD_PRELOAD", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_heap, "_state", None)  # (`steady_heap` answers once per process)
    work, faults = _table_scan._Scan._work, []

    def probed(self, *args):
        faults.append(_faults_writing_again(8 << 20))
        return work(self, *args)

    monkeypatch.setattr(_table_scan._Scan, "_work", probed)  # each piece, in this thread
    mallopt = _heap._mallopt()
    mallopt(_heap._M_MMAP_THRESHOLD, 128 << 10)
    mallopt(_heap._M_TRIM_THRESHOLD, 128 << 10)
    try:
        scan_table([_write(tmp_path, TINY)], _schema({"item": "categorical"}), threads=1)
    finally:  # (what a scan leaves this process with)
        mallopt(_heap._M_MMAP_THRESHOLD, _heap.MMAP_THRESHOLD)
        mallopt(_heap._M_TRIM_THRESHOLD, _heap.TRIM_THRESHOLD)
    assert len(faults) == 1 and faults[0] <= 16, faults  # (the one piece of TINY)


def _faults_writing_again(size: int) -> int:
    """This thread's minor page faults writing a fresh ``size``-byte block from glibc's malloc,
    just after writing and freeing one of the same size."""
    malloc = glibc_function("malloc", (ctypes.c_size_t,), ctypes.c_void_p)
    free = glibc_function("free", (ctypes.c_void_p,), None)
    before = 0
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        block = malloc(size)
        ctypes.memset(block, 1, size)
        free(block)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def test_num_embeddings_caps_a_vocabulary_and_hashing_needs_none(tmp_path):
    schema = _schema({"item": {"type": "categorical", "num_embeddings": 2},
                      "user": {"type": "categorical", "ids": "hash", "num_embeddings": 7}})  # fmt: skip
    data = scan_table([_write(tmp_path, TINY)], schema)
    item, user = data.fitted.tables
    assert item.vocabulary == ("a",) and item.num_embeddings == 2
    assert user.vocabulary == () and user.num_embeddings == 7
    batch = data.fitted.batch([{"item": "b", "user": "u9"}])
    assert batch.sparse_features["user"].values().tolist() == [hash_id("u9", 7)]
    assert batch.sparse_features["item"].values().tolist() == [0]


def test_columns_sharing_a_table(tmp_path):
    text = "a,b,y\nx,y,1\nx,z,0\nz,z,1\nq,x,0\n"
    schema = _schema({"a": {"type": "categorical", "table": "shared"},
                      "b": {"type": "categorical", "table": "shared", "num_embeddings": 9}},
                     label="y", split={"validation_fraction": 0.25})  # fmt: skip
    data = scan_table([_write(tmp_path, text)], schema, seed=3)
    (table,) = data.fitted.tables
    assert table.features == ("a", "b") and table.num_embeddings == 9
    counts = {}
    rows = [r.split(",") for r in text.splitlines()[1:]]
    kinds = [data.split.kind_of(0, i, i, None) for i in range(4)]
    for (a, b, _), kind in zip(rows, kinds):
        if kind == 0:
            counts[a] = counts.get(a, 0) + 1
            counts[b] = counts.get(b, 0) + 1
    assert table.vocabulary == tuple(sorted(counts, key=lambda v: (-counts[v], v)))
    assert data.fitted.keys == ("a", "b") and data.fitted.num_embeddings_per_feature == (9, 9)


def test_dense_transforms_use_the_training_split(tmp_path):
    ages = [20.0, 30.0, 40.0, 50.0, 60.0]  # training rows; day 6 (age 70) validates
    mean = sum(ages) / 5
    std = math.sqrt(sum((a - mean) ** 2 for a in ages) / 5)
    logs = [math.log1p(a) for a in ages]
    log_mean = sum(logs) / 5
    log_std = math.sqrt(sum((x - log_mean) ** 2 for x in logs) / 5)
    columns = {"item": "categorical",
               "age": {"type": "dense", "transform": "standardize"},
               "age_log": {"type": "dense", "transform": ["log1p", "standardize"]},
               "age_q": {"type": "dense", "transform": "bucketize", "buckets": 4},
               "age_b": {"type": "dense", "transform": "bucketize", "boundaries": [35, 65]},
               "age_raw": {"type": "dense", "fill": -1}}  # fmt: skip
    text = TINY.replace("age", "age,age_log,age_q,age_b,age_raw")
    lines = text.splitlines()
    for i in range(1, len(lines)):
        age = lines[i].split(",")[3]
        lines[i] = lines[i].replace(
            f",{age},", f",{age},{age},{age},{age},{age if i != 2 else ''},"
        )
    data = scan_table([_write(tmp_path, "\n".join(lines) + "\n")], _schema(columns))
    age, age_log, age_q, age_b, raw = data.fitted.dense
    assert (age.mean, age.std) == pytest.approx((mean, std))
    assert (age_log.mean, age_log.std) == pytest.approx((log_mean, log_std))
    assert age_q.boundaries == (30.0, 40.0, 50.0)  # quartiles of the 5 training ages
    assert age_b.boundaries == (35.0, 65.0)
    assert (raw.log1p, raw.mean, raw.boundaries) == (False, None, None)
    batch = _validation_batch(data)  # the day-6 row: age 70
    expected = [(70 - mean) / std, (math.log1p(70) - log_mean) / log_std, 1.0, 1.0, 70.0]
    torch.testing.assert_close(batch.dense_features[0], torch.tensor(expected))
    filled = data.fitted.batch([{"item": "a", "age": "35", "age_log": "0", "age_q": "35",
                                 "age_b": "35", "age_raw": ""}])  # fmt: skip
    assert filled.dense_features[0, 2:].tolist() == pytest.approx([1 / 3, 0.5, -1.0])


@pytest.mark.parametrize("fraction", [0.1, 0.5])
def test_fraction_split_is_seeded_and_disjoint(tmp_path, fraction):
    path = write_ratings(tmp_path / "r.csv", 600)
    schema = schema_from_dict({**SCHEMA, "split": {"validation_fraction": fraction}})
    a, b = scan_table([path], schema, seed=1), scan_table([path], schema, seed=1)
    other = scan_table([path], schema, seed=2)
    assert a.num_rows == b.num_rows and sum(a.num_rows) == 600
    assert abs(a.num_rows[1] / 600 - fraction) < 0.06
    kinds = [a.split.kind_of(0, i, i, None) for i in range(600)]
    assert sum(kinds) == a.num_rows[1]
    assert kinds != [other.split.kind_of(0, i, i, None) for i in range(600)]


def test_time_splits(tmp_path):
    """Global cut from a fraction, and the last fraction of each user's rows."""
    path = write_ratings(tmp_path / "r.csv", 600)  # timestamps grow with the row
    rows = [line.split(",") for line in path.read_text().splitlines()[1:]]
    times = [int(r[3]) for r in rows]
    cut = scan_table([path], schema_from_dict(
        {**SCHEMA, "split": {"time_column": "timestamp", "validation_fraction": 0.25}}))  # fmt: skip
    assert cut.split.cut == sorted(times)[450] and cut.num_rows == (450, 150)
    per = scan_table([path], schema_from_dict({**SCHEMA, "split": {
        "time_column": "timestamp", "validation_fraction": 0.25, "per": "user_id"}}))  # fmt: skip
    by_user = {}
    for i, r in enumerate(rows):
        by_user.setdefault(r[0], []).append(i)
    expected = {i for rows_of in by_user.values()
                for i in rows_of[len(rows_of) - math.floor(0.25 * len(rows_of) + 0.5):]}  # fmt: skip
    parsed = [(0.0, [], [], float(t), r[0]) for t, r in zip(times, rows)]
    found = {i for i in range(600) if per.split.kind_of(0, i, i, parsed[i])}
    assert found == expected and per.num_rows[1] == len(expected)


def test_a_validation_file(tmp_path):
    train = write_ratings(tmp_path / "train.csv", 300, seed=1)
    validation = write_ratings(tmp_path / "val.csv", 100, seed=2)
    data = scan_table([train], schema_from_dict(SCHEMA), validation_paths=[validation])
    assert data.num_rows == (300, 100) and data.split.kind == "file"
    (tmp_path / "s").mkdir()
    schema = schema_from_dict({**SCHEMA, "split": {"validation_path": "val.csv"}}, base=tmp_path)
    assert scan_table([train], schema).num_rows == (300, 100)


def test_gzip_tsv_several_files_and_folders_read_alike(tmp_path):
    whole = write_ratings(tmp_path / "whole.csv", 600)
    tsv = write_ratings(tmp_path / "r.tsv.gz", 600, delimiter="\t", compress=True)
    assert tsv.read_bytes()[:2] == b"\x1f\x8b"  # really compressed
    folder = tmp_path / "parts"
    folder.mkdir()
    lines = whole.read_text().splitlines(keepends=True)
    for part, start in ((10, 401), (2, 201), (1, 1)):  # natural order: part_1, part_2, part_10
        (folder / f"part_{part}.csv").write_text(lines[0] + "".join(lines[start : start + 200]))
    schema = schema_from_dict({**SCHEMA, "split": {"time_column": "timestamp", "time_cut": T0 + 64 * 500}})  # fmt: skip
    reference = scan_table([whole], schema).fitted.to_dict()
    assert scan_table([tsv], schema).fitted.to_dict() == reference
    files = [folder / f"part_{part}.csv" for part in (1, 2, 10)]
    assert scan_table(files, schema).fitted.to_dict() == reference
    assert scan_table([folder], schema).fitted.to_dict() == reference


@pytest.mark.parametrize("probe", [16, 1 << 16])
def test_gzip_pieces_are_the_plain_files_pieces(tmp_path, monkeypatch, probe):
    """A gzip file is cut into the plain file's pieces, byte for byte, for any piece size
    against line length: lines shorter and longer than a piece (empty pieces inside a long
    line), a last line without a line break, pieces left out; the text is decompressed into
    buffers that grow past a long line (a probe of 16 bytes) or hold a piece and more."""
    import gzip

    import shardkit.data._table_pieces as table_pieces
    from shardkit.data._table_files import open_table_files

    lengths = [3, 40, 7, 350, 1, 90, 12, 800, 5, 64, 63, 65, 2]
    text = "a,b\n" + "".join(f"{i},{'x' * n}\n" for i, n in enumerate(lengths * 3)) + "9,end"
    plain, packed = tmp_path / "t.csv", tmp_path / "t.csv.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    monkeypatch.setattr(table_pieces, "_PROBE", probe)
    for size in (64, 100, 333, 1000):
        monkeypatch.setattr(table_pieces, "PIECE_BYTES", size)
        cuts = []
        for path, cut in ((plain, table_pieces._plain_cut), (packed, table_pieces._gzip_cut)):
            (file,) = open_table_files([path], needed=["a", "b"], delimiter=None, names=None)
            cuts.append([(k, begin, end, None if data is None else data.to_pybytes())
                         for k, begin, end, data in cut(file, lambda k: k % 3 != 1)])  # fmt: skip
        kept = [c for c in cuts[1] if c[3] is not None]  # the plain cut skips the others
        assert kept == cuts[0]
        assert len(kept) >= 2 and len(cuts[1]) > len(kept)
        assert all(text.encode()[begin:end] == data for _, begin, end, data in kept)
        ends = [c[1:3] for c in cuts[1]]  # the gzip cut names every piece, kept or not
        assert ends[0][0] == 4 and ends[-1][1] == len(text)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ends))


def test_parquet_string_columns_read_as_dictionaries_fit_and_read_as_strings(tmp_path, monkeypatch):
    """Parquet string columns of features (and lists of strings) are read as dictionary
    arrays, their distinct texts trimmed and checked once: the fitted schema, the pieces and
    the batches are the ones reading plain strings gives, with spaces around values, missing
    values, nulls, a multi-hot text column and a list column with missing and null items."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import shardkit.data._table_columns as table_columns
    import shardkit.data._table_pieces as table_pieces

    n = 400
    users = [f" u{i % 13}" if i % 5 == 0 else f"u{i % 13}" for i in range(n)]
    items = [
        None if i % 31 == 0 else ("?" if i % 17 == 0 else f"i{(i * 7) % 23} ") for i in range(n)
    ]
    tags = ["x| y" if i % 3 == 0 else ("" if i % 7 == 0 else "z|x|?") for i in range(n)]
    lists = [None if i % 29 == 0 else [" a", "b", "?", None][: i % 5] for i in range(n)]
    pq.write_table(pa.table({"user": users, "item": items, "tags": tags, "kinds": lists,
                             "clicked": [i % 3 == 0 for i in range(n)],
                             "day": list(range(n))}), tmp_path / "t.parquet",
                   row_group_size=150)  # fmt: skip
    schema = _schema({"user": "categorical", "item": {"type": "categorical", "missing": ["?"]},
                      "tags": {"type": "multi_hot", "missing": ["?", ""]},
                      "kinds": {"type": "multi_hot", "missing": ["?", ""]}},
                     split={"time_column": "day", "validation_fraction": 0.2, "per": "user"})  # fmt: skip
    monkeypatch.setattr(table_pieces, "PARQUET_ROWS", 64)
    parse, coded = table_columns.ColumnParser.parse, []

    def spy(self, table, records):
        coded.append(sum(pa.types.is_dictionary(c.type) or "dictionary" in str(c.type)
                         for c in table.columns))  # fmt: skip
        return parse(self, table, records)

    monkeypatch.setattr(table_columns.ColumnParser, "parse", spy)
    results, seen = [], []
    for stringy in (table_pieces._stringy, lambda pa, kind: False):
        monkeypatch.setattr(table_pieces, "_stringy", stringy)
        data = scan_table([tmp_path / "t.parquet"], schema, skip_bad_rows=True, threads=2)
        results.append((data, _validation_batch(data)))
        seen.append(set(coded))
        coded.clear()
    assert seen[0] == {4} and 0 in seen[1]  # user, item, tags, kinds: dictionaries, strings
    (coded_data, coded_batch), (plain, batch) = results
    assert coded_data.fitted.to_dict() == plain.fitted.to_dict()
    assert torch.equal(coded_data.pieces, plain.pieces) and coded_data.skipped == plain.skipped
    vocabulary = {t.name: t.vocabulary for t in plain.fitted.tables}
    assert "u0" in vocabulary["user"] and " u0" not in vocabulary["user"]
    assert "?" not in vocabulary["item"] and "?" not in vocabulary["kinds"]
    for got, expected in ((coded_batch.sparse_features.values(), batch.sparse_features.values()),
                          (coded_batch.sparse_features.lengths(), batch.sparse_features.lengths()),
                          (coded_batch.labels, batch.labels)):  # fmt: skip
        torch.testing.assert_close(got, expected)


def test_csv_multi_hot_texts_read_as_dictionaries_fit_and_read_as_strings(tmp_path, monkeypatch):
    """A CSV file's multi-hot text columns are read as dictionary arrays (each distinct text
    split once): the fitted schema, the pieces and the batches are the ones reading plain
    strings gives, with spaces, missing values, empty texts and many distinct texts."""
    import pyarrow as pa

    import shardkit.data._table_columns as table_columns
    import shardkit.data._table_pieces as table_pieces

    rows = [f"u{i % 13},{' x| y' if i % 3 == 0 else ('' if i % 7 == 0 else 'z|x|?')},"
            f"{'|'.join(f't{(i * j) % 97}' for j in range(i % 4))},{int(i % 3 == 0)},{i}\n"
            for i in range(400)]  # fmt: skip
    path = _write(tmp_path, "user,tags,many,clicked,day\n" + "".join(rows))
    schema = _schema({"user": "categorical", "tags": {"type": "multi_hot", "missing": ["?", ""]},
                      "many": "multi_hot"},
                     split={"time_column": "day", "validation_fraction": 0.2, "per": "user"})  # fmt: skip
    monkeypatch.setattr(table_pieces, "PIECE_BYTES", 1500)
    read, coded = table_pieces._read_csv, []

    def spy(*args):
        table, ragged = read(*args)
        coded.append(sum(pa.types.is_dictionary(c.type) for c in table.columns))
        return table, ragged

    monkeypatch.setattr(table_pieces, "_read_csv", spy)
    results, seen = [], []
    for plain_reads in (False, True):
        if plain_reads:
            monkeypatch.setattr(table_columns.ColumnParser, "dictionary", lambda *_: frozenset())
        data = scan_table([path], schema, threads=2)
        results.append((data, _validation_batch(data)))
        seen.append(set(coded))
        coded.clear()
    assert seen[0] == {2} and 0 in seen[1]  # tags and many: dictionaries, then strings
    (coded_data, coded_batch), (plain, batch) = results
    assert len(plain.pieces) > 3
    assert coded_data.fitted.to_dict() == plain.fitted.to_dict()
    assert torch.equal(coded_data.pieces, plain.pieces)
    assert "?" not in {t.name: t.vocabulary for t in plain.fitted.tables}["tags"]
    for got, expected in ((coded_batch.sparse_features.values(), batch.sparse_features.values()),
                          (coded_batch.sparse_features.lengths(), batch.sparse_features.lengths()),
                          (coded_batch.labels, batch.labels)):  # fmt: skip
        torch.testing.assert_close(got, expected)


def test_parquet_reads_like_csv(tmp_path):
    csv_data = scan_table([write_ratings(tmp_path / "r.csv", 600)], schema_from_dict(SCHEMA))
    parquet = scan_table(
        [write_ratings_parquet(tmp_path / "r.parquet", 600)], schema_from_dict(SCHEMA)
    )
    assert parquet.fitted.to_dict() == csv_data.fitted.to_dict()
    assert parquet.num_rows == csv_data.num_rows


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    path = write_ratings_parquet(tmp_path / "r.parquet", 10)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        ValueError,
        match=r"r.parquet is a Parquet file: reading it needs pyarrow, pip install 'shardkit\[parquet\]'",
    ):
        scan_table([path], schema_from_dict(SCHEMA))


def test_an_installed_pyarrow_that_fails_to_import_raises_its_own_error(tmp_path, monkeypatch):
    """An ImportError from an installed pyarrow (a broken install, a module another thread is
    still importing) is raised as it is, not reported as a missing extra."""
    import builtins

    import shardkit.data._table_files as table_files

    path = write_ratings_parquet(tmp_path / "r.parquet", 10)

    def broken(name, *args, **kwargs):
        if name == "pyarrow.parquet":
            raise ImportError("cannot import name 'BuildInfo' from partially initialized module")
        return real(name, *args, **kwargs)

    real = builtins.__import__
    monkeypatch.delitem(sys.modules, "pyarrow.parquet", raising=False)
    monkeypatch.setattr("builtins.__import__", broken)
    with pytest.raises(ImportError, match="BuildInfo"):
        table_files.parquet(path)


def test_a_first_scan_imports_pyarrow_before_its_import_thread_starts(tmp_path):
    """[Note: a scan's first piece]: in a fresh process (pyarrow not imported) the thread that
    imports pyarrow.compute loads only modules of its own, never pyarrow, pyarrow.lib or a
    reader the scan's thread loads meanwhile (both importing pyarrow at once made one fresh
    process in ~25 refuse a Parquet file as if pyarrow were missing)."""
    files = [
        write_ratings(tmp_path / "r.csv", 50),
        write_ratings_parquet(tmp_path / "r.parquet", 50),
    ]
    code = f"""
import sys, threading
from shardkit.data import scan_table
from shardkit.data._table_schema_load import schema_from_dict
from tests.data.ratings import SCHEMA
assert "pyarrow" not in sys.modules
loads = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        loads.append((threading.current_thread().name, name, "pyarrow.csv" in sys.modules))
sys.meta_path.insert(0, Spy())
scan_table({[str(f) for f in files]!r}, schema_from_dict(SCHEMA))
print(sorted({{name for thread, name, _ in loads if thread == "shardkit-import-compute"}}))
print(sorted({{name for thread, name, _ in loads if thread != "shardkit-import-compute"}}))
print(all(ready for thread, _, ready in loads if thread == "shardkit-import-compute"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    ahead, others = set(eval(lines[0])), set(eval(lines[1]))
    assert lines[2] == "True", "the import thread ran before pyarrow's CSV reader was imported"
    assert "pyarrow.parquet" in others, out.stdout  # (pyarrow.compute: whichever thread is first)
    assert not ahead & {"pyarrow", "pyarrow.lib", "pyarrow.csv", "pyarrow.parquet"}, ahead


GOOD = "user,item,tags,age,clicked,day\n" + "u1,a,x,20,1,1\nu2,b,y,30,0,2\n" * 3


@pytest.mark.parametrize(
    ("text", "label", "match"),
    [
        ("user,tags,age,clicked,day\nu1,x,20,1,1\n", "clicked", r"t.csv:1: no column 'item' \(the schema needs"),
        ("", "clicked", r"t.csv: the file is empty \(no header line"),
        ("user,item,tags,age,clicked,day\n", "clicked", r"t.csv: no rows after the header"),
        (GOOD + "u1,a,x,20,1\n", "clicked", r"t.csv:8: 5 fields, the header has 6; fix or remove the row"),
        (GOOD + "u1,a,x,twenty,1,8\n", "clicked", r"t.csv:8: column 'age': 'twenty' is not a finite number"),
        (GOOD + "u1,a,x,inf,1,8\n", "clicked", r"t.csv:8: column 'age': 'inf' is not a finite number"),
        (GOOD + "u1,a,x,,1,8\n", "clicked", r"t.csv:8: column 'age': missing value ''; give the column a fill"),
        (GOOD + "u1,a,x,20,2,8\n", "clicked", r"t.csv:8: column 'clicked': label '2' is not binary"),
        (GOOD + "u1,a,x,20,x,8\n", "clicked >= 1", r"t.csv:8: column 'clicked': 'x' is not a number, which the label rule"),
        (GOOD + "u1,a,x,20,1,noon\n", "clicked", r"t.csv:8: column 'day': 'noon' is not a time"),
        (GOOD.encode() + b"u1,\xffb,x,20,1,8\n", "clicked", r"t.csv:8: column 'item': bytes that are not UTF-8 \(b'\\xffb'\)"),
        (GOOD + '"u1\nstill u1",a,x,20,1\n', "clicked", r"t.csv:8: 5 fields"),  # a quoted newline: its first line
        (GOOD, "clicked >= 5", r"label 'clicked >= 5.0' is 0 on all 3 training rows: a model needs both labels"),
    ],
)  # fmt: skip
def test_bad_input_names_file_line_and_column(tmp_path, text, label, match):
    schema = _schema({"item": "categorical", "tags": "multi_hot", "age": "dense"}, label=label,
                     split={"time_column": "day", "time_cut": 2})  # fmt: skip
    with pytest.raises(ValueError, match=match):
        scan_table([_write(tmp_path, text)], schema)


def test_bad_rows_can_be_skipped_and_counted(tmp_path):
    text = GOOD + "u1,a,x,twenty,1,8\nu1,a\nu9,c,z,40,0,9\n"
    schema = _schema(
        {"item": "categorical", "age": "dense"}, split={"time_column": "day", "time_cut": 9}
    )
    data = scan_table([_write(tmp_path, text)], schema, skip_bad_rows=True)
    assert data.skipped == 2 and data.num_rows == (6, 1)
    assert data.skipped_examples[0].endswith(
        "t.csv:8: column 'age': 'twenty' is not a finite number (a dense column)"
    )
    assert data.skipped_examples[1].endswith(
        "t.csv:9: 2 fields, the header has 6; fix or remove the row"
    )
    assert "skipped 2 bad rows, e.g." in data.summary()
    assert _validation_batch(data).dense_features[:1, 0].tolist() == [40.0]
    train = TableReader(data, split="train", batch_size=6, rank=0, world_size=1)
    (batch,) = list(train)  # the readers skip the same rows
    assert sorted(batch.dense_features[:, 0].tolist()) == [20.0, 20.0, 20.0, 30.0, 30.0, 30.0]


def test_a_split_with_no_validation_rows_is_refused(tmp_path):
    schema = _schema({"item": "categorical"}, split={"time_column": "day", "time_cut": 99})
    with pytest.raises(
        ValueError,
        match=r"the split leaves 6 training and 0 validation rows \(rows at or after time 99 validate\)",
    ):
        scan_table([_write(tmp_path, TINY)], schema)


def test_a_fitted_schema_round_trips_and_is_used_as_given(tmp_path):
    path = write_ratings(tmp_path / "r.csv", 600)
    fitted = scan_table([path], schema_from_dict(SCHEMA)).fitted
    fitted.save(tmp_path / "f.json")
    again = FittedSchema.load(tmp_path / "f.json")
    assert again.to_dict() == fitted.to_dict()
    other = write_ratings(tmp_path / "o.csv", 300, seed=5)  # other data: the vocabulary stays
    assert scan_table([other], again).fitted is again


def test_the_worked_example_of_docs_data_md(tmp_path):
    """examples/tables/adult.toml reads the vendored Adult file as a user's table: the values
    the built-in loader knows (its split differs: a value or two of a rare country may fall
    on the other side)."""
    from pathlib import Path

    from shardkit.data import ADULT_PATH, load_adult, load_schema

    schema = load_schema(Path(__file__).resolve().parents[2] / "examples" / "tables" / "adult.toml")
    data = scan_table([ADULT_PATH], schema)
    assert data.num_rows == (39_094, 9_748) and data.skipped == 0
    adult = load_adult()
    for table in data.fitted.tables:
        assert len(set(table.vocabulary) ^ set(adult.vocabularies[table.name])) <= 2, table.name
    assert len(data.fitted.dense) == 6
    assert 0.2 < data.fitted.stats["train_positives"] / data.fitted.stats["train_rows"] < 0.28


@pytest.mark.slow  # a fresh process (torch's import): seconds
def test_a_first_scan_imports_pyarrow_compute_in_a_thread_while_it_cuts(tmp_path):
    """[Note: a scan's first piece]: in a fresh process the scan's own thread never imports
    pyarrow.compute (the thread that cuts the first piece); `loading_compute_ahead` does, and
    the scan ends (here: refusing an empty file) only when that import has."""
    path = _write(tmp_path, TINY)
    empty = _write(tmp_path, "user,clicked,day\n", name="empty.csv")
    code = f"""
import sys, threading
import pyarrow
from shardkit.data import scan_table
from shardkit.data._table_pieces import arrow
from shardkit.data._table_schema_load import schema_from_dict
importers = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow.compute":
            importers.append(threading.current_thread().name)
sys.meta_path.insert(0, Spy())
arrow(compute=False)
assert "pyarrow.compute" not in sys.modules
schema = schema_from_dict({{"label": "clicked", "columns": {{"user": "categorical"}},
                            "split": {{"time_column": "day", "time_cut": 6}}}})
try:
    scan_table([{str(empty)!r}], schema)
except ValueError as exc:
    assert "no rows after the header" in str(exc), exc
assert "pyarrow.compute" in sys.modules and threading.active_count() == 1
data = scan_table([{str(path)!r}], schema)  # imported: no thread this time
assert data.num_rows == (5, 1), data.num_rows
print(importers)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['shardkit-import-compute']", out.stdout
