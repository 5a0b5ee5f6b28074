"""A cache of a table's encoded split: each piece's rows of the split, encoded once, in a file
read back memory-mapped.

[Note: table cache]
``TableReader(..., cache=folder)`` (``shardkit train --table-cache folder``) keeps, for each
piece (see [Note: table pieces]), its rows of the reader's split as encoded columns (labels,
dense values, and per feature the lengths and ids: see [Note: encoded rows]) in one file,
``<folder>/<key>/<split>-<source>-<file>-<piece>.bin`` (a JSON header, then the arrays one
after another, each 8-byte aligned), written the first time a rank needs
that piece (to a temporary name, then renamed: a reader sees a whole file or none, and two
ranks that both write a shared piece write the same bytes). Later epochs and later runs map the
file instead of parsing and encoding: a piece's rows are a slice of it, so any rank of any
world size uses what another wrote. ``<key>`` is a hash of everything the encoding depends on:
each file's path, size and modification time, the fitted schema (vocabularies, transforms),
the split and the pieces' counts. Changed files, another schema or split give another key, so
a stale entry is never read (old keys' folders stay until removed).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardkit.data._table_encoded import EncodedRows, feature_layout
from shardkit.data._table_scan import FILE, INDEX, NUM_TRAIN, NUM_VALIDATION, SOURCE, TableData
from shardkit.data._table_split import TRAIN

__all__ = ["SplitCache", "cache_key"]

_FORMAT = 2  # 2: the categorical features' ids as one matrix
_MAGIC = b"SKTC"

Run = tuple[int, int, int]


def cache_key(data: TableData) -> str:
    """A hash of what the encoded rows depend on (see [Note: table cache])."""
    files = [[str(f.path.resolve()), f.path.stat().st_size, f.path.stat().st_mtime_ns]
             for group in data.files for f in group]  # fmt: skip
    split = data.split
    described = [split.kind, split.seed, split.fraction, repr(split.cut),
                 sorted((k, repr(t), p) for k, (t, p) in split.cutoffs.items())]  # fmt: skip
    text = json.dumps([_FORMAT, files, data.fitted.to_dict(), described,
                       data.pieces.tolist()], sort_keys=True)  # fmt: skip
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


class SplitCache:
    """One rank's use of the cache of one split (see [Note: table cache])."""

    def __init__(self, folder: Path, data: TableData, want: int) -> None:
        self.data, self.want = data, want
        self.folder = folder / cache_key(data)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = "train" if want == TRAIN else "validation"
        self.column = NUM_TRAIN if want == TRAIN else NUM_VALIDATION
        self.written = 0  # pieces this process encoded and wrote
        self.layout = feature_layout(data.fitted)

    def path(self, piece: int) -> Path:
        row = self.data.pieces[piece].tolist()
        return self.folder / f"{self.name}-{row[SOURCE]}-{row[FILE]}-{row[INDEX]}.bin"

    def chunks(
        self, runs: list[Run], read: Callable[[list[Run]], Iterator[EncodedRows]]
    ) -> Iterator[EncodedRows]:
        """The runs' encoded rows: mapped from the cache, or read, written, then sliced."""
        for piece, skip, take in runs:
            path = self.path(piece)
            if path.exists():
                rows = load_rows(path, self.layout)
            else:
                whole = int(self.data.pieces[piece, self.column])
                rows = EncodedRows.cat(list(read([(piece, 0, whole)])))
                write_rows(path, rows)
                self.written += 1
            yield rows.slice(skip, skip + take)


def write_rows(path: Path, rows: EncodedRows) -> None:
    """``rows`` to ``path`` atomically: a temporary file in the same folder, then renamed."""
    arrays = [rows.labels.numpy(), rows.dense.numpy(), rows.single.numpy()]
    arrays += [t.numpy() for t in rows.lengths] + [t.numpy() for t in rows.ids]
    header = json.dumps({"format": _FORMAT, "rows": len(rows), "dense": rows.dense.shape[1],
                         "single": rows.single.shape[1], "features": len(rows.ids),
                         "ids": [len(t) for t in rows.ids]}).encode("utf-8")  # fmt: skip
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + len(header).to_bytes(8, "little") + header)
            f.write(b"\0" * (-f.tell() % 8))
            for array in arrays:  # each at a multiple of 8 bytes: int64 views stay aligned
                f.write(np.ascontiguousarray(array).tobytes())
                f.write(b"\0" * (-f.tell() % 8))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_rows(path: Path, layout: tuple[int, ...]) -> EncodedRows:
    """Rows written by `write_rows`, memory-mapped (copy on write: never changes the file):
    the tensors are views of one map of the file, no copy."""
    with path.open("rb") as f:
        start = f.read(12)
        if start[:4] != _MAGIC:
            raise ValueError(f"{path}: not a shardkit table cache file; remove it")
        header: dict[str, Any] = json.loads(f.read(int.from_bytes(start[4:], "little")))
        offset = f.tell() + (-f.tell() % 8)
    n, d, s, num_features = header["rows"], header["dense"], header["single"], header["features"]
    arrays: list[tuple[Any, tuple[int, ...]]] = [(np.float32, (n,)), (np.float32, (n, d)),
                                                 (np.int64, (n, s))]  # fmt: skip
    arrays += [(np.int64, (n,))] * num_features + [(np.int64, (k,)) for k in header["ids"]]
    whole = np.memmap(path, dtype=np.uint8, mode="c") if path.stat().st_size > offset else None
    tensors = []
    for dtype, shape in arrays:
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if size:
            assert whole is not None
            array = whole[offset : offset + size].view(dtype).reshape(shape)
            tensors.append(torch.from_numpy(array))
        else:
            tensors.append(torch.from_numpy(np.zeros(shape, dtype=dtype)))
        offset += size + (-size % 8)
    lengths = tuple(tensors[3 : 3 + num_features])
    ids = tuple(tensors[3 + num_features :])
    return EncodedRows(tensors[0], tensors[1], tensors[2], ids, lengths, layout)
