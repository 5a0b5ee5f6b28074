"""Errors raised by shardkit's collectives."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["CollectiveError", "collective_error"]


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names it, the rank and the group size."""


def collective_error(name: str, group: dist.ProcessGroup | None, exc: BaseException) -> Exception:
    """Wrap a backend error so that it says which collective broke, where and why."""
    if isinstance(exc, CollectiveError):
        return exc
    rank = dist.get_rank()
    size = dist.get_world_size(group)
    message = str(exc)
    if "timed out" in message.lower() or "timeout" in message.lower():
        return CollectiveError(
            f"shardkit.comm.{name} timed out on rank {rank} (group of {size} ranks): another "
            f"rank did not call {name}, or called a different collective first. Every rank must "
            "issue the same collectives in the same order; SHARDKIT_DEBUG=1 (or "
            f"spawn(..., debug=True)) checks each call. Backend said: {message}"
        )
    return CollectiveError(
        f"shardkit.comm.{name} failed on rank {rank} (group of {size} ranks): {message}"
    )
