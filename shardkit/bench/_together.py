"""What the embedding kernel takes when a host's ranks run it at once, over alone, for
calibrate's ``kernels_together`` (see [Note: ranks computing at once] in the planner): one
memory-bound kernel call (a table twice the last-level cache) timed in a rank alone, and in
as many ranks as the host has cores for at the same moment."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from shardkit.modules import lookup, stack_tables
from shardkit.optim import EmbOptimType, FusedOptimizerConfig

__all__ = ["kernel_call_ms", "together_rank"]

# the call: 65,520 ids in 3,276 bags of 20 on a 64-column table of 2**18 rows (64 MiB, with its state
# past a 32 MiB last-level cache, as a step's tables mostly are), forward and backward with the
# fused update
_IDS, _POOLING, _ROWS, _DIM = 65_520, 20, 1 << 18, 64
_CALLS: dict[str, Any] = {}


def _call(optimizer: str) -> Any:
    """The kernel call of this process (built once, kept for the next samples)."""
    if optimizer not in _CALLS:
        rule = FusedOptimizerConfig(optimizer=EmbOptimType.parse(optimizer), learning_rate=0.01)
        tables = stack_tables(
            [_ROWS], _DIM, dtype=torch.float32, device=torch.device("cpu"), optimizer=rule
        )
        tables.weight.uniform_(-0.01, 0.01)
        params = [torch.nn.Parameter(v) for v in tables.table_views()]
        g = torch.Generator().manual_seed(11)
        offsets = torch.arange(0, _IDS + 1, _POOLING)
        grad = torch.full((_IDS // _POOLING, _DIM), 1e-3)

        def step() -> None:
            ids = torch.randint(0, _ROWS, (_IDS,), generator=g)
            lookup(tables, ids, offsets, None, params).backward(grad)

        step()  # warm up
        _CALLS[optimizer] = step
    return _CALLS[optimizer]


def kernel_call_ms(optimizer: str, repeats: int) -> float:
    """The fastest of ``repeats`` calls, ms of this thread's CPU time."""
    step = _call(optimizer)
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        step()
        best = min(best, (time.thread_time() - start) * 1e3)
    return best


def together_rank(rank: int, world_size: int, optimizer: str, repeats: int) -> float:
    """`kernel_call_ms` in every rank of the group at once (they start at a barrier)."""
    _call(optimizer)  # built before the barrier: the timed calls start together
    dist.barrier()
    return kernel_call_ms(optimizer, repeats)
