"""Bytes a rank sends to other ranks, counted in the torch.distributed collectives that
shardkit.comm calls (for the benchmarks that report bytes on the wire)."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["WIRE_OPS", "WireBytes"]

WIRE_OPS = ("all_to_all_single", "all_gather_single", "reduce_scatter_single")


class WireBytes:
    """Counts the bytes this rank sends to other ranks in torch.distributed's collectives that
    shardkit.comm calls (its own chunk of an all-to-all stays home)."""

    def __init__(self) -> None:
        self.total = 0
        for name in WIRE_OPS:
            setattr(dist, name, self._counting(name, getattr(dist, name)))

    def _counting(self, name, fn):
        def call(output, x, *args, group=None, **kwargs):
            world, rank = dist.get_world_size(group), dist.get_rank(group)
            row = x[0].numel() * x.element_size() if x.dim() and len(x) else 0
            if name == "all_to_all_single":
                splits = args[1] if len(args) > 1 else kwargs.get("input_split_sizes")
                sent = x.numel() * x.element_size() - (splits[rank] * row if splits else 0)
            elif name == "all_gather_single":
                sent = x.numel() * x.element_size() * (world - 1)
            else:  # reduce_scatter_single: all chunks but this rank's own
                sent = x.numel() * x.element_size() * (world - 1) // world
            self.total += sent
            return fn(output, x, *args, group=group, **kwargs)

        return call
