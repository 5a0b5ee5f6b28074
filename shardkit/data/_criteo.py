"""`CriteoReader`: Criteo files streamed in global batches with bounded memory; `read_criteo`
for small files held whole.

[Note: streaming Criteo]
The files (one, a folder's, or a list; plain or gzip) are one stream of examples in file order;
blank lines are skipped. Global batch ``g`` is examples ``[g * G, (g + 1) * G)`` of that stream
and rank ``r`` gets its share (see [Note: global batch]), so N ranks read what one process with
batch ``G`` reads. There is no shuffle: Criteo's days are read in order, as in DLRM.

Every rank reads every line but parses only its own: it holds the current global batch's lines
(``G`` strings), and its own lines of up to ``chunk_batches`` global batches waiting to be parsed
together; nothing else. Each rank checks the field count of every line (cheap), so a line with
the wrong number of fields stops all ranks at the same batch; a bad value inside a line is found
by the rank that parses it (the launcher then stops the others: ``RankFailedError``).

Resuming skips the examples consumed before (reading them again: O(position) time, constant
memory).
"""

from __future__ import annotations

import gzip
import itertools
import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from shardkit.data._batch import Batch
from shardkit.data._criteo_format import (
    CATEGORICAL_KEYS,
    CriteoConfig,
    CriteoFormat,
    parse_lines,
)
from shardkit.data._global_batch import (
    LastBatch,
    RankShare,
    check_batching,
    rank_share,
    resolve_rank,
)
from shardkit.data._position import Position
from shardkit.data._tabular import TabularDataset, batch_from_ids

__all__ = ["CriteoReader", "list_files", "read_criteo"]

logger = logging.getLogger(__name__)

_NUM_TABS = 39


# A line: (text without newline, index of its file in the reader's files, 1-based line number).
# A plain tuple: every rank makes one per line of the data set.
_Line = tuple[str, int, int]


def list_files(path: str | Path | Sequence[str | Path]) -> tuple[Path, ...]:
    """The files of ``path``: a file; a folder's visible files in natural order (``day_2``
    before ``day_10``); or a list, in its order."""
    if isinstance(path, (str, Path)):
        path = Path(path)
        if path.is_dir():
            files = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
            if not files:
                raise FileNotFoundError(f"Criteo: the folder {path} has no files; give a folder "
                                        "of Criteo files, a file, or a list of files")  # fmt: skip
            return tuple(sorted(files, key=_natural_key))
        paths = [path]
    else:
        paths = [Path(p) for p in path]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        raise FileNotFoundError(f"Criteo: no such file(s): {missing or '(empty list)'}")
    return tuple(paths)


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _open_text(path: Path) -> IO[str]:
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    if gzipped:
        return gzip.open(path, "rt", encoding="utf-8", newline="\n")
    return path.open("r", encoding="utf-8", newline="\n")


def _lines(files: Sequence[Path]) -> Iterator[_Line]:
    """Every non-blank line of ``files``, newline stripped, one at a time."""
    for index, path in enumerate(files):
        with _open_text(path) as f:
            for number, text in enumerate(f, start=1):
                text = text.rstrip("\r\n")
                if text.strip():
                    yield (text, index, number)


def read_criteo(path: str | Path | Sequence[str | Path], *, config: CriteoConfig) -> TabularDataset:
    """Every example of ``path`` in memory, in order (for samples and small files; stream big
    ones with `CriteoReader`)."""
    files = list_files(path)
    lines = list(_lines(files))
    parsed = parse_lines([text for text, _, _ in lines], config,
                         [f"{files[file]}:{number}" for _, file, number in lines])  # fmt: skip
    return TabularDataset(keys=CATEGORICAL_KEYS, dense=parsed.dense, ids=parsed.ids,
                          labels=parsed.labels)  # fmt: skip


