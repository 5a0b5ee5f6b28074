"""bench_ebc.py's two floors: what a step must move at copy bandwidth, and at gather speed.

[Note: the EBC step's floors]
- **copy floor** (`floor_bytes` / `copy_bandwidth`): the bytes an EBC step cannot avoid moving,
  if every repeated row were a cache hit, at single-thread ``memcpy`` bandwidth (256 MB, far
  beyond any cache): the ids, read in forward and in backward (8 B each); every unique row read
  in forward and read and written in backward; its row-wise Adagrad state (4 B) read and written;
  the pooled rows written and their gradient read. It leaves out the loss's own traffic and the
  offsets (8 B a bag). It is a bound no lookup reaches: rows are read at random addresses, and a
  row repeated in the batch is rarely still in cache when it comes round again.
- **gather floor** (`gather_floor_ms`): the same step's random accesses timed on this machine
  with torch's own kernel (``F.embedding_bag``, one thread): one pass that sums the table row of
  every id of the batch (forward's accesses), one that sums the gradient row of every id in row
  order (the gradient gather of a backward that groups by row), plus the unique rows and their
  state read and written at copy bandwidth. It says what random row access costs here, so the
  fraction a contender reaches of it says how much is left to gain by better code rather than by
  fewer accesses.
"""

from __future__ import annotations

import statistics
import time

import numpy
import torch
import torch.nn.functional as F

__all__ = ["copy_bandwidth", "floor_bytes", "gather_floor_ms"]


def floor_bytes(point, num_ids: float, unique: float) -> float:
    """Bytes a step must move (see [Note: the EBC step's floors]); fp32 rows, int64 ids."""
    row = 4 * point.dim
    state = 4 if point.optimizer == "rowwise_adagrad" else 0
    bags = point.tables * point.batch
    return 2 * 8 * num_ids + 3 * unique * row + 2 * unique * state + 2 * bags * row


def copy_bandwidth(device: str = "cpu") -> float:
    """Single-thread copy bandwidth in GB/s (bytes read + written): the median of 5 memcpy's
    (NumPy's copy) of 256 MB, far beyond any cache; on a GPU, 5 device-to-device copies."""
    if device == "cuda":
        return _gpu_copy_bandwidth()
    src = numpy.ones(64 << 20, dtype=numpy.float32)
    dst = numpy.empty_like(src)
    numpy.copyto(dst, src)
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        numpy.copyto(dst, src)
        seconds.append(time.perf_counter() - start)
    return 2 * src.nbytes / statistics.median(seconds) / 1e9


def _gpu_copy_bandwidth() -> float:
    src = torch.ones(256 << 20, dtype=torch.float32, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(seconds) / 1e9


def _pooled_ms(ids: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor) -> float:
    """Median ms of 5 ``F.embedding_bag`` sums of ``rows[ids]`` into the bags of ``offsets``."""
    seconds = []
    for _ in range(6):
        start = time.perf_counter()
        F.embedding_bag(ids, rows, offsets, mode="sum", include_last_offset=True)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds[1:]) * 1e3


def gather_floor_ms(point, kjt, unique: float, bandwidth: float) -> float:
    """The gather floor of one batch (see [Note: the EBC step's floors]), CPU only.

    Args:
        point: the sweep point (tables, rows, dim, batch, optimizer).
        kjt: one of the point's batches (keys x batch bags, key-major).
        unique: unique (table, row) pairs per batch; bandwidth: copy GB/s.
    """
    lengths = kjt.lengths().long()
    shift = torch.repeat_interleave(
        torch.arange(point.tables) * point.rows, torch.tensor(kjt.length_per_key())
    )
    ids = kjt.values().long() + shift
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offsets[1:])
    table = torch.full((point.tables * point.rows, point.dim), 0.5)  # pages touched, not zero
    forward_ms = _pooled_ms(ids, table, offsets)
    del table
    order = torch.argsort(ids, stable=True)
    sources = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)[order]
    counts = torch.unique_consecutive(ids[order], return_counts=True)[1]
    runs = torch.zeros(counts.numel() + 1, dtype=torch.long)
    torch.cumsum(counts, 0, out=runs[1:])
    grad = torch.full((lengths.numel(), point.dim), 0.5)
    backward_ms = _pooled_ms(sources, grad, runs)
    state = 4 if point.optimizer == "rowwise_adagrad" else 0
    update_ms = 2 * unique * (4 * point.dim + state) / (bandwidth * 1e9) * 1e3
    return forward_ms + backward_ms + update_ms
