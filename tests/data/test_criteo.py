"""Criteo: both layouts parsed exactly, DLRM's transforms, id mappings, and errors that name the
file, line and field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from shardkit.data import CriteoConfig, CriteoFormat, IdMapping, Missing, read_criteo

FIXTURES = Path(__file__).parents[1] / "fixtures" / "criteo"
TINY = FIXTURES / "tiny_kaggle.tsv"
PADDLE = FIXTURES / "paddlerec_dnn_criteo_sample_train.txt"


def _fields(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()]


def test_tsv_values_and_dlrm_transforms():
    data = read_criteo(TINY, config=CriteoConfig(num_embeddings=1000))
    rows = _fields(TINY)
    assert data.keys == tuple(f"cat_{i}" for i in range(26))
    assert data.labels.tolist() == [float(r[0]) for r in rows]
    expected_dense = [[math.log1p(max(int(x or 0), 0)) for x in r[1:14]] for r in rows]
    torch.testing.assert_close(data.dense, torch.tensor(expected_dense))
    expected_ids = [[int(x or "0", 16) % 1000 for x in r[14:]] for r in rows]
    assert data.ids.tolist() == expected_ids
    assert data.ids[0, 0].item() == 0x68FD1E64 % 1000 == 852


def test_per_table_sizes_and_empty_bags():
    sizes = tuple(range(10, 36))
    data = read_criteo(TINY, config=CriteoConfig(num_embeddings=sizes, missing=Missing.EMPTY_BAG))
    rows = _fields(TINY)
    expected = [[int(x, 16) % sizes[j] if x else -1 for j, x in enumerate(r[14:])] for r in rows]
    assert data.ids.tolist() == expected
    batch = data.all()
    lengths = batch.sparse_features.lengths().view(26, -1)  # [F, B]
    assert lengths[:, 2].tolist() == [0] * 26  # line 3 has no categorical value at all
    assert int(lengths.sum()) == sum(x != "" for r in rows for x in r[14:])


def test_hash_mapping_spreads_equal_values_differently_per_feature():
    hashed = read_criteo(
        TINY, config=CriteoConfig(num_embeddings=1 << 20, id_mapping=IdMapping.HASH)
    )
    modulo = read_criteo(TINY, config=CriteoConfig(num_embeddings=1 << 20))
    # line 4 has ffffffff in cat_0 and cat_1: modulo maps them alike, the hash does not
    assert modulo.ids[3, 0] == modulo.ids[3, 1]
    assert hashed.ids[3, 0] != hashed.ids[3, 1]
    assert int(hashed.ids.min()) >= 0 and int(hashed.ids.max()) < 1 << 20
    reseeded = read_criteo(
        TINY, config=CriteoConfig(num_embeddings=1 << 20, id_mapping=IdMapping.HASH, hash_seed=1)
    )
    assert not torch.equal(reseeded.ids, hashed.ids)
    assert torch.equal(
        read_criteo(
            TINY, config=CriteoConfig(num_embeddings=1 << 20, id_mapping=IdMapping.HASH)
        ).ids,
        hashed.ids,
    )


def test_paddlerec_sample():
    config = CriteoConfig(num_embeddings=1_000_000, format=CriteoFormat.PADDLEREC)
    data = read_criteo(PADDLE, config=config)
    assert len(data) == 80
    assert int(data.labels.sum()) == 23
    first = PADDLE.read_text().splitlines()[0].split()
    assert data.labels[0].item() == 0.0
    torch.testing.assert_close(
        data.dense[0], torch.tensor([float(t.split(":")[1]) for t in first[1:14]])
    )
    assert data.ids[0].tolist() == [int(t.split(":")[1]) % 1_000_000 for t in first[14:]]
    assert data.dense.min() >= 0  # min-max normalised already: used as they are


def test_paddlerec_absent_slot_and_any_order(tmp_path):
    dense = " ".join(["dense_feature:0.5"] * 13)
    path = tmp_path / "p.txt"
    path.write_text(f"click:1 {dense} 26:7 1:3\n")
    data = read_criteo(path, config=CriteoConfig(num_embeddings=5, format=CriteoFormat.PADDLEREC,
                                                 missing=Missing.EMPTY_BAG))  # fmt: skip
    assert data.ids[0].tolist() == [3] + [-1] * 24 + [2]
    zero = read_criteo(path, config=CriteoConfig(num_embeddings=5, format=CriteoFormat.PADDLEREC))
    assert zero.ids[0].tolist() == [3] + [0] * 24 + [2]


def _tsv_line(**changes: str) -> str:
    fields = ["1", *["3"] * 13, *["a1"] * 26]
    for index, value in changes.items():
        fields[int(index[1:])] = value
    return "\t".join(fields)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("1\t2\t3", r"bad.tsv:2: expected 40 tab-separated fields \(label, 13 integer, 26 categorical\), got 3"),
        (_tsv_line(f0="2"), r"bad.tsv:2: field 1 \(label\) must be 0 or 1, got '2'"),
        (_tsv_line(f0=""), r"bad.tsv:2: field 1 \(label\) must be 0 or 1, got ''"),
        (_tsv_line(f5="3.5"), r"bad.tsv:2: field 6 \(int_4\) must be an integer, got '3.5'"),
        (_tsv_line(f2="-"), r"bad.tsv:2: field 3 \(int_1\) must be an integer, got '-'"),
        (_tsv_line(f20="xyz"), r"bad.tsv:2: field 21 \(cat_6\) must be hexadecimal below 2\*\*63, got 'xyz'"),
        (_tsv_line(f39="f" * 17), r"bad.tsv:2: field 40 \(cat_25\) must be hexadecimal below 2\*\*63"),
        (_tsv_line(f3=" 4"), r"bad.tsv:2: field 4 \(int_2\) must be an integer, got ' 4'"),
    ],
)  # fmt: skip
def test_bad_tsv_lines_name_file_line_and_field(tmp_path, line, match):
    path = tmp_path / "bad.tsv"
    path.write_text(_tsv_line() + "\n" + line + "\n")
    with pytest.raises(ValueError, match=match):
        read_criteo(path, config=CriteoConfig(num_embeddings=10))


DENSE = " ".join(["dense_feature:0.5"] * 13)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (f"click:2 {DENSE} 1:5", r"p.txt:1: token 1 must be click:<0 or 1>, got 'click:2'"),
        (f"click:1 {DENSE.replace('0.5', 'x', 1)} 1:5", r"p.txt:1: token 2 must be dense_feature:<a float>, got 'dense_feature:x'"),
        (f"click:1 {DENSE.replace('0.5', 'inf', 1)} 1:5", r"p.txt:1: token 2 must be dense_feature:<a float>, got 'dense_feature:inf'"),
        (f"click:1 {DENSE} 27:5", r"p.txt:1: token 15 must be <slot>:<id> with slot 1..26, got '27:5'"),
        (f"click:1 {DENSE} 3:5 3:6", r"p.txt:1: token 16: slot 3 appears twice; one id per slot"),
        (f"click:1 {DENSE} 3:abc", r"p.txt:1: token 15 must be <slot>:<id> with slot 1..26, got '3:abc'"),
        ("click:1 dense_feature:0.5", r"p.txt:1: expected click:<0\|1>, 13 dense_feature:<float> and up to 26 <slot>:<id> tokens, got 2 tokens"),
    ],
)  # fmt: skip
def test_bad_paddlerec_lines_name_file_line_and_token(tmp_path, line, match):
    path = tmp_path / "p.txt"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=match):
        read_criteo(path, config=CriteoConfig(num_embeddings=10, format=CriteoFormat.PADDLEREC))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_embeddings": (5,) * 25}, ValueError, r"num_embeddings has 25 entries; give one int for all tables or 26"),
        ({"num_embeddings": 0}, ValueError, r"num_embeddings must be ints >= 1, got 0"),
        ({"num_embeddings": 5, "format": "tsv"}, TypeError, r"format must be a CriteoFormat, got 'tsv'; use one of \['CriteoFormat.TSV', 'CriteoFormat.PADDLEREC'\]"),
        ({"num_embeddings": 5, "id_mapping": "hash"}, TypeError, r"id_mapping must be a IdMapping, got 'hash'"),
    ],
)  # fmt: skip
def test_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        CriteoConfig(**kwargs)


def test_config_takes_a_list_and_is_hashable():
    config = CriteoConfig(num_embeddings=[3] * 26)
    assert config.num_embeddings_per_feature == (3,) * 26
    assert hash(config) == hash(CriteoConfig(num_embeddings=(3,) * 26))


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file\(s\): \['.*nothing.tsv'\]"):
        read_criteo(tmp_path / "nothing.tsv", config=CriteoConfig(num_embeddings=3))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"the folder .*empty has no files"):
        read_criteo(tmp_path / "empty", config=CriteoConfig(num_embeddings=3))
    with pytest.raises(FileNotFoundError, match=r"no such file\(s\): \(empty list\)"):
        read_criteo([], config=CriteoConfig(num_embeddings=3))
