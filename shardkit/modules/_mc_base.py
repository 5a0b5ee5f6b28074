"""`ManagedCollisionModule`: the base of the modules that remap one table's raw ids to rows."""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch
from torch import nn

from shardkit.sparse import JaggedTensor

__all__ = ["MAX_BUCKETS", "ManagedCollisionModule"]

MAX_BUCKETS = 1024  # TorchRec's bound: _output_segments_tensor holds 1025 entries


class ManagedCollisionModule(nn.Module):
    """Base of the modules that map raw ids of one table to rows ``[0, output_size())``.

    Holds TorchRec's common state: ``_output_segments_tensor`` (the bucket bounds, padded with -1
    to 1025 entries) and ``_current_iter_tensor`` (training iterations seen), and calls
    `validate_state` after ``load_state_dict``.

    Args:
        device: where the state lives.
        output_segments: the row bounds the module's state can be split at.
    """

    _output_segments_tensor: torch.Tensor  # buffers, registered in __init__
    _current_iter_tensor: torch.Tensor

    def __init__(self, device: torch.device | str | None, output_segments: Sequence[int]) -> None:
        super().__init__()
        device = torch.device(device) if device is not None else torch.device("cpu")
        padded = list(output_segments) + [-1] * (MAX_BUCKETS + 1 - len(output_segments))
        self.register_buffer(
            "_output_segments_tensor", torch.tensor(padded, dtype=torch.int64, device=device)
        )
        self.register_buffer(
            "_current_iter_tensor", torch.zeros(1, dtype=torch.int64, device=device)
        )
        self.register_load_state_dict_post_hook(lambda module, _: module.validate_state())

    @property
    def device(self) -> torch.device:
        return self._current_iter_tensor.device

    @abc.abstractmethod
    def preprocess(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Raw ids -> the ids the module keeps (e.g. hashed into ``input_size()``)."""

    @abc.abstractmethod
    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Record the ids of a training iteration (and evict when it is time)."""

    @abc.abstractmethod
    def remap(
        self, features: dict[str, JaggedTensor], mutate_miss_lengths: bool = True
    ) -> dict[str, JaggedTensor]:
        """Ids -> rows, lengths unchanged."""

    @abc.abstractmethod
    def evict(self) -> torch.Tensor | None:
        """Rows whose id changed since the last call (to reset), or None."""

    @abc.abstractmethod
    def output_size(self) -> int:
        """Rows of the table this module maps into."""

    @abc.abstractmethod
    def input_size(self) -> int:
        """Range of the ids it takes."""

    @abc.abstractmethod
    def buckets(self) -> int:
        """Buckets the rows are split into (the units of row-wise sharding)."""

    @abc.abstractmethod
    def validate_state(self) -> None:
        """Check (and re-index) the state after ``load_state_dict``."""

    @abc.abstractmethod
    def open_slots(self) -> torch.Tensor:
        """``[1]``: slots that hold no id yet."""

    @abc.abstractmethod
    def rebuild_with_output_id_range(
        self,
        output_id_range: tuple[int, int],
        output_segments: Sequence[int] | None = None,
        device: torch.device | str | None = None,
    ) -> ManagedCollisionModule:
        """A fresh module for rows ``[start, end)`` of this one's table (one rank's shard)."""

    def forward(
        self, features: dict[str, JaggedTensor], mutate_miss_lengths: bool = True
    ) -> dict[str, JaggedTensor]:
        """``{name: JaggedTensor of raw ids}`` -> the same with rows as values."""
        features = self.preprocess(features)
        features = self.profile(features)
        return self.remap(features, mutate_miss_lengths)