class CriteoReader:
    """This rank's batches of Criteo files, streamed (see [Note: streaming Criteo])::

        config = CriteoConfig(num_embeddings=10_000_000, id_mapping=IdMapping.HASH)
        reader = CriteoReader("/data/criteo/terabyte", config=config, batch_size=4096)
        for batch in reader:      # one epoch of every file
            ...

    Memory: at most ``batch_size * (world_size + chunk_batches)`` lines at a time.

    Args:
        path: a file, a folder of files, or a list of files (plain or gzip, detected by content).
        config: layout, table sizes, id mapping (`CriteoConfig`).
        batch_size: ``B``, examples per rank per step.
        rank, world_size: this rank and the number of ranks; both None: from torch.distributed
            if initialised, else a single process.
        last_batch: what to do with a partial last global batch (`LastBatch`).
        chunk_batches: global batches whose lines are parsed together (fewer, larger tensor
            conversions; more memory).
    """

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        config: CriteoConfig,
        batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
        last_batch: LastBatch = LastBatch.DROP,
        chunk_batches: int = 8,
    ) -> None:
        self.rank, self.world_size = resolve_rank("CriteoReader", rank, world_size)
        check_batching("CriteoReader", batch_size, last_batch)
        if not isinstance(chunk_batches, int) or chunk_batches < 1:
            raise ValueError(
                f"CriteoReader: chunk_batches must be an int >= 1, got {chunk_batches!r}"
            )
        if not isinstance(config, CriteoConfig):
            raise TypeError(
                f"CriteoReader: config must be a CriteoConfig, got {type(config).__name__}"
            )
        self.files = list_files(path)
        self.config = config
        self.batch_size = batch_size
        self.last_batch = last_batch
        self.chunk_batches = chunk_batches
        self._position = Position()
        logger.info(
            "CriteoReader: %d file(s) from %s, rank %d of %d, batch %d",
            len(self.files), self.files[0], self.rank, self.world_size, batch_size,
        )  # fmt: skip

    @property
    def keys(self) -> tuple[str, ...]:
        """The 26 feature names, ``cat_0`` ... ``cat_25``."""
        return CATEGORICAL_KEYS

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    @property
    def epoch(self) -> int:
        return self._position.epoch

    def __iter__(self) -> Iterator[Batch]:
        lines = _lines(self.files)
        from_start = self._position.examples == 0
        for _ in itertools.islice(lines, self._position.examples):
            pass  # skip what was consumed before (see [Note: resuming])
        pending: list[tuple[list[_Line], RankShare, int]] = []
        while True:
            global_batch = list(itertools.islice(lines, self.global_batch_size))
            self._check_structure(global_batch)
            size = len(global_batch)
            last = size < self.global_batch_size
            if size and not (last and self.last_batch is LastBatch.DROP):
                pending.append(self._own_lines(global_batch))
            if pending and (last or len(pending) == self.chunk_batches):
                yield from self._parse(pending)
                pending = []
            if last:
                break
        if from_start and self._position.examples == 0:
            self._raise_no_batch()
        self._position.next_epoch()

    def _raise_no_batch(self) -> None:
        files = [str(p) for p in self.files]
        if self.last_batch is not LastBatch.DROP:
            raise ValueError(
                f"CriteoReader: {files} hold no examples; give files with Criteo lines"
            )
        raise ValueError(
            f"CriteoReader: {files} hold no full global batch of batch_size * world_size = "
            f"{self.global_batch_size} examples and last_batch is DROP; give more data, a "
            "smaller batch_size, or last_batch=LastBatch.PAD"
        )

    def _own_lines(self, global_batch: list[_Line]) -> tuple[list[_Line], RankShare, int]:
        share = rank_share(len(global_batch), batch_size=self.batch_size, rank=self.rank,
                           world_size=self.world_size, last_batch=self.last_batch)  # fmt: skip
        own = global_batch[share.start : share.stop]
        own += [global_batch[i % len(global_batch)] for i in range(share.num_padding)]
        return own, share, len(global_batch)

    def _parse(self, pending: list[tuple[list[_Line], RankShare, int]]) -> Iterator[Batch]:
        """Parse the pending global batches' own lines at once; yield their batches."""
        lines = [line for own, _, _ in pending for line in own]
        where = [f"{self.files[file]}:{number}" for _, file, number in lines]
        parsed = parse_lines([text for text, _, _ in lines], self.config, where)
        start = 0
        for own, share, size in pending:
            rows = slice(start, start + len(own))
            start += len(own)
            weights = share.weights() if self.last_batch is LastBatch.PAD else None
            batch = batch_from_ids(parsed.dense[rows], ids=parsed.ids[rows],
                                   labels=parsed.labels[rows], keys=CATEGORICAL_KEYS,
                                   weights=weights)  # fmt: skip
            self._position.examples += size
            yield batch

    def _check_structure(self, global_batch: list[_Line]) -> None:
        if self.config.format is not CriteoFormat.TSV:
            return  # PaddleRec lines have no fixed token count; the parsing rank checks them
        for text, file, number in global_batch:
            if text.count("\t") != _NUM_TABS:
                raise ValueError(
                    f"{self.files[file]}:{number}: expected 40 tab-separated fields (label, 13 "
                    f"integer, 26 categorical), got {text.count(chr(9)) + 1}"
                )

    def state_dict(self) -> dict[str, Any]:
        """Epoch and examples consumed (see [Note: resuming]) and the files' names."""
        return {**self._position.state_dict(), "global_batch_size": self.global_batch_size,
                "files": [p.name for p in self.files]}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off: the next ``iter()`` skips what was consumed."""
        self._position.load_state_dict("CriteoReader", state,
                                       expected={"files": [p.name for p in self.files]},
                                       global_batch_size=self.global_batch_size)  # fmt: skip
        logger.info("CriteoReader resumes at epoch %d after %d examples",
                    self._position.epoch, self._position.examples)  # fmt: skip
