"""The parallel scan (`scan_table(parallel=True)`): every rank scans its own pieces and the ranks
merge; the result is the one-process scan's to the bit (fitted schema, split, pieces, skipped
rows), at world sizes 1-3 with pieces that do not divide among the ranks, and a bad row is
refused on every rank with the one-process scan's message. Pieces are made tiny (a few KiB, 50
Parquet rows) so a 600-row file has many."""

from __future__ import annotations

import contextlib
import gzip

import pytest

import shardkit.data._table_fit as table_fit
import shardkit.data._table_pieces as table_pieces
from shardkit.data import scan_table
from shardkit.data._table_schema_load import schema_from_dict
from tests.data.ratings import SCHEMA, write_ratings, write_ratings_parquet

SPLITS = {
    "per_user": {"time_column": "timestamp", "validation_fraction": 0.2, "per": "user_id"},
    "fraction": {"validation_fraction": 0.3},
    "time": {"time_column": "timestamp", "validation_fraction": 0.25},
}
BUCKETS = {**SCHEMA["columns"], "age": {"type": "dense", "transform": "bucketize", "buckets": 5}}


@contextlib.contextmanager
def _small_pieces():
    """Tiny pieces, and value counts summed every few pieces (as big tables' are)."""
    saved = table_pieces.PIECE_BYTES, table_pieces.PARQUET_ROWS, table_fit._COMPACT
    table_pieces.PIECE_BYTES, table_pieces.PARQUET_ROWS, table_fit._COMPACT = 3000, 50, 30
    try:
        yield
    finally:
        table_pieces.PIECE_BYTES, table_pieces.PARQUET_ROWS, table_fit._COMPACT = saved


def _scan(paths, schema, parallel, **kwargs):
    with _small_pieces():
        data = scan_table(paths, schema_from_dict(schema), parallel=parallel, threads=2, **kwargs)
    return {"fitted": data.fitted.to_dict(), "pieces": data.pieces.tolist(),
            "split": (data.split.kind, data.split.cut, data.split.cutoffs),
            "skipped": (data.skipped, data.skipped_examples)}  # fmt: skip


def _scan_on_rank(rank, world_size, paths, schema, kwargs):
    return _scan(paths, schema, True, **kwargs)


def _refused_on_rank(rank, world_size, paths, schema):
    try:
        _scan(paths, schema, True)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Three training files of each kind (plain CSV, gzip TSV, Parquet), 1,300 rows."""
    folder = tmp_path_factory.mktemp("parallel")
    plain = write_ratings(folder / "a.csv", 600, seed=1)
    packed = write_ratings(folder / "b.tsv.gz", 400, seed=2, delimiter="\t", compress=True)
    parquet = write_ratings_parquet(folder / "c.parquet", 300, seed=3, row_group_size=120)
    return [plain, packed, parquet]


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_the_parallel_scan_is_the_one_process_scan(run_ranks, files, split):
    schema = {**SCHEMA, "columns": BUCKETS, "split": SPLITS[split]}
    alone = _scan(files, schema, False)
    assert len(alone["pieces"]) > 10  # more pieces than ranks, in every file
    assert {row[1] for row in alone["pieces"]} == {0, 1, 2}
    for world_size in (1, 2, 3):
        results = run_ranks(_scan_on_rank, world_size, files, schema, {})
        for result in results:
            assert result == alone, (split, world_size)


def test_skipped_rows_are_counted_once_with_the_first_examples(run_ranks, files, tmp_path):
    bad = tmp_path / "bad.csv"
    lines = files[0].read_text().splitlines(keepends=True)
    for at in (40, 90, 91, 300, 420, 530, 590):  # 7 bad rows in several pieces
        lines[at] = lines[at].replace(",M,", ",M,x,") if ",M," in lines[at] else "1,2\n"
    bad.write_text("".join(lines))
    schema = {**SCHEMA, "split": SPLITS["per_user"]}
    alone = _scan([bad, files[1]], schema, False, skip_bad_rows=True)
    assert alone["skipped"][0] == 7 and len(alone["skipped"][1]) == 5
    assert alone["skipped"][1][0].endswith("fix or remove the row")
    for world_size in (2, 3):
        for result in run_ranks(_scan_on_rank, world_size, [bad, files[1]], schema,
                                {"skip_bad_rows": True}):  # fmt: skip
            assert result == alone


def test_a_bad_row_is_refused_on_every_rank_with_the_first_one(run_ranks, files, tmp_path):
    """Two bad rows in different pieces (so on different ranks): every rank names the first."""
    rows = gzip.decompress(files[1].read_bytes()).decode().splitlines(keepends=True)
    fields = rows[150].split("\t")
    rows[150] = "\t".join([*fields[:5], "old", *fields[6:]])
    rows[380] = rows[380].rsplit("\t", 1)[0] + "\n"
    bad = tmp_path / "b.tsv.gz"
    bad.write_bytes(gzip.compress("".join(rows).encode()))
    paths = [files[0], bad]
    schema = {**SCHEMA, "split": SPLITS["fraction"]}
    with pytest.raises(ValueError, match=r"b.tsv.gz:151: column 'age': 'old' is not a finite"):
        _scan(paths, schema, False)
    for world_size in (2, 3):
        messages = run_ranks(_refused_on_rank, world_size, paths, schema)
        assert len(set(messages)) == 1 and "b.tsv.gz:151: column 'age': 'old'" in messages[0]


def _missing_on_rank_1(rank, world_size, paths, schema):
    if rank == 1:  # this host does not see the file
        paths = [paths[0].with_name("elsewhere.csv")]
    try:
        _scan(paths, schema, True)
    except (ValueError, FileNotFoundError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def test_a_file_one_rank_cannot_open_is_refused_on_every_rank(run_ranks, files):
    messages = run_ranks(_missing_on_rank_1, 2, files[:1], {**SCHEMA, "split": SPLITS["fraction"]})
    assert messages[0] == messages[1] and "FileNotFoundError" in messages[0]
    assert "elsewhere.csv does not exist" in messages[0]
