"""Criteo lines -> tensors: the two layouts, strict parsing, DLRM's transforms, id mapping.

[Note: Criteo layouts]
- ``CriteoFormat.TSV`` (Criteo Kaggle ``train.txt``, Terabyte ``day_0`` ... ``day_23``): 40
  tab-separated fields: the label (0 or 1), 13 integer counts ``int_0..int_12`` (may be negative
  or empty), 26 hashed categorical values ``cat_0..cat_25`` as hexadecimal (may be empty). Dense
  values become ``log(1 + max(x, 0))`` as in DLRM, empty ones 0.
- ``CriteoFormat.PADDLEREC`` (PaddleRec's samples): space-separated tokens ``click:<0|1>``, then
  13 ``dense_feature:<float>`` (already min-max normalised: used as they are), then
  ``<slot>:<decimal id>`` for slots 1..26 in any order, each at most once (slot ``s`` is
  ``cat_{s-1}``); a slot that is absent is an empty value.

Every line is checked completely (a regular expression per line, then the slow path only to say
which field is wrong): a wrong field count, a label that is not 0/1, a non-integer count, a
non-hexadecimal value is refused with file, line and field, never guessed. Blank lines are
skipped (files often end with one). An empty categorical value is ``Missing.ZERO`` (parsed as 0,
as TorchRec's and DLRM's preprocessing do) or ``Missing.EMPTY_BAG`` (no id for that feature).

Ids: ``IdMapping.MODULO`` takes the parsed value modulo the table's ``num_embeddings``;
``IdMapping.HASH`` takes a 64-bit mix of ``(hash_seed, feature index, value)`` modulo it (use it
when the raw values are not uniformly spread, or to give the 26 features different collisions).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from shardkit.data._hash import mix_tensor
from shardkit.data._tabular import MISSING_ID

__all__ = [
    "CATEGORICAL_KEYS",
    "DENSE_NAMES",
    "CriteoConfig",
    "CriteoFormat",
    "IdMapping",
    "LineError",
    "Missing",
    "ParsedLines",
    "map_ids",
    "parse_lines",
]

NUM_DENSE, NUM_CATEGORICAL = 13, 26
DENSE_NAMES = tuple(f"int_{i}" for i in range(NUM_DENSE))  # TorchRec's names
CATEGORICAL_KEYS = tuple(f"cat_{i}" for i in range(NUM_CATEGORICAL))
_MAX_ID = (1 << 63) - 1


class CriteoFormat(enum.Enum):
    """The line layout; see [Note: Criteo layouts]."""

    TSV = "tsv"
    PADDLEREC = "paddlerec"


class IdMapping(enum.Enum):
    """How a parsed categorical value becomes a row of its table."""

    MODULO = "modulo"
    HASH = "hash"


class Missing(enum.Enum):
    """What an empty categorical value becomes."""

    ZERO = "zero"
    EMPTY_BAG = "empty_bag"


@dataclass(frozen=True)
class CriteoConfig:
    """How to read Criteo lines (see [Note: Criteo layouts]).

    Args:
        num_embeddings: rows of every table (one int), or one per feature (26 ints).
        format: the line layout.
        id_mapping: modulo or hash of the parsed value.
        missing: what an empty categorical value becomes.
        hash_seed: the seed of ``IdMapping.HASH``.
    """

    num_embeddings: int | tuple[int, ...]
    format: CriteoFormat = CriteoFormat.TSV
    id_mapping: IdMapping = IdMapping.MODULO
    missing: Missing = Missing.ZERO
    hash_seed: int = 0

    def __post_init__(self) -> None:
        sizes = self.num_embeddings
        if isinstance(sizes, list):
            object.__setattr__(self, "num_embeddings", tuple(sizes))
            sizes = self.num_embeddings
        per_feature = sizes if isinstance(sizes, tuple) else (sizes,)
        if isinstance(sizes, tuple) and len(sizes) != NUM_CATEGORICAL:
            raise ValueError(
                f"CriteoConfig: num_embeddings has {len(sizes)} entries; give one int for all "
                f"tables or {NUM_CATEGORICAL}, one per categorical feature"
            )
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in per_feature):
            raise ValueError(f"CriteoConfig: num_embeddings must be ints >= 1, got {sizes!r}")
        for name, cls in (
            ("format", CriteoFormat),
            ("id_mapping", IdMapping),
            ("missing", Missing),
        ):
            if not isinstance(getattr(self, name), cls):
                raise TypeError(
                    f"CriteoConfig: {name} must be a {cls.__name__}, got {getattr(self, name)!r}; "
                    f"use one of {[f'{cls.__name__}.{m.name}' for m in cls]}"
                )

    @property
    def keys(self) -> tuple[str, ...]:
        """The 26 feature names, ``cat_0`` ... ``cat_25`` (TorchRec's)."""
        return CATEGORICAL_KEYS

    @property
    def num_dense(self) -> int:
        return NUM_DENSE

    @property
    def num_embeddings_per_feature(self) -> tuple[int, ...]:
        """The rows of each of the 26 tables."""
        sizes = self.num_embeddings
        return sizes if isinstance(sizes, tuple) else (sizes,) * NUM_CATEGORICAL


class LineError(ValueError):
    """A line that does not fit its layout; the reader adds the file and line number."""


@dataclass(frozen=True, eq=False)
class ParsedLines:
    """``n`` parsed lines: ``dense [n, 13]`` float32, ``ids [n, 26]`` int64 (table rows, -1 for an
    empty bag), ``labels [n]`` float32."""

    dense: torch.Tensor
    ids: torch.Tensor
    labels: torch.Tensor


# -- TSV -----------------------------------------------------------------------------------------

_TSV = re.compile(r"[01](?:\t(?:-?[0-9]+)?){13}(?:\t[0-9a-fA-F]*){26}")


def _parse_tsv(text: str) -> tuple[int, list[int], list[int]]:
    fields = text.split("\t")
    if not _TSV.fullmatch(text):
        _explain_tsv(fields)
    dense = [int(x) if x else 0 for x in fields[1:14]]
    values = [int(x, 16) if x else -1 for x in fields[14:]]
    if max(values) > _MAX_ID:
        _explain_tsv(fields)
    return int(fields[0]), dense, values


def _explain_tsv(fields: list[str]) -> None:
    if len(fields) != 1 + NUM_DENSE + NUM_CATEGORICAL:
        raise LineError(
            f"expected 40 tab-separated fields (label, 13 integer, 26 categorical), got "
            f"{len(fields)}"
        )
    if fields[0] not in ("0", "1"):
        raise LineError(f"field 1 (label) must be 0 or 1, got {fields[0]!r}")
    for i, text in enumerate(fields[1:14]):
        if not re.fullmatch(r"(?:-?[0-9]+)?", text):
            raise LineError(f"field {i + 2} ({DENSE_NAMES[i]}) must be an integer, got {text!r}")
    for i, text in enumerate(fields[14:]):
        if not re.fullmatch(r"[0-9a-fA-F]*", text) or (text and int(text, 16) > _MAX_ID):
            raise LineError(
                f"field {i + 15} ({CATEGORICAL_KEYS[i]}) must be hexadecimal below 2**63, got "
                f"{text!r}"
            )
    raise AssertionError(f"unexplained bad line {fields!r}")


# -- PaddleRec -----------------------------------------------------------------------------------

_FLOAT = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_PADDLE_TOKEN = re.compile(rf"(click):([01])|(dense_feature):({_FLOAT})|([0-9]+):([0-9]+)")


def _parse_paddlerec(text: str) -> tuple[int, list[float], list[int]]:
    tokens = text.split()
    if len(tokens) < 1 + NUM_DENSE:
        raise LineError(
            f"expected click:<0|1>, 13 dense_feature:<float> and up to 26 <slot>:<id> tokens, "
            f"got {len(tokens)} tokens"
        )
    label = _paddle_token(tokens[0], 1, "click")
    dense = [_paddle_float(t, i + 2) for i, t in enumerate(tokens[1:14])]
    values = [-1] * NUM_CATEGORICAL
    for position, token in enumerate(tokens[14:], start=15):
        match = _PADDLE_TOKEN.fullmatch(token)
        if match is None or match.group(5) is None or not 1 <= int(match.group(5)) <= 26:
            raise LineError(f"token {position} must be <slot>:<id> with slot 1..26, got {token!r}")
        slot, value = int(match.group(5)), int(match.group(6))
        if values[slot - 1] != -1:
            raise LineError(f"token {position}: slot {slot} appears twice; one id per slot")
        if value > _MAX_ID:
            raise LineError(f"token {position}: id {value} is not below 2**63")
        values[slot - 1] = value
    return int(label), dense, values


def _paddle_token(token: str, position: int, name: str) -> str:
    match = _PADDLE_TOKEN.fullmatch(token)
    group = {"click": 1, "dense_feature": 3}[name]
    if match is None or match.group(group) is None:
        kind = "0 or 1" if name == "click" else "a float"
        raise LineError(f"token {position} must be {name}:<{kind}>, got {token!r}")
    return match.group(group + 1)


def _paddle_float(token: str, position: int) -> float:
    value = float(_paddle_token(token, position, "dense_feature"))
    if not math.isfinite(value):
        raise LineError(f"token {position} must be a finite dense_feature, got {token!r}")
    return value


_Parser = Callable[[str], tuple[int, list[Any], list[int]]]
_PARSERS: dict[CriteoFormat, _Parser] = {
    CriteoFormat.TSV: _parse_tsv,
    CriteoFormat.PADDLEREC: _parse_paddlerec,
}


def parse_lines(
    lines: Sequence[str], config: CriteoConfig, where: Sequence[str] | None = None
) -> ParsedLines:
    """Parse ``lines`` (without their newline) of ``config.format`` into tensors.

    Args:
        lines: the ``n`` lines.
        config: layout, table sizes, id mapping.
        where: per line, ``"file:line"`` for error messages (default: its index).

    Raises:
        ValueError: ``"<where>: <what is wrong>"`` for the first bad line.
    """
    parse = _PARSERS[config.format]
    labels: list[int] = []
    dense: list[list[Any]] = []
    values: list[list[int]] = []
    for index, text in enumerate(lines):
        try:
            label, numbers, ids = parse(text)
        except LineError as exc:
            place = where[index] if where is not None else f"line {index}"
            raise ValueError(f"{place}: {exc}") from None
        labels.append(label)
        dense.append(numbers)
        values.append(ids)
    values_tensor = torch.tensor(values, dtype=torch.int64).view(-1, NUM_CATEGORICAL)
    return ParsedLines(
        dense=_dense(dense, config),
        ids=map_ids(values_tensor, config),
        labels=torch.tensor(labels, dtype=torch.float32),
    )


def _dense(rows: list[list[Any]], config: CriteoConfig) -> torch.Tensor:
    if config.format is CriteoFormat.PADDLEREC:
        return torch.tensor(rows, dtype=torch.float32).view(-1, NUM_DENSE)
    counts = torch.tensor(rows, dtype=torch.int64).view(-1, NUM_DENSE).clamp(min=0)  # [n, 13]
    return torch.log1p(counts.to(torch.float64)).to(torch.float32)


def map_ids(values: torch.Tensor, config: CriteoConfig) -> torch.Tensor:
    """``[n, 26]`` parsed values (-1 = empty) -> table rows (-1 = empty bag)."""
    missing = values < 0
    values = values.clamp(min=0)  # Missing.ZERO: an empty value is 0
    sizes = torch.tensor(config.num_embeddings_per_feature, dtype=torch.int64)  # [26]
    if config.id_mapping is IdMapping.HASH:
        feature = torch.arange(NUM_CATEGORICAL, dtype=torch.int64)
        mixed = mix_tensor(config.hash_seed, feature, values)
        values = (mixed >> 1) & _MAX_ID  # 63 non-negative bits
    ids = values % sizes
    if config.missing is Missing.EMPTY_BAG:
        ids[missing] = MISSING_ID
    return ids
