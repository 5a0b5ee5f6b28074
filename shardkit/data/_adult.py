"""UCI Adult (census income): 8 categorical features, 6 dense, a binary label.

[Note: Adult features]
- The split: row ``i`` of the file gets the key ``mix_int(seed, i)`` (see [Note: counter-based
  randomness]); the ``round(validation_fraction * N)`` rows with the smallest keys are the
  validation split, the rest the training split, each in file order. A pure function of
  ``(seed, N)``: the same on every machine and torch release.
- Each categorical column is one feature (and one table). Its vocabulary is the sorted set of
  values seen in the *training* split; value ``vocabulary[k]`` gets id ``k + 2``. Two ids are
  reserved: ``MISSING_ID = 0`` for a missing value (``?`` or empty) and ``UNKNOWN_ID = 1`` for a
  value the training split never had (only the validation split can have those). A table needs
  ``len(vocabulary) + 2`` rows.
- Dense: ``age, fnlwgt, educational-num, capital-gain, capital-loss, hours-per-week``; the
  heavy-tailed ``capital-gain`` and ``capital-loss`` become ``log(1 + x)``; then every column is
  standardised with the training split's mean and (population) standard deviation.
- Label: ``income`` ``>50K`` is 1.0, ``<=50K`` is 0.0 (a trailing ``.``, as in the original test
  file, is ignored); anything else is refused with the file and line.
"""

from __future__ import annotations

import csv
import gzip
import io
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch

from shardkit.data._hash import mix_int
from shardkit.data._tabular import TabularDataset

__all__ = ["ADULT_PATH", "AdultData", "load_adult"]

logger = logging.getLogger(__name__)

ADULT_PATH = Path(__file__).resolve().parents[2] / "data" / "adult" / "adult.csv.gz"
CATEGORICAL = ("workclass", "education", "marital-status", "occupation", "relationship", "race",
               "gender", "native-country")  # fmt: skip
NUMERIC = ("age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week")
LOG_COLUMNS = ("capital-gain", "capital-loss")
LABEL = "income"
MISSING_ID, UNKNOWN_ID, NUM_RESERVED_IDS = 0, 1, 2
_MISSING = ("?", "")
_LABELS = {">50K": 1.0, "<=50K": 0.0}


@dataclass(frozen=True, eq=False)  # holds tensors: compare by identity
class AdultData:
    """The Adult splits and what a model needs to know about them (see [Note: Adult features]).

    Attributes:
        train, validation: the two splits (``F = 8`` ids and ``D = 6`` dense columns each).
        keys: the feature names, the categorical column names (``F``).
        num_embeddings_per_feature: rows each feature's table needs (vocabulary + 2 reserved).
        vocabularies: per feature, the values of ids ``2, 3, ...``.
        dense_names: the dense column names (``D``).
        dense_mean, dense_std: the training split's statistics used to standardise them.
        validation_rows: ``[N_val]`` int64, the file rows (0-based, header excluded) of the
            validation split, in order.
    """

    train: TabularDataset
    validation: TabularDataset
    keys: tuple[str, ...]
    num_embeddings_per_feature: tuple[int, ...]
    vocabularies: dict[str, tuple[str, ...]]
    dense_names: tuple[str, ...]
    dense_mean: tuple[float, ...]
    dense_std: tuple[float, ...]
    validation_rows: torch.Tensor

    @property
    def num_dense(self) -> int:
        return len(self.dense_names)


def load_adult(
    path: str | Path | None = None, *, seed: int = 0, validation_fraction: float = 0.2
) -> AdultData:
    """Read Adult from a CSV file (plain or ``.gz``, with a header naming the columns).

    Args:
        path: the file; default: the copy vendored in shardkit's repository (``ADULT_PATH``).
        seed: the split's seed (the same on every rank).
        validation_fraction: the share of rows in the validation split, in ``(0, 1)``.

    Returns:
        The splits, vocabularies and table sizes; see [Note: Adult features].
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(
            f"load_adult: validation_fraction must be in (0, 1), got {validation_fraction}"
        )
    path = Path(path) if path is not None else ADULT_PATH
    header, rows = _read_rows(path)
    columns = _column_index(path, header)
    labels = torch.tensor([_label(path, line, row[columns[LABEL]]) for line, row in rows])
    validation_rows, train_rows = _split(len(rows), seed=seed, fraction=validation_fraction)
    texts = [row for _, row in rows]
    vocabularies = {
        name: _vocabulary(texts, columns[name], train_rows.tolist()) for name in CATEGORICAL
    }
    ids = _ids(texts, columns, vocabularies)  # [N, F]
    raw = _numeric(path, rows, columns)  # [N, D] float64
    mean, std = _standardise(raw, train_rows)
    dense = ((raw - mean) / std).float()
    sizes = tuple(len(vocabularies[k]) + NUM_RESERVED_IDS for k in CATEGORICAL)
    data = AdultData(
        train=_subset(dense, ids, labels, train_rows),
        validation=_subset(dense, ids, labels, validation_rows),
        keys=CATEGORICAL,
        num_embeddings_per_feature=sizes,
        vocabularies=vocabularies,
        dense_names=NUMERIC,
        dense_mean=tuple(mean.tolist()),
        dense_std=tuple(std.tolist()),
        validation_rows=validation_rows,
    )
    logger.info(
        "Adult from %s: %d train / %d validation examples (seed %d), tables %s",
        path, len(train_rows), len(validation_rows), seed,
        dict(zip(data.keys, data.num_embeddings_per_feature)),
    )  # fmt: skip
    return data


def _read_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and ``(line number, stripped fields)`` of every non-empty row."""
    if not path.is_file():
        raise FileNotFoundError(
            f"load_adult: no file at {path}; shardkit's repository vendors Adult under "
            "data/adult/adult.csv.gz, pass path= to a copy of it"
        )
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    reader = csv.reader(io.StringIO(raw.decode("utf-8")))
    header = [name.strip() for name in next(reader, [])]
    rows = []
    for row in reader:
        if not any(row):
            continue  # blank lines (the original files end with one)
        if len(row) != len(header):
            raise ValueError(
                f"{path}:{reader.line_num}: expected {len(header)} comma-separated fields as in "
                f"the header, got {len(row)}; fix or remove the line"
            )
        rows.append((reader.line_num, list(map(str.strip, row))))
    return header, rows


