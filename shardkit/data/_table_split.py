"""Which rows of a table validate: a separate file, a seeded fraction, or a time split.

[Note: table splits]
A row is known by its position: its file (in the order of the training files) and its record
number in that file (0-based, counting every record, bad ones too; blank lines are not records).
``pos = first_record_of_file + record``.

- A validation file (``split.validation_path`` or ``--data-val-path``): every row of the
  training files trains, every row of the validation files validates.
- ``validation_fraction`` alone: a row validates when ``uniform(seed, stream, file, record) <
  fraction`` (a seeded hash: the same rows on every rank, run and machine).
- ``time_cut``: a row validates when its time is at or after the cut.
- ``time_column`` with ``validation_fraction``: the cut is the time below which ``1 - fraction``
  of the training files' rows fall (rows at the cut validate).
- ... and ``per``: for each value of that column (a user), its last ``round(fraction * n)`` of
  ``n`` rows by ``(time, pos)`` validate; users with fewer than ``0.5 / fraction`` rows only
  train. The fit holds every training row's time, position and user to sort them (about 24
  bytes per row and the users' names), gathered from every process that scanned.

Every rule is applied to a whole piece at once (`SplitRule.kinds`); ``pos`` is the record's
number over all training files, counted from the pieces' record counts.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shardkit.data._hash import uniform
from shardkit.data._table_schema import SplitSpec

__all__ = ["TRAIN", "VALIDATION", "SplitRule", "fit_times"]

TRAIN, VALIDATION = 0, 1
_SPLIT_STREAM = 0x5B117


@dataclass(frozen=True, eq=False)
class SplitRule:
    """The fitted split: ``kind`` is ``file``, ``fraction``, ``time`` or ``per``; ``cut`` the
    global time cut; ``cutoffs`` per ``per`` value the first validating ``(time, pos)``."""

    kind: str
    seed: int = 0
    fraction: float = 0.0
    cut: float = math.inf
    cutoffs: dict[str, tuple[float, int]] = field(default_factory=dict)

    @staticmethod
    def needs_times(spec: SplitSpec) -> bool:
        """Whether a first pass must collect times (a cut from a fraction)."""
        return (
            spec.validation_path is None and spec.time_column is not None and spec.time_cut is None
        )

    @staticmethod
    def without_times(spec: SplitSpec, *, seed: int, has_validation_files: bool) -> SplitRule:
        if has_validation_files:
            return SplitRule("file")
        if spec.time_cut is not None:
            return SplitRule("time", cut=spec.time_cut)
        return SplitRule("fraction", seed=seed, fraction=spec.validation_fraction)

    def block_kinds(self, file: int, record: int, count: int) -> list[int] | None:
        """The kinds of records ``record .. record + count - 1`` of a training file, at once,
        when they depend on the position only (a fraction split); else None."""
        if self.kind != "fraction":
            return None
        u = uniform(self.seed, _SPLIT_STREAM, file, torch.arange(record, record + count))
        return (u < self.fraction).long().tolist()

    def kind_of(self, file: int, record: int, pos: int, row: Any) -> int:
        """TRAIN or VALIDATION for a row of the training files (``row`` parsed)."""
        if self.kind == "fraction":
            kinds = self.block_kinds(file, record, 1)
            assert kinds is not None
            return kinds[0]
        if self.kind == "time":
            return int(row[3] >= self.cut)
        if self.kind == "per":
            cutoff = self.cutoffs.get(row[4])
            return int(cutoff is not None and (row[3], pos) >= cutoff)
        return TRAIN

    def kinds(self, source: int, file: int, keys: np.ndarray, times: np.ndarray | None,
              users: Any, positions: np.ndarray | None) -> np.ndarray:  # fmt: skip
        """TRAIN or VALIDATION (int64 ``[n]``) of a piece's rows: ``keys`` their record keys,
        ``times``/``users``/``positions`` what the rule needs (see [Note: table splits])."""
        n = len(keys)
        if source == 1 or self.kind == "file":
            return np.full(n, VALIDATION if source == 1 else TRAIN, dtype=np.int64)
        if self.kind == "fraction":
            u = uniform(self.seed, _SPLIT_STREAM, file, torch.from_numpy(keys.astype(np.int64)))
            return (u < self.fraction).numpy().astype(np.int64)
        assert times is not None
        if self.kind == "time":
            return (times >= self.cut).astype(np.int64)
        assert positions is not None and users is not None
        import pyarrow.compute as pc

        names, cut_times, cut_positions = self._cutoff_arrays
        found = pc.index_in(users, value_set=names).fill_null(-1).to_numpy()
        has = found >= 0
        at = np.where(has, found, 0)
        later = (times > cut_times[at]) | (
            (times == cut_times[at]) & (positions >= cut_positions[at])
        )
        return (has & later).astype(np.int64)

    @functools.cached_property
    def _cutoff_arrays(self) -> tuple[Any, np.ndarray, np.ndarray]:
        import pyarrow as pa

        names = pa.array(list(self.cutoffs), pa.string())
        values = list(self.cutoffs.values())
        times = np.array([t for t, _ in values] or [0.0], dtype=np.float64)
        positions = np.array([p for _, p in values] or [0], dtype=np.int64)
        return names, times, positions

    def describe(self) -> str:
        if self.kind == "fraction":
            return f"a seeded {self.fraction:.0%} of the rows validate"
        if self.kind == "time":
            return f"rows at or after time {self.cut:g} validate"
        if self.kind == "per":
            return f"the last rows by time of each of {len(self.cutoffs)} users validate"
        return "the validation files validate"


def _packed(codes: np.ndarray, times: np.ndarray, positions: np.ndarray
            ) -> tuple[np.ndarray, int, int, float] | None:  # fmt: skip
    """(user, time, position) packed into one int64 key each, when whole seconds, users and
    positions fit in 63 bits (MovieLens: 13 + 26 + 20): ``(keys, time bits, position bits,
    first time)``; else None."""
    if not len(times) or not bool(np.isfinite(times).all()):
        return None
    if not bool((times == np.floor(times)).all()):
        return None
    first = float(times.min())
    offset = times - first
    bits = [int(np.max(a, initial=0)).bit_length() for a in (codes, offset, positions)]
    if sum(bits) > 63:
        return None
    key = (codes << (bits[1] + bits[2])) | (offset.astype(np.int64) << bits[2]) | positions
    return key, bits[1], bits[2], first


def _by_user_time_position(codes: np.ndarray, times: np.ndarray, positions: np.ndarray
                           ) -> np.ndarray:  # fmt: skip
    """The rows' order by (user, time, position): one sort of packed integer keys (`_packed`),
    else three."""
    packed = _packed(codes, times, positions)
    if packed is not None:
        return np.argsort(packed[0])  # the keys are distinct: any sort gives the one order
    order = np.argsort(times, kind="stable")  # rows come in pos order: ties stay in it
    return order[np.argsort(codes[order], kind="stable")]


def _ranked(codes: np.ndarray, times: np.ndarray, positions: np.ndarray, ranks: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The time and position of the rows at ``ranks`` of the order by (user, time, position):
    for packed keys one sort of the keys themselves (no argsort), the picked keys unpacked."""
    packed = _packed(codes, times, positions)
    if packed is None:
        rows = _by_user_time_position(codes, times, positions)[ranks]
        return times[rows], positions[rows]
    key, time_bits, position_bits, first = packed
    key.sort()
    picked = key[ranks]
    offset = (picked >> position_bits) & ((1 << time_bits) - 1)
    return offset.astype(np.float64) + first, picked & ((1 << position_bits) - 1)


