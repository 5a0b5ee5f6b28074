"""JSON lines for metric records: one object per line, written by rank 0, easy to plot."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

__all__ = ["JsonlWriter", "read_jsonl"]


class JsonlWriter:
    """Append metric records to a JSON-lines file; only rank 0 writes (the others no-op, so
    every rank can call ``write`` with the same, already-reduced values).

    Each record is one line, flushed at once, so a crashed or running job leaves a readable
    file; a resumed job appends to it. Values may be numbers, strings, bools, None, 0-d tensors,
    and lists or dicts of those; ``nan`` and infinities become ``null`` (strict JSON)::

        with JsonlWriter("runs/adult/metrics.jsonl") as log:
            log.write({"epoch": 0, "split": "validation", **metrics.compute()})

        # plot: rows = read_jsonl(path); xs = [r["epoch"] for r in rows if r["split"] == ...]

    Args:
        path: the file; its folder is created.
        rank: who writes: rank 0 does. Default: this process's rank in torch.distributed (0
            outside a process group).
    """

    def __init__(self, path: str | Path, *, rank: int | None = None) -> None:
        self.path = Path(path)
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = rank
        self._file: IO[str] | None = None
        if rank == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one line (rank 0; elsewhere nothing happens)."""
        if not isinstance(record, Mapping):
            raise TypeError(
                f"JsonlWriter.write: record must be a mapping (dict), got {type(record).__name__}"
            )
        line = json.dumps(_plain(record, "record"), allow_nan=False, sort_keys=False)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file, in order (blank lines skipped)."""
    records = []
    with Path(path).open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_number}: not a JSON object: {exc.msg}") from None
    return records


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON-ready Python data; non-finite floats become None."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"JsonlWriter.write: {where} is a tensor of shape {tuple(value.shape)}; write "
                "numbers (a 0-d or 1-element tensor), or convert with .tolist()"
            )
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"JsonlWriter.write: {where} is a {type(value).__name__}, which JSON cannot hold; write "
        "numbers, strings, bools, None, lists or dicts"
    )
