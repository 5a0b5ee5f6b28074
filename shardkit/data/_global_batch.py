"""Global-batch semantics: which examples of a global batch each rank gets.

[Note: global batch]
With ``W`` ranks and a per-rank batch size ``B``, the examples are consumed in global batches of
``G = B * W`` consecutive examples of the epoch's order, and rank ``r`` gets examples
``[r * B, (r + 1) * B)`` of each. Concatenating the ranks' batches in rank order gives the global
batch, so training on ``W`` ranks with batch ``B`` sees exactly the batches of one process with
batch ``G``: the world size changes who computes, never what is computed.

Only the last global batch of an epoch can be partial (``m < G`` examples). `LastBatch` says what
happens to it:

- ``DROP``: it is skipped (the default for training; every step has the same global batch).
- ``PAD``: every rank still gets ``B`` examples. Rank ``r`` gets its real examples
  ``[r * B, (r + 1) * B)`` clipped to ``m``, then padding up to ``B``: examples of the same global
  batch repeated from its start, with weight 0 in `Batch.weights` (real examples weigh 1). Every
  example is covered exactly once with weight 1, and every rank has the same shapes, which the
  sharded embeddings' collectives like. Weight the loss and the metrics.
- ``UNEVEN``: the ``m`` examples are split into ``W`` contiguous pieces whose sizes differ by at
  most one (the first ``m % W`` ranks get one more); a rank may get 0 examples when ``m < W``.
  Concatenated in rank order they are still the partial global batch. No weights.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = [
    "LastBatch",
    "RankShare",
    "check_batching",
    "num_global_batches",
    "rank_share",
    "resolve_rank",
]


class LastBatch(enum.Enum):
    """What to do with an epoch's last global batch when it has fewer than ``B * W`` examples."""

    DROP = "drop"
    PAD = "pad"
    UNEVEN = "uneven"


@dataclass(frozen=True)
class RankShare:
    """Rank ``r``'s examples ``[start, stop)`` of a global batch, then ``num_padding`` padding."""

    start: int
    stop: int
    num_padding: int

    def indices(self, global_batch: torch.Tensor) -> torch.Tensor:
        """This rank's example indices (``[stop - start + num_padding]``) of ``global_batch``."""
        real = global_batch[self.start : self.stop]
        if not self.num_padding:
            return real
        repeats = -(-self.num_padding // global_batch.numel())  # ceil
        return torch.cat([real, global_batch.repeat(repeats)[: self.num_padding]])

    def weights(self) -> torch.Tensor:
        """``[stop - start + num_padding]`` float32: 1 for real examples, 0 for padding."""
        weights = torch.ones(self.stop - self.start + self.num_padding)
        weights[self.stop - self.start :] = 0.0
        return weights


def rank_share(
    num_examples: int, *, batch_size: int, rank: int, world_size: int, last_batch: LastBatch
) -> RankShare:
    """Which of a global batch's ``num_examples`` (at most ``batch_size * world_size``) rank
    ``rank`` gets. See [Note: global batch]."""
    full = batch_size * world_size
    assert 0 < num_examples <= full, (num_examples, full)
    if num_examples == full or last_batch is LastBatch.PAD:
        start = min(rank * batch_size, num_examples)
        stop = min((rank + 1) * batch_size, num_examples)
        return RankShare(start, stop, batch_size - (stop - start))
    assert last_batch is LastBatch.UNEVEN, "DROP never yields a partial global batch"
    base, extra = divmod(num_examples, world_size)
    start = rank * base + min(rank, extra)
    return RankShare(start, start + base + (rank < extra), 0)


def num_global_batches(num_examples: int, global_batch_size: int, last_batch: LastBatch) -> int:
    """Global batches in an epoch of ``num_examples``."""
    if last_batch is LastBatch.DROP:
        return num_examples // global_batch_size
    return -(-num_examples // global_batch_size)


def resolve_rank(owner: str, rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from torch.distributed, else ``(0, 1)``."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"{owner}: give both rank and world_size, or neither (to read them from "
            f"torch.distributed); got rank={rank}, world_size={world_size}"
        )
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"{owner}: need world_size >= 1 and 0 <= rank < world_size, got rank={rank}, "
            f"world_size={world_size}"
        )
    return rank, world_size


def check_batching(owner: str, batch_size: object, last_batch: object) -> None:
    """``batch_size`` an int >= 1, ``last_batch`` a `LastBatch`."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"{owner}: batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(last_batch, LastBatch):
        raise TypeError(
            f"{owner}: last_batch must be a LastBatch, got {last_batch!r}; use "
            "LastBatch.DROP, LastBatch.PAD or LastBatch.UNEVEN"
        )