def fit_times(spec: SplitSpec, times: np.ndarray, users: Any, positions: np.ndarray) -> SplitRule:
    """The time split fitted from a fraction (see [Note: table splits]): ``times`` float64
    ``[N]`` of every good row of the training files, with (for ``per``) ``users`` (Arrow
    strings ``[N]``) and ``positions`` int64 ``[N]``, in any order."""
    fraction = spec.validation_fraction
    if not bool((positions[1:] > positions[:-1]).all()):  # pieces in file order need no sort
        order = np.argsort(positions, kind="stable")
        times, positions = times[order], positions[order]
        users = users.take(order) if users is not None else None
    if spec.per is None:
        train = math.ceil((1.0 - fraction) * len(times))  # rows before the cut
        cut = float(np.partition(times, train)[train]) if train < len(times) else math.inf
        return SplitRule("time", cut=cut)
    if not len(times):
        return SplitRule("per")
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(users)  # an Array: one dictionary
    codes = np.asarray(encoded.indices, dtype=np.int64)
    counts = np.bincount(codes, minlength=len(encoded.dictionary))
    starts = np.cumsum(counts) - counts
    last = np.floor(fraction * counts + 0.5).astype(np.int64)  # validating rows per user
    users_with = np.flatnonzero(last)
    ranks = starts[users_with] + counts[users_with] - last[users_with]
    cut_times, cut_positions = _ranked(codes, times, positions, ranks)
    names = encoded.dictionary.take(users_with).to_pylist()
    cutoffs = dict(zip(names, zip(cut_times.tolist(), cut_positions.tolist())))
    return SplitRule("per", cutoffs=cutoffs)