def _column_index(path: Path, header: list[str]) -> dict[str, int]:
    needed = (*CATEGORICAL, *NUMERIC, LABEL)
    missing = [name for name in needed if name not in header]
    if missing:
        raise ValueError(
            f"{path}:1: the header lacks the columns {missing} (it has {header}); Adult needs "
            f"{list(needed)}"
        )
    return {name: header.index(name) for name in needed}


def _label(path: Path, line: int, text: str) -> float:
    label = _LABELS.get(text.rstrip("."))
    if label is None:
        raise ValueError(
            f"{path}:{line}: column {LABEL!r} must be '>50K' or '<=50K' (a trailing '.' is "
            f"allowed), got {text!r}"
        )
    return label


def _split(num_rows: int, *, seed: int, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(validation rows, train rows)``, each sorted; see [Note: Adult features]."""
    keys = sorted(range(num_rows), key=lambda row: mix_int(seed, row))
    num_validation = round(fraction * num_rows)
    validation = torch.tensor(sorted(keys[:num_validation]), dtype=torch.int64)
    train = torch.tensor(sorted(keys[num_validation:]), dtype=torch.int64)
    return validation, train


def _vocabulary(rows: list[list[str]], column: int, train_rows: list[int]) -> tuple[str, ...]:
    return tuple(sorted({rows[r][column] for r in train_rows} - set(_MISSING)))


def _ids(
    rows: list[list[str]], columns: dict[str, int], vocabularies: dict[str, tuple[str, ...]]
) -> torch.Tensor:
    per_feature = []
    for name in CATEGORICAL:
        lookup = {value: k + NUM_RESERVED_IDS for k, value in enumerate(vocabularies[name])}
        lookup.update(dict.fromkeys(_MISSING, MISSING_ID))
        column = columns[name]
        per_feature.append([lookup.get(row[column], UNKNOWN_ID) for row in rows])
    return torch.tensor(per_feature, dtype=torch.int64).t().contiguous()  # [N, F]


def _numeric(
    path: Path, rows: list[tuple[int, list[str]]], columns: dict[str, int]
) -> torch.Tensor:
    index = [columns[name] for name in NUMERIC]
    try:
        values = [[float(row[i]) for i in index] for _, row in rows]
        dense = torch.tensor(values, dtype=torch.float64)  # [N, D]
        if not bool(torch.isfinite(dense).all()):
            raise ValueError
    except ValueError:
        _raise_not_a_number(path, rows, columns)
    for name in LOG_COLUMNS:
        dense[:, NUMERIC.index(name)] = torch.log1p(dense[:, NUMERIC.index(name)].clamp(min=0))
    return dense


def _raise_not_a_number(
    path: Path, rows: list[tuple[int, list[str]]], columns: dict[str, int]
) -> NoReturn:
    for line, row in rows:
        for name in NUMERIC:
            text = row[columns[name]]
            try:
                if math.isfinite(float(text)):
                    continue
            except ValueError:
                pass
            raise ValueError(
                f"{path}:{line}: column {name!r} must be a finite number, got {text!r}"
            )
    raise AssertionError("no bad number found")


def _standardise(raw: torch.Tensor, train_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    train = raw[train_rows]
    mean = train.mean(dim=0)
    std = train.std(dim=0, correction=0)
    return mean, torch.where(std > 0, std, torch.ones_like(std))


def _subset(
    dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor
) -> TabularDataset:
    return TabularDataset(keys=CATEGORICAL, dense=dense[rows], ids=ids[rows], labels=labels[rows])
