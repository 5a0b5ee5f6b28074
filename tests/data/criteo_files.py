"""Generated Criteo TSV files for the reader tests (the fixtures are too short to span chunks)."""

from __future__ import annotations

import gzip
from pathlib import Path

import torch


def tsv_lines(num_lines: int, seed: int) -> list[str]:
    """Lines in the Kaggle layout with empty fields, negative counts and 8-digit hex values."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (num_lines,), generator=g).tolist()
    counts = torch.randint(-2, 500, (num_lines, 13), generator=g).tolist()
    values = torch.randint(0, 2**32, (num_lines, 26), generator=g).tolist()
    empty = (torch.rand(num_lines, 39, generator=g) < 0.1).tolist()
    lines = []
    for i in range(num_lines):
        dense = ["" if empty[i][j] else str(counts[i][j]) for j in range(13)]
        cats = ["" if empty[i][13 + j] else f"{values[i][j]:08x}" for j in range(26)]
        lines.append("\t".join([str(labels[i]), *dense, *cats]))
    return lines


def write_days(folder: Path, sizes: list[int], *, seed: int = 0) -> list[str]:
    """Files ``day_0``, ``day_1.gz``, ``day_2``, ... (every other one gzipped, one with a blank
    line at its end); returns every line in stream order."""
    folder.mkdir(parents=True, exist_ok=True)
    everything = []
    for day, size in enumerate(sizes):
        lines = tsv_lines(size, seed + day)
        text = "\n".join(lines) + ("\n\n" if day == 0 else "\n")
        if day % 2:
            (folder / f"day_{day}.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (folder / f"day_{day}").write_text(text)
        everything += lines
    return everything
