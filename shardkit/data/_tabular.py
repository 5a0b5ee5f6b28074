"""In-memory examples with one id (or none) per feature, and the `Batch` built from them.

Adult, the Criteo readers and tests all hold their examples as three tensors of rows: dense
``[N, D]``, ids ``[N, F]`` and labels ``[N]``. An id of -1 means "no id": that example's bag of
that feature is empty (Criteo's empty categorical fields).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from shardkit.data._batch import Batch
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["MapDataset", "TabularDataset", "batch_from_ids"]

MISSING_ID = -1


class MapDataset(Protocol):
    """What `GlobalBatchIterator` reads: ``len(ds)`` examples, and any of them as a `Batch`."""

    def __len__(self) -> int: ...

    def batch(self, indices: torch.Tensor) -> Batch:
        """The examples ``indices`` (``[B]`` int64, in that order) as one batch."""
        ...


def batch_from_ids(
    dense: torch.Tensor,
    *,
    ids: torch.Tensor,
    labels: torch.Tensor,
    keys: Sequence[str],
    weights: torch.Tensor | None = None,
) -> Batch:
    """A `Batch` whose bag for (example ``b``, key ``f``) is ``[ids[b, f]]``, or empty if -1.

    Example, keys ``["a", "b"]``::

        ids = [[3, -1],          values  = [3, 5, 9]      # key-major: a's ids, then b's
               [5,  9]]    ->    lengths = [1, 1, 0, 1]   # [F * B]: a0 a1 b0 b1

    Args:
        dense: ``[B, D]`` floating.
        ids: ``[B, F]`` int64, ``-1`` for an empty bag.
        labels: ``[B]`` floating.
        keys: the ``F`` feature names, in the column order of ``ids``.
        weights: ``[B]`` or None.
    """
    if ids.dim() != 2 or ids.size(1) != len(keys):
        raise ValueError(
            f"batch_from_ids: ids must be [B, F] with F = len(keys) = {len(keys)}, got shape "
            f"{tuple(ids.shape)}"
        )
    by_key = ids.t()  # [F, B]
    present = by_key != MISSING_ID  # [F, B]
    values = by_key.reshape(-1) if bool(present.all()) else by_key[present]  # key-major
    sparse = KeyedJaggedTensor(
        keys=list(keys),
        values=values,
        lengths=present.reshape(-1).to(torch.int32),
        stride=ids.size(0),
    )
    return Batch(dense_features=dense, sparse_features=sparse, labels=labels, weights=weights)


@dataclass(frozen=True, eq=False)  # holds tensors: compare by identity
class TabularDataset:
    """``N`` examples held in memory, each with at most one id per feature.

    Args:
        keys: the ``F`` feature names.
        dense: ``[N, D]`` float32.
        ids: ``[N, F]`` int64, -1 for an empty bag.
        labels: ``[N]`` float32, 0.0 or 1.0.
    """

    keys: tuple[str, ...]
    dense: torch.Tensor
    ids: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        rows = {"dense": self.dense.size(0), "ids": self.ids.size(0), "labels": len(self.labels)}
        if len(set(rows.values())) != 1:
            raise ValueError(
                f"TabularDataset: dense, ids and labels must have the same number of rows, got "
                f"{rows}"
            )
        if self.ids.dim() != 2 or self.ids.size(1) != len(self.keys):
            raise ValueError(
                f"TabularDataset: ids must be [N, len(keys)={len(self.keys)}], got "
                f"{tuple(self.ids.shape)}"
            )

    def __len__(self) -> int:
        return self.labels.size(0)

    def batch(self, indices: torch.Tensor) -> Batch:
        """The examples ``indices`` (``[B]`` int64) as a `Batch`."""
        return batch_from_ids(
            self.dense[indices], ids=self.ids[indices], labels=self.labels[indices], keys=self.keys
        )

    def all(self) -> Batch:
        """Every example, in order, as one `Batch` (the single-process reference)."""
        return self.batch(torch.arange(len(self)))
