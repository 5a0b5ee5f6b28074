"""`scan_table`: read a user's table once before training: check every row, fit the schema on
the training split, fit the split, and index the files so each rank can read its own part.

[Note: table scan]
The scan runs once, before any rank trains (`shardkit train` runs it in the launching process;
under torchrun rank 0 runs it and broadcasts the result or its error). It reads every record
of the training files (twice for a time split fitted from a fraction: times first) and of the
validation files, and

- refuses bad input with one error naming file, line and column: a file without a needed
  column, an empty file, a ragged row, bytes that are not UTF-8, a label that is not binary
  (or that the rule cannot read), a dense value that is not a number, a time that is not a
  time; with ``skip_bad_rows`` it counts such rows instead (the readers skip them too);
- fits the schema on the training rows (`Fitter`), unless given a fitted one (resuming);
- refuses a split with no training or no validation rows, or one label only;
- indexes the files in blocks of `BLOCK_ROWS` records: where each block starts (byte offset,
  line, record) and how many training and validation rows it holds. A rank's part is a run of
  blocks (see `TableReader`), so every rank knows every rank's row counts without reading.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from shardkit.data._hash import mix_int
from shardkit.data._table_files import TableFile, list_table_files, open_table_files
from shardkit.data._table_fitted import FittedSchema, Fitter, table_order
from shardkit.data._table_rows import RowParser, RowProblem
from shardkit.data._table_schema import TableSchema
from shardkit.data._table_split import TRAIN, VALIDATION, SplitRule, TimeCollector

__all__ = ["BLOCK_ROWS", "TableData", "scan_table"]

logger = logging.getLogger(__name__)

BLOCK_ROWS = 64
# columns of `TableData.blocks`
SOURCE, FILE, OFFSET, LINE, RECORD, NUM_TRAIN, NUM_VALIDATION = range(7)
_MAX_REPORTED = 5


@dataclass(frozen=True, eq=False)
class TableData:
    """A scanned table: what every rank needs to read its part (see [Note: table scan]).

    Attributes:
        fitted: the fitted schema (vocabularies, table sizes, transforms).
        files: ``(training files, validation files)``; the second may be empty (validation
            rows are then in the training files).
        blocks: ``[num_blocks, 7]`` int64: source (0 training, 1 validation files), file,
            byte offset, line and record of the block's first record, training rows, validation
            rows.
        first_record: per training file, the position of its first record (see `SplitRule`).
        split: the fitted split.
        skipped: bad rows skipped (``skip_bad_rows``), and the first few as "file:line: why".
        seconds: how long the scan read (for the reading throughput).
    """

    fitted: FittedSchema
    files: tuple[tuple[TableFile, ...], tuple[TableFile, ...]]
    blocks: torch.Tensor
    first_record: tuple[int, ...]
    split: SplitRule
    skip_bad_rows: bool
    skipped: int
    skipped_examples: tuple[str, ...]
    seconds: float

    @property
    def num_rows(self) -> tuple[int, int]:
        """(training rows, validation rows)."""
        return int(self.blocks[:, NUM_TRAIN].sum()), int(self.blocks[:, NUM_VALIDATION].sum())

    def summary(self) -> str:
        train, validation = self.num_rows
        files = len(self.files[0]) + len(self.files[1])
        rows = train + validation + self.skipped
        line = (f"table: {train:,} training and {validation:,} validation rows from {files} "
                f"file(s) ({self.split.describe()}); read {rows:,} rows in {self.seconds:.1f} s "
                f"({rows / max(self.seconds, 1e-9):,.0f} rows/s, parsing and checking)")  # fmt: skip
        if self.skipped:
            line += f"; skipped {self.skipped:,} bad rows, e.g. {self.skipped_examples[0]}"
        return line


def scan_table(
    paths: Sequence[str | Path],
    schema: TableSchema | FittedSchema,
    *,
    validation_paths: Sequence[str | Path] = (),
    seed: int = 0,
    skip_bad_rows: bool = False,
) -> TableData:
    """Check, fit and index a table (see [Note: table scan]).

    Args:
        paths: the training files or folders (CSV/TSV, plain or gzip; Parquet).
        schema: the schema to fit, or a fitted one to use as it is (resuming).
        validation_paths: validation files or folders (else the schema's ``validation_path``,
            else validation rows come from the training files by the schema's split).
        seed: the seed of a fraction split.
        skip_bad_rows: skip and count bad rows instead of refusing the input.
    """
    fitted = schema if isinstance(schema, FittedSchema) else None
    spec = fitted.schema if fitted is not None else schema
    assert isinstance(spec, TableSchema)
    if not validation_paths and spec.split.validation_path is not None:
        validation_paths = [spec.split.validation_path]
    open_ = dict(needed=spec.needed, delimiter=spec.delimiter, names=spec.names)
    train_files = open_table_files(list_table_files(paths), **open_)  # type: ignore[arg-type]
    val_files: tuple[TableFile, ...] = ()
    if validation_paths:
        listed = list_table_files(validation_paths, what="validation data")
        val_files = open_table_files(listed, **open_)  # type: ignore[arg-type]
    scan = _Scan(spec, skip_bad_rows)
    start = time.perf_counter()
    rule = SplitRule.without_times(spec.split, seed=seed, has_validation_files=bool(val_files))
    if SplitRule.needs_times(spec.split):
        rule = scan.times(train_files)
    fitter = Fitter(spec) if fitted is None else None
    first = scan.index(train_files, 0, rule, fitter)
    scan.index(val_files, 1, rule, None)
    if fitter is not None:
        fitted = fitter.fit()
    assert fitted is not None
    data = TableData(fitted, (train_files, val_files), _tensor(scan.blocks),
                     first, rule, skip_bad_rows, scan.skipped, tuple(scan.examples),
                     time.perf_counter() - start)  # fmt: skip
    _check_rows(data, spec, fitter)
    logger.info(data.summary())
    return data


class _Scan:
    def __init__(self, schema: TableSchema, skip_bad_rows: bool) -> None:
        self.schema, self.skip_bad_rows = schema, skip_bad_rows
        keys = [c.name for columns in table_order(schema).values() for c in columns]
        self.parser = RowParser(schema, schema.needed, keys)
        self.blocks: list[list[int]] = []
        self.skipped, self.examples = 0, list[str]()

    def rows(self, files: Sequence[TableFile], *, count_skipped: bool = True):
        """``(file index, record, line, offset, parsed row or None)`` of every record."""
        for index, file in enumerate(files):
            record = -1
            for record, (line, offset, values, problem) in enumerate(file.records()):
                parsed = None
                try:
                    if problem is not None:
                        raise RowProblem(*problem)
                    parsed = self.parser.parse(values)
                except RowProblem as exc:
                    self._bad(exc.where(f"{file.path}:{line}"), count_skipped)
                yield index, record, line, offset, parsed
            if record < 0:
                raise ValueError(f"{file.path}: no rows after the header; give a file with rows "
                                 "(or leave this one out)")  # fmt: skip

    def _bad(self, message: str, count: bool) -> None:
        if not self.skip_bad_rows:
            raise ValueError(
                f"{message} (skip_bad_rows, --skip-bad-rows, skips and counts such rows)"
            )
        if count:
            self.skipped += 1
            if len(self.examples) < _MAX_REPORTED:
                self.examples.append(message)

    def times(self, files: Sequence[TableFile]) -> SplitRule:
        """A first pass: every good row's time (and user), to fit the time split."""
        collector = TimeCollector(self.schema.split)
        for pos, (_, _, _, _, parsed) in enumerate(self.rows(files, count_skipped=False)):
            if parsed is not None:
                collector.add(parsed[3], parsed[4], pos)
        return collector.fit()

    def index(
        self, files: Sequence[TableFile], source: int, rule: SplitRule, fitter: Fitter | None
    ) -> tuple[int, ...]:
        """Index (and fit on) every record; returns each file's first position."""
        firsts, kinds = [], None
        sample = fitter is not None and fitter.samples
        for pos, (file, record, line, offset, parsed) in enumerate(self.rows(files)):
            if record == 0:
                firsts.append(pos)
            if record % BLOCK_ROWS == 0:
                self.blocks.append([source, file, offset, line - 1, record, 0, 0])
                kinds = rule.block_kinds(file, record, BLOCK_ROWS) if source == 0 else None
            if parsed is None:
                continue
            if source == 1:
                kind = VALIDATION
            elif kinds is not None:
                kind = kinds[record % BLOCK_ROWS]
            else:
                kind = rule.kind_of(file, record, pos, parsed)
            self.blocks[-1][NUM_TRAIN + kind] += 1
            if kind == TRAIN and fitter is not None:
                fitter.add(parsed, mix_int(file, record) if sample else 0)
        return tuple(firsts)


def _check_rows(data: TableData, schema: TableSchema, fitter: Fitter | None) -> None:
    train, validation = data.num_rows
    if not train or not validation:
        raise ValueError(f"{schema.source}: the split leaves {train} training and {validation} "
                         f"validation rows ({data.split.describe()}); both need rows: change "
                         "the split (validation_fraction, time_cut) or the data")  # fmt: skip
    if fitter is not None and fitter.positives in (0, fitter.rows):
        value = int(fitter.positives > 0)
        raise ValueError(f"{schema.source}: label '{schema.label}' is {value} on all {train} "
                         "training rows: a model needs both labels; change the rule or the "
                         "split")  # fmt: skip


def _tensor(blocks: list[list[int]]) -> torch.Tensor:
    return torch.tensor(blocks, dtype=torch.int64).view(-1, 7)
