"""Cutting ``total`` rows or columns into ``parts`` shards as evenly as possible.

[Note: even splits]
``total`` rows on ``parts`` shards: the first ``total % parts`` shards get one row more than the
others (10 rows on 3 ranks: 4, 3, 3), so no row is dropped, shard sizes differ by at most one
and the offsets (running sums) tile the table exactly. Columns split the same way. TorchRec
instead gives every shard but the last ``ceil(total / parts)`` rows (10 on 4: 3, 3, 3, 1); the
even split balances memory better and is what shardkit's sharded modules expect.
"""

from __future__ import annotations

__all__ = ["Groups", "expand", "offsets_of", "size_groups", "split_evenly"]

# Run-length encoded sizes: ((count, size), ...), in shard order, counts > 0.
Groups = tuple[tuple[int, int], ...]


def split_evenly(total: int, parts: int) -> list[int]:
    """Sizes of ``parts`` shards of ``total``. See [Note: even splits]."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts; need at least 1")
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def size_groups(total: int, parts: int) -> Groups:
    """`split_evenly` as run-length groups: 10 on 3 -> ((1, 4), (2, 3))."""
    base, extra = divmod(total, parts)
    groups = ((extra, base + 1), (parts - extra, base))
    return tuple(group for group in groups if group[0] > 0)


def expand(groups: Groups) -> list[int]:
    """((1, 4), (2, 3)) -> [4, 3, 3]."""
    return [size for count, size in groups for _ in range(count)]


def offsets_of(sizes: list[int]) -> list[int]:
    """Where each shard starts: [4, 3, 3] -> [0, 4, 7]."""
    offsets, running = [], 0
    for size in sizes:
        offsets.append(running)
        running += size
    return offsets
