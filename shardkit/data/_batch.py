"""`Batch`: what a data iterator yields and a DLRM eats, TorchRec's ``Batch`` shape."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardkit.sparse import KeyedJaggedTensor

__all__ = ["Batch"]


@dataclass(frozen=True, eq=False)  # holds tensors: compare by identity
class Batch:
    """One rank's share of a global batch: ``model(batch.dense_features, batch.sparse_features)``.

    Worked example: 2 examples, 3 dense features, keys ``["color", "size"]``, one id per bag::

        example   dense             color   size   label
        0         [0.1, 0.2, 0.3]   [4]     [1]    1.0
        1         [0.4, 0.5, 0.6]   [7]     []     0.0

        dense_features = [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]        # [B, N] float32
        sparse_features.values()  = [4, 7, 1]                       # key-major
        sparse_features.lengths() = [1, 1, 1, 0]                    # [F * B]
        labels  = [1.0, 0.0]                                        # [B] float32
        weights = None                                              # or [B]: 0.0 marks padding

    The constructor checks only what costs nothing (types, dims, batch sizes); it never reads
    tensor data, so it does not sync with a device.

    Args:
        dense_features: ``[B, N]`` floating.
        sparse_features: ``F`` keys with batch size (stride) ``B``.
        labels: ``[B]`` floating, 0.0 or 1.0.
        weights: ``[B]`` floating per-example weights, or None (all 1). Iterators that pad the
            last batch (`LastBatch.PAD`) give padded examples weight 0: weight the loss and
            the metrics with them.
    """

    dense_features: torch.Tensor
    sparse_features: KeyedJaggedTensor
    labels: torch.Tensor
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        _check_batch(self)

    @property
    def batch_size(self) -> int:
        """``B``, the number of examples (padding included)."""
        return self.dense_features.size(0)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy on ``device`` (TorchRec's ``Pipelineable.to``)."""
        device = torch.device(device)
        return Batch(
            dense_features=self.dense_features.to(device, non_blocking=non_blocking),
            sparse_features=self.sparse_features.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            weights=_maybe(self.weights, lambda t: t.to(device, non_blocking=non_blocking)),
        )

    def pin_memory(self) -> Batch:
        """A copy in pinned host memory, for asynchronous host-to-device copies."""
        return Batch(
            dense_features=self.dense_features.pin_memory(),
            sparse_features=self.sparse_features.pin_memory(),
            labels=self.labels.pin_memory(),
            weights=_maybe(self.weights, torch.Tensor.pin_memory),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use by ``stream`` (after a copy on a side stream)."""
        self.dense_features.record_stream(stream)
        self.sparse_features.record_stream(stream)
        self.labels.record_stream(stream)
        if self.weights is not None:
            self.weights.record_stream(stream)


def _maybe(tensor: torch.Tensor | None, fn) -> torch.Tensor | None:
    return None if tensor is None else fn(tensor)


def _check_batch(batch: Batch) -> None:
    dense, labels, kjt = batch.dense_features, batch.labels, batch.sparse_features
    for name, tensor, dim in (("dense_features", dense, 2), ("labels", labels, 1)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"Batch: {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != dim or not tensor.is_floating_point():
            raise ValueError(
                f"Batch: {name} must be a {dim}-D floating tensor, got shape "
                f"{tuple(tensor.shape)} and dtype {tensor.dtype}; convert with .float()"
            )
    if not isinstance(kjt, KeyedJaggedTensor):
        raise TypeError(
            f"Batch: sparse_features must be a KeyedJaggedTensor, got {type(kjt).__name__}"
        )
    batch_size = dense.size(0)
    sizes = {"labels": labels.size(0)}
    if kjt.keys():
        sizes["sparse_features.stride()"] = kjt.stride()
    if batch.weights is not None:
        if batch.weights.dim() != 1 or not batch.weights.is_floating_point():
            raise ValueError(
                f"Batch: weights must be a 1-D floating tensor, got shape "
                f"{tuple(batch.weights.shape)} and dtype {batch.weights.dtype}"
            )
        sizes["weights"] = batch.weights.size(0)
    wrong = {name: size for name, size in sizes.items() if size != batch_size}
    if wrong:
        raise ValueError(
            f"Batch: every part must have the batch size of dense_features ({batch_size}), got "
            f"{wrong}; build all parts from the same examples"
        )
