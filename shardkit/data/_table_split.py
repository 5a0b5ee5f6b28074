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
  train. The fit holds 24 bytes per row to sort them.
"""

from __future__ import annotations

import array
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from shardkit.data._hash import uniform
from shardkit.data._table_schema import SplitSpec

__all__ = ["TRAIN", "VALIDATION", "SplitRule", "TimeCollector"]

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

    def describe(self) -> str:
        if self.kind == "fraction":
            return f"a seeded {self.fraction:.0%} of the rows validate"
        if self.kind == "time":
            return f"rows at or after time {self.cut:g} validate"
        if self.kind == "per":
            return f"the last rows by time of each of {len(self.cutoffs)} users validate"
        return "the validation files validate"


class TimeCollector:
    """Collects ``(time, user)`` of every good row of the training files (in file order) and
    fits the cut or the per-user cutoffs (see [Note: table splits])."""

    def __init__(self, spec: SplitSpec) -> None:
        self.spec = spec
        self.times = array.array("d")
        self.positions = array.array("q")
        self.users = array.array("q")
        self.user_ids: dict[str, int] = {}

    def add(self, time: float, user: str | None, pos: int) -> None:
        self.times.append(time)
        self.positions.append(pos)
        if self.spec.per is not None:
            self.users.append(self.user_ids.setdefault(user or "", len(self.user_ids)))

    def fit(self) -> SplitRule:
        fraction = self.spec.validation_fraction
        times = _tensor(self.times, torch.float64)
        if self.spec.per is None:
            train = math.ceil((1.0 - fraction) * len(times))  # rows before the cut
            cut = float(times.kthvalue(train + 1).values) if train < len(times) else math.inf
            return SplitRule("time", cut=cut)
        return SplitRule("per", cutoffs=self._per_user(times, fraction))

    def _per_user(self, times: torch.Tensor, fraction: float) -> dict[str, tuple[float, int]]:
        users = _tensor(self.users, torch.int64)
        positions = _tensor(self.positions, torch.int64)
        order = torch.argsort(times, stable=True)  # rows are in pos order: ties stay in it
        order = order[torch.argsort(users[order], stable=True)]  # by user, then (time, pos)
        counts = torch.bincount(users, minlength=len(self.user_ids))  # [U]
        starts = torch.cumsum(counts, 0) - counts
        names = list(self.user_ids)
        cutoffs = {}
        for user, (start, n) in enumerate(zip(starts.tolist(), counts.tolist())):
            k = math.floor(fraction * n + 0.5)
            if k:
                row = int(order[start + n - k])
                cutoffs[names[user]] = (float(times[row]), int(positions[row]))
        return cutoffs


def _tensor(values: array.array, dtype: torch.dtype) -> torch.Tensor:
    return torch.frombuffer(values, dtype=dtype) if len(values) else torch.zeros(0, dtype=dtype)
