"""Cutting ``total`` rows or columns into ``parts`` shards as evenly as possible.

[Note: even splits]
``total`` rows on ``parts`` shards: the first ``total % parts`` shards get one row more than the
others (10 rows on 3 ranks: 4, 3, 3), so no row is dropped, shard sizes differ by at most one
and the offsets (running sums) tile the table exactly. Columns split the same way. TorchRec
instead gives every shard but the last ``ceil(total / parts)`` rows (10 on 4: 3, 3, 3, 1); the
even split balances memory better and is what shardkit's sharded modules expect.
"""

from __future__ import annotations

__all__ = ["split_evenly"]


def split_evenly(total: int, parts: int) -> list[int]:
    """Sizes of ``parts`` shards of ``total``. See [Note: even splits]."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts; need at least 1")
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)
