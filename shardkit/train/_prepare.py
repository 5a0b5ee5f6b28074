"""What a run checks and reads before any rank trains: data paths, the checkpoint to resume
from, and a table's scan (every row checked, the schema fitted).

[Note: refusing input before ranks start]
`prepare` runs in the process that starts the ranks (`run` before `spawn`), so a missing file,
a bad row or a corrupted checkpoint is one error from one process, before any rank starts and
before anything is written to the checkpoint directory (that process scans a table with a
thread per core). Under torchrun there is no such process: rank 0 prepares and broadcasts the
result or its error, and every rank raises that error (`prepare_on_ranks`), before any other
collective; then every rank (on every host) scans its own pieces of a table and the ranks
merge (`scan_table(parallel=True)`), raising a bad row's error on every rank alike.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from shardkit import comm
from shardkit.checkpoint import CheckpointError, read_extra
from shardkit.data import FittedSchema, TableData, TableReader, load_schema, scan_table
from shardkit.train._config import DataSource, TrainConfig
from shardkit.train._resume import resume_point

__all__ = ["Prepared", "prepare", "prepare_on_ranks"]

logger = logging.getLogger(__name__)

_REFUSALS = (ValueError, FileNotFoundError, CheckpointError)


@dataclass(frozen=True, eq=False)
class Prepared:
    """The checkpoint to resume from (verified) and, for table data, the scanned table."""

    resume_from: Path | None = None
    table: TableData | None = None


def prepare(config: TrainConfig, world_size: int, *, scan: bool = True) -> Prepared:
    """Check and read what the ranks will need (see [Note: refusing input before ranks
    start]); raises ValueError, FileNotFoundError or CheckpointError. ``scan=False`` leaves
    a table's scan to the ranks (`prepare_on_ranks`)."""
    for path in (*config.data_path, *config.data_val_path, config.schema):
        if path is not None and not path.exists():
            raise FileNotFoundError(f"{path} does not exist (--data-path, --data-val-path and "
                                    "--schema name local files or folders)")  # fmt: skip
    resume = resume_point(config)
    table = None
    if scan and config.data is DataSource.TABLE:
        table = _scan(config, resume, world_size)
    return Prepared(resume, table)


def prepare_on_ranks(config: TrainConfig, rank: int, world_size: int) -> Prepared:
    """`prepare` on rank 0, its result (or error) on every rank; then a table is scanned by
    every rank, each its own pieces (`scan_table(parallel=True)`), and a refusal of it is
    raised by every rank alike."""
    result: tuple[Prepared | None, BaseException | None] = (None, None)
    if rank == 0:
        try:
            result = (prepare(config, world_size, scan=False), None)
        except _REFUSALS as exc:
            result = (None, exc)
    prepared, error = comm.broadcast_object(result, src=0)
    if error is not None:
        raise error
    assert prepared is not None
    if config.data is DataSource.TABLE:
        table = _scan(config, prepared.resume_from, world_size, parallel=True)
        prepared = Prepared(prepared.resume_from, table)
    return prepared


def _scan(
    config: TrainConfig, resume: Path | None, world_size: int, *, parallel: bool = False
) -> TableData:
    schema = _schema(config, resume)
    data = scan_table(config.data_path, schema, validation_paths=config.data_val_path,
                      seed=config.seed, skip_bad_rows=config.skip_bad_rows,
                      parallel=parallel)  # fmt: skip
    for split in ("train", "validation"):  # too little data for the batches: refuse it now
        TableReader(data, split=split, batch_size=config.batch_size, rank=0, world_size=world_size)
    return data


def _schema(config: TrainConfig, resume: Path | None):
    """A resumed run's fitted schema (its tables must keep their rows), else the file's."""
    if resume is not None:
        saved = read_extra(resume).get("schema")
        if saved is not None:
            logger.info("using the fitted schema of %s (its vocabularies and transforms)", resume)
            return FittedSchema.from_dict(saved, source=f"{resume} (fitted schema)")
        logger.warning("%s holds no fitted schema (imported?): fitting the schema on the data "
                       "again; its tables must have the checkpoint's sizes", resume)  # fmt: skip
    assert config.schema is not None
    if config.schema.suffix.lower() == ".json":
        try:
            data = json.loads(config.schema.read_text(encoding="utf-8"))
        except ValueError:
            data = None  # load_schema says what is wrong, naming the file
        if isinstance(data, dict) and "tables" in data and "format" in data:
            return FittedSchema.from_dict(data, source=str(config.schema))
    return load_schema(config.schema)
