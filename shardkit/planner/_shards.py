"""Shard sizes run-length encoded: `split_evenly` (see [Note: even splits]) as groups."""

from __future__ import annotations

__all__ = ["Groups", "expand", "offsets_of", "size_groups"]

# Run-length encoded sizes: ((count, size), ...), in shard order, counts > 0.
Groups = tuple[tuple[int, int], ...]


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
