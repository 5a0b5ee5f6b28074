"""`GlobalBatchIterator`: a map-style data set read in global batches, shuffled per epoch,
resumable mid-epoch."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import torch

from shardkit.data._batch import Batch
from shardkit.data._global_batch import (
    LastBatch,
    check_batching,
    num_global_batches,
    rank_share,
    resolve_rank,
)
from shardkit.data._hash import mix_tensor
from shardkit.data._position import Position
from shardkit.data._tabular import MapDataset

__all__ = ["GlobalBatchIterator", "epoch_order"]

logger = logging.getLogger(__name__)


def epoch_order(num_examples: int, *, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """``[N]`` int64: the order in which an epoch visits the examples.

    The shuffle sorts the examples by a hash of ``(seed, epoch, index)`` (see [Note:
    counter-based randomness]): the same on every rank, machine and torch release.
    """
    index = torch.arange(num_examples)
    if not shuffle:
        return index
    keys = mix_tensor(seed, epoch, index)
    return torch.argsort(keys, stable=True)


class GlobalBatchIterator:
    """This rank's batches of ``dataset``, with global-batch semantics (see [Note: global batch]).

    Each ``iter()`` runs the rest of the current epoch; once an epoch is exhausted the next
    ``iter()`` starts the next one, in a new order when ``shuffle``::

        it = GlobalBatchIterator(adult.train, batch_size=256, rank=rank, world_size=world_size)
        for epoch in range(3):
            for batch in it:            # len(it) batches per epoch
                ...
        state = it.state_dict()         # after k batches: resuming yields the remaining ones

    Args:
        dataset: a `MapDataset` (``len`` and ``batch(indices)``), e.g. a `TabularDataset`.
        batch_size: ``B``, examples per rank per step.
        rank, world_size: this rank and the number of ranks; both None (default): from
            torch.distributed if initialised, else a single process.
        shuffle: visit the examples in a new seeded order each epoch (else in index order).
        seed: the shuffle's seed; every rank must pass the same one.
        last_batch: what to do with a partial last global batch (`LastBatch`).
    """

    def __init__(
        self,
        dataset: MapDataset,
        *,
        batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        last_batch: LastBatch = LastBatch.DROP,
    ) -> None:
        self.rank, self.world_size = resolve_rank("GlobalBatchIterator", rank, world_size)
        check_batching("GlobalBatchIterator", batch_size, last_batch)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"GlobalBatchIterator: seed must be an int >= 0, got {seed!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.last_batch = last_batch
        self.num_examples = len(dataset)
        _check_enough(self.num_examples, self.global_batch_size, last_batch)
        self._position = Position()
        self._order: tuple[int, torch.Tensor] | None = None  # (epoch, order) of the last epoch

    @property
    def global_batch_size(self) -> int:
        """``B * W``: the examples of one step over all ranks."""
        return self.batch_size * self.world_size

    @property
    def epoch(self) -> int:
        """The epoch being read (it advances when an iteration runs out)."""
        return self._position.epoch

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        return num_global_batches(self.num_examples, self.global_batch_size, self.last_batch)

    def __iter__(self) -> Iterator[Batch]:
        end = self._epoch_end()
        order = self._epoch_order(self._position.epoch)
        while self._position.examples < end:  # a resumed position past `end` ends the epoch
            start = self._position.examples
            global_batch = order[start : start + self.global_batch_size]
            self._position.examples = start + global_batch.numel()
            yield self._rank_batch(global_batch)
        self._position.next_epoch()  # see [Note: resuming]

    def _epoch_end(self) -> int:
        """Examples an epoch consumes (all, unless DROP leaves a partial batch out)."""
        if self.last_batch is LastBatch.DROP:
            return self.num_examples // self.global_batch_size * self.global_batch_size
        return self.num_examples

    def _rank_batch(self, global_batch: torch.Tensor) -> Batch:
        share = rank_share(
            global_batch.numel(),
            batch_size=self.batch_size,
            rank=self.rank,
            world_size=self.world_size,
            last_batch=self.last_batch,
        )
        batch = self.dataset.batch(share.indices(global_batch))
        if self.last_batch is LastBatch.PAD:
            batch = dataclasses.replace(batch, weights=share.weights())
        return batch

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.num_examples, seed=self.seed, epoch=epoch,
                                              shuffle=self.shuffle))  # fmt: skip
        return self._order[1]

    def state_dict(self) -> dict[str, Any]:
        """Where the iterator is (see [Note: resuming]) and what the order depends on: plain
        ints and bools, for a checkpoint."""
        return {
            **self._position.state_dict(),
            "num_examples": self.num_examples,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "global_batch_size": self.global_batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off: the next ``iter()`` yields the batches that
        followed (see [Note: resuming] for a changed world size)."""
        expected = {"num_examples": self.num_examples, "seed": self.seed, "shuffle": self.shuffle}
        self._position.load_state_dict(
            "GlobalBatchIterator", state, expected=expected,
            global_batch_size=self.global_batch_size, num_examples=self.num_examples,
        )  # fmt: skip
        logger.info(
            "GlobalBatchIterator resumes at epoch %d, example %d of %d",
            self._position.epoch, self._position.examples, self.num_examples,
        )  # fmt: skip


def _check_enough(num_examples: int, global_batch_size: int, last_batch: LastBatch) -> None:
    if num_examples == 0:
        raise ValueError("GlobalBatchIterator: the data set is empty; give it examples")
    if num_global_batches(num_examples, global_batch_size, last_batch) == 0:
        raise ValueError(
            f"GlobalBatchIterator: {num_examples} examples make no full global batch of "
            f"batch_size * world_size = {global_batch_size} and last_batch is DROP; use a "
            "smaller batch_size, or last_batch=LastBatch.PAD or UNEVEN"
        )
