"""Criteo's rows, its ``.npy`` form and in-memory batches across ranks; MovieLens's rows; all on
small local files the tests write."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardkit.datasets.criteo import (
    CAT_FEATURE_COUNT,
    DEFAULT_CAT_NAMES,
    DEFAULT_COLUMN_NAMES,
    INT_FEATURE_COUNT,
    BinaryCriteoUtils,
    InMemoryBinaryCriteoIterDataPipe,
    criteo_kaggle,
    criteo_terabyte,
)
from shardkit.datasets.movielens import movielens_20m, movielens_25m


def _line(label: int, seed: int) -> str:
    ints = [str(seed + i) if (seed + i) % 5 else "" for i in range(INT_FEATURE_COUNT)]
    cats = [format(seed * 100 + i, "08x") if i % 7 else "" for i in range(CAT_FEATURE_COUNT)]
    return "\t".join([str(label), *ints, *cats])


def _tsv(path, rows: int, offset: int = 0):
    path.write_text("".join(_line(i % 2, offset + i) + "\n" for i in range(rows)))
    return str(path)


def test_rows_are_named_and_cast(tmp_path):
    path = _tsv(tmp_path / "day_0.tsv", 3)
    rows = list(criteo_kaggle(path))
    assert len(rows) == 3 and list(rows[0]) == DEFAULT_COLUMN_NAMES[::-1]
    assert rows[1]["label"] == 1 and rows[1]["int_0"] == 1 and rows[1]["int_4"] == 0  # empty: 0
    assert rows[1]["cat_1"] == format(101, "08x") and rows[1]["cat_0"] == ""
    second = _tsv(tmp_path / "day_1.tsv", 2, offset=10)
    assert len(list(criteo_terabyte([path, second]))) == 5
    raw = list(criteo_kaggle(path, row_mapper=None))
    assert raw[0][0] == "0" and len(raw[0]) == 40


def test_tsv_to_npys_layout(tmp_path):
    path = _tsv(tmp_path / "day_0.tsv", 4)
    out = [str(tmp_path / f"day_0_{p}.npy") for p in ("dense", "sparse", "labels")]
    BinaryCriteoUtils.tsv_to_npys(path, *out)
    dense, sparse, labels = (np.load(f) for f in out)
    assert dense.dtype == np.float32 and dense.shape == (4, INT_FEATURE_COUNT)
    raw = np.array([[int(v or 0) for v in _line(0, i).split("\t")[1:14]] for i in range(4)])
    np.testing.assert_allclose(dense, np.log(raw - raw.min() + 2), rtol=1e-6)
    assert sparse.dtype == np.int64 and sparse[2, 1] == 201 and sparse[2, 0] == 0
    assert labels.tolist() == [[0], [1], [0], [1]]
    assert BinaryCriteoUtils.get_shape_from_npy(out[1]) == (4, CAT_FEATURE_COUNT)
    np.testing.assert_array_equal(BinaryCriteoUtils.load_npy_range(out[1], 1, 2), sparse[1:3])
    with pytest.raises(ValueError, match=r"num_rows \(4\) from start_row \(1\) passes the end"):
        BinaryCriteoUtils.load_npy_range(out[1], 1, 4)


def test_row_ranges_split_rows_contiguously():
    got = [BinaryCriteoUtils.get_file_row_ranges_and_remainder([3, 4], r, 3) for r in range(3)]
    assert [g[0] for g in got] == [{0: (0, 2)}, {1: (0, 1)}, {1: (2, 3)}]
    assert {g[1] for g in got} == {1}


def test_sparse_to_contiguous_renumbers_by_first_appearance(tmp_path):
    day = np.array([[7, 5], [9, 5], [7, 6], [7, 5]], dtype=np.int64)
    np.save(tmp_path / "d0.npy", day)
    BinaryCriteoUtils.sparse_to_contiguous([str(tmp_path / "d0.npy")], str(tmp_path),
                                           frequency_threshold=2, columns=2)  # fmt: skip
    # column 0: 7 seen 3 times -> 2, 9 once -> 1 (rare); column 1: 5 -> 2, 6 rare -> 1
    assert np.load(tmp_path / "d0_contig_freq.npy").tolist() == [[2, 2], [1, 2], [2, 1], [2, 2]]


def _npy_day(tmp_path, day: int, rows: int, start: int):
    dense = np.arange(start, start + rows, dtype=np.float32).repeat(INT_FEATURE_COUNT)
    sparse = np.arange(start, start + rows, dtype=np.int64).repeat(CAT_FEATURE_COUNT)
    labels = (np.arange(start, start + rows, dtype=np.int32) % 2).reshape(-1, 1)
    paths = []
    for part, array in (("dense", dense.reshape(rows, -1)), ("sparse", sparse.reshape(rows, -1)),
                        ("labels", labels)):  # fmt: skip
        paths.append(str(tmp_path / f"day_{day}_{part}.npy"))
        np.save(paths[-1], array)
    return paths


@pytest.mark.parametrize(
    ("world_size", "drop_last"), [(1, False), (2, False), (3, False), (2, True)]
)
def test_in_memory_batches_cover_every_row_once_across_ranks(tmp_path, world_size, drop_last):
    days = [_npy_day(tmp_path, 0, 11, 0), _npy_day(tmp_path, 1, 6, 11)]
    dense, sparse, labels = ([d[i] for d in days] for i in range(3))
    seen, sizes = [], []
    for rank in range(world_size):
        pipe = InMemoryBinaryCriteoIterDataPipe("train", dense, sparse, labels, batch_size=4,
                                                rank=rank, world_size=world_size,
                                                drop_last=drop_last)  # fmt: skip
        batches = list(pipe)
        assert len(batches) == len(pipe)
        sizes.append([b.batch_size for b in batches])
        for b in batches:
            rows = b.dense_features[:, 0].long()
            seen += rows.tolist()
            assert b.sparse_features.keys() == DEFAULT_CAT_NAMES
            torch.testing.assert_close(b.sparse_features["cat_3"].values(), rows)
            torch.testing.assert_close(b.labels, (rows % 2).int())
    assert len(set(map(len, sizes))) == 1, f"ranks must get the same number of batches: {sizes}"
    expected = 17 // (4 * world_size) * (4 * world_size) if drop_last else 17
    assert sorted(seen) == list(range(expected))


def test_in_memory_stages_and_hashes(tmp_path):
    day = _npy_day(tmp_path, 0, 5, 0)
    rows = {}
    for stage in ("val", "test"):
        pipe = InMemoryBinaryCriteoIterDataPipe(stage, [day[0]], [day[1]], [day[2]], batch_size=8,
                                                rank=0, world_size=1,
                                                hashes=[3] * CAT_FEATURE_COUNT)  # fmt: skip
        batch = next(iter(pipe))
        rows[stage] = batch.dense_features[:, 0].long().tolist()
        assert batch.sparse_features["cat_0"].values().tolist() == [r % 3 for r in rows[stage]]
    assert rows == {"val": [0, 1, 2], "test": [3, 4]}
    with pytest.raises(ValueError, match=r"stage must be 'train', 'val' or 'test', got 'dev'"):
        InMemoryBinaryCriteoIterDataPipe("dev", *([p] for p in day), batch_size=2, rank=0,
                                         world_size=1)  # fmt: skip


def test_shuffled_training_set_is_a_permutation_split_over_ranks(tmp_path):
    days = [_npy_day(tmp_path, 0, 7, 0), _npy_day(tmp_path, 1, 6, 7)]
    seen = []
    for rank in range(2):
        pipe = InMemoryBinaryCriteoIterDataPipe(
            "train", *([d[i] for d in days] for i in range(3)), batch_size=3, rank=rank,
            world_size=2, shuffle_training_set=True,
        )  # fmt: skip
        seen += [r for b in pipe for r in b.dense_features[:, 0].long().tolist()]
    assert sorted(seen) == list(range(13)) and seen != list(range(13))


def test_movielens_rows_and_join(tmp_path):
    (tmp_path / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n1,10,4.5,100\n2,20,3.0,200\n"
    )
    (tmp_path / "movies.csv").write_text(
        'movieId,title,genres\n10,"A, the film",Drama\n20,B,Comedy\n'
    )
    rows = list(movielens_20m(str(tmp_path)))
    assert rows[0] == {"userId": 1, "movieId": 10, "rating": 4.5, "timestamp": 100}
    joined = list(movielens_25m(str(tmp_path), include_movies_data=True))
    assert joined[0]["title"] == "A, the film" and joined[1]["genres"] == "Comedy"
    with pytest.raises(FileNotFoundError, match=r"no ratings.csv in .*; download and unpack"):
        movielens_20m(str(tmp_path / "missing"))
