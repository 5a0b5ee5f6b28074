"""The interfaces of inputs that move between devices and CUDA streams (``torchrec.streamable``).

TorchRec programs subclass `Pipelineable` for their own batch types; train pipelines call
``batch.to(device, non_blocking=True)`` and, after a copy on a side stream,
``batch.record_stream(stream)``. shardkit's `KeyedJaggedTensor`, `JaggedTensor`, `KeyedTensor`
are registered as `Pipelineable` (in ``shardkit/__init__.py``).
"""

from __future__ import annotations

import abc

import torch

__all__ = ["Multistreamable", "Pipelineable"]


class Multistreamable(abc.ABC):
    """An object whose tensors can be marked as used by another CUDA stream."""

    @abc.abstractmethod
    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as in use by ``stream`` (``torch.Tensor.record_stream``)."""


class Pipelineable(Multistreamable):
    """An input that can be moved to a device (``to``) and marked for streams."""

    @abc.abstractmethod
    def to(self, device: torch.device, non_blocking: bool) -> Pipelineable:
        """This input on ``device`` (``self`` or a copy: always use the result)."""
