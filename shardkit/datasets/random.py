"""Random batches in TorchRec's format (``torchrec.datasets.random``), for smoke tests and
benchmarks.

Each batch draws, with one generator and in this order: per key, lengths uniform in
``[min_ids, max_ids]`` (int32, ``[B]``) then ids uniform in ``[0, hash_size)``; then dense features
``randn(B, num_dense)``; then labels uniform in {0, 1} (int64). With ``manual_seed`` the batches are
TorchRec's own, tensor for tensor. ``num_generated_batches`` batches are made up front and cycled
(a negative value makes a fresh batch every time).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import IterableDataset

from shardkit.datasets.utils import Batch
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["RandomRecDataset"]


class _Batches:
    """The generator of `RandomRecDataset`'s batches."""

    def __init__(self, keys: list[str], batch_size: int, hash_sizes: list[int],
                 ids_per_features: list[int], min_ids_per_features: list[int], num_dense: int,
                 manual_seed: int | None, num_generated_batches: int) -> None:  # fmt: skip
        self.keys, self.batch_size, self.num_dense = keys, batch_size, num_dense
        self.hash_sizes, self.max_ids, self.min_ids = (
            hash_sizes,
            ids_per_features,
            min_ids_per_features,
        )
        self.generator = None if manual_seed is None else torch.Generator().manual_seed(manual_seed)
        self.cached = [self.make() for _ in range(num_generated_batches)]

    def make(self) -> Batch:
        g, b = self.generator, self.batch_size
        lengths, values = [], []
        for hash_size, low, high in zip(self.hash_sizes, self.min_ids, self.max_ids):
            length = torch.randint(low, high + 1, (b,), dtype=torch.int32, generator=g)  # [B]
            lengths.append(length)
            values.append(torch.randint(0, hash_size, (int(length.sum()),), generator=g))
        sparse = KeyedJaggedTensor(keys=self.keys, values=torch.cat(values),
                                   lengths=torch.cat(lengths))  # fmt: skip
        dense = torch.randn(b, self.num_dense, generator=g)  # [B, num_dense]
        labels = torch.randint(0, 2, (b,), generator=g)  # [B] int64
        return Batch(dense_features=dense, sparse_features=sparse, labels=labels)

    def __iter__(self) -> Iterator[Batch]:
        if self.cached:
            return itertools.cycle(self.cached)
        return iter(self.make, None)


def _per_key(name: str, values: Sequence[int] | None, one: int | None, default: int,
             keys: list[str]) -> list[int]:  # fmt: skip
    if values is None:
        return [one if one else default] * len(keys)
    if len(values) != len(keys):
        raise ValueError(
            f"RandomRecDataset: {name} has {len(values)} entries for {len(keys)} keys; give one "
            "per key"
        )
    return list(values)


class RandomRecDataset(IterableDataset):
    """Batches of random ids, dense features and labels (TorchRec's signature).

    Args:
        keys: the sparse features.
        batch_size: B.
        hash_size / hash_sizes: ids are drawn from ``[0, hash_size)`` (default 100), one for all
            keys or one per key.
        ids_per_feature / ids_per_features: the most ids in a bag (default 2).
        num_dense: dense features per example.
        manual_seed: seed of the generator (None: torch's global generator).
        num_batches: how many batches one pass yields (None: without end).
        num_generated_batches: batches made up front and cycled (< 0: a new one each time).
        min_ids_per_feature / min_ids_per_features: the fewest ids in a bag (default: 0, or
            ``ids_per_feature`` when that is given alone, as TorchRec does).
    """

    def __init__(
        self,
        keys: list[str],
        batch_size: int,
        hash_size: int | None = None,
        hash_sizes: list[int] | None = None,
        ids_per_feature: int | None = None,
        ids_per_features: list[int] | None = None,
        num_dense: int = 50,
        manual_seed: int | None = None,
        num_batches: int | None = None,
        num_generated_batches: int = 10,
        min_ids_per_feature: int | None = None,
        min_ids_per_features: list[int] | None = None,
    ) -> None:
        super().__init__()
        if min_ids_per_features is None and min_ids_per_feature is None:
            min_ids_per_feature = ids_per_feature
        highs = _per_key("ids_per_features", ids_per_features, ids_per_feature, 2, keys)
        lows = _per_key("min_ids_per_features", min_ids_per_features, min_ids_per_feature, 0, keys)
        bad = [(k, lo, hi) for k, lo, hi in zip(keys, lows, highs) if not 0 <= lo <= hi]
        if bad:
            raise ValueError(f"RandomRecDataset: need 0 <= min ids <= max ids per key, got {bad}")
        self.batch_generator = _Batches(
            keys, batch_size, _per_key("hash_sizes", hash_sizes, hash_size, 100, keys), highs,
            lows, num_dense, manual_seed, num_generated_batches,
        )  # fmt: skip
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[Batch]:
        return itertools.islice(iter(self.batch_generator), self.num_batches)

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("RandomRecDataset(num_batches=None) has no length: it never ends")
        return self.num_batches
