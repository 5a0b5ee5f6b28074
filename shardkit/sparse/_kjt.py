"""`KeyedJaggedTensor`: the sparse features of a batch, one jagged tensor per key, stored flat.

[Note: KJT metadata]
Everything a KJT knows on the host is derived from three things: ``keys``, the batch size per key
(``stride``, or ``stride_per_key_per_rank`` for variable batch sizes, "VBE") and, after one
device->host sync, ``length_per_key`` (ids per key). From them, by Python arithmetic only:
``stride_per_key``, ``lengths_offset_per_key`` (first bag of each key in ``lengths``),
``offset_per_key`` (first id of each key in ``values``) and ``index_per_key``. Each is computed
the first time it is asked for and cached. `__getitem__`, `to_dict`, `split` and `permute` slice
with the cached lists, and the KJTs they return carry what they can over, so a pipeline pays
the sync once per batch (``sync()`` pays it up front; ``unsync()`` drops it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from shardkit.sparse import _kjt_ops
from shardkit.sparse._checks import check_inverse_indices, check_kjt, check_per_key, num_rows
from shardkit.sparse._format import describe, kjt_string
from shardkit.sparse._jagged import JaggedTensor
from shardkit.sparse._segments import complete_cumsum, cumsum_list
from shardkit.sparse._validate import validate_kjt

__all__ = ["KeyedJaggedTensor"]

_OWNER = "KeyedJaggedTensor"


class KeyedJaggedTensor:
    """The sparse features of a batch: for each key (feature), a bag of ids per example.

    Worked example (seed 002), keys ``["product", "user"]``, batch of 3::

        example   product      user
        0         [101, 202]   [404]
        1         []           [505]
        2         [303]        [606]

        keys    = ["product", "user"]
        values  = [101, 202, 303, 404, 505, 606]   # [N]: key after key, bag after bag
        lengths = [2, 0, 1, 1, 1, 1]               # [F * B]: key-major, then example
        offsets = [0, 2, 2, 3, 4, 5, 6]            # [F * B + 1]
        stride() == 3 == len(lengths) // len(keys) # batch size B
        length_per_key() == [3, 3]                 # ids per key
        offset_per_key() == [0, 3, 6]              # where each key starts in values

    With variable batch size per key ("VBE"), ``stride_per_key_per_rank[k][r]`` is the number of
    examples of key ``k`` from rank ``r``; key ``k`` has ``sum(stride_per_key_per_rank[k])`` bags
    and ``stride()`` is the largest of those. E.g. keys ``["a", "b"]`` with
    ``stride_per_key_per_rank=[[1], [2]]``, ``values=[1, 2, 3]``, ``lengths=[1, 0, 2]`` hold
    ``"a": [[1]]`` and ``"b": [[], [2, 3]]``; ``stride_per_key() == [1, 2]``, ``stride() == 2``.

    The constructor checks only what is free (types, ranks, dtypes, sizes; see [Note: free
    checks] in `_checks`); `validate` checks the data. Metadata: see [Note: KJT metadata].

    Args:
        keys: feature names, unique.
        values: ``[N]`` ids (int32/int64, any integer dtype; floats are refused, not truncated),
            all keys and bags one after another.
        weights: ``[N]`` float, one weight per id, or None.
        lengths: ``[F * B]`` ids per bag (or give ``offsets``, or both).
        offsets: ``[F * B + 1]`` start of each bag in ``values``, then ``N``.
        stride: batch size ``B`` (default: ``len(lengths) // len(keys)``).
        stride_per_key_per_rank: ``[F][R]`` per-key, per-rank batch sizes (VBE), or None.
        stride_per_key, length_per_key, lengths_offset_per_key, offset_per_key, index_per_key,
            jt_dict: cached metadata, as the methods of the same name return it.
        inverse_indices: ``(keys, [len(keys), B])`` maps each example of the full batch to its
            bag of a deduplicated (VBE) key.
    """

    def __init__(
        self,
        keys: list[str],
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: list[list[int]] | torch.Tensor | None = None,
        stride_per_key: list[int] | None = None,
        length_per_key: list[int] | None = None,
        lengths_offset_per_key: list[int] | None = None,
        offset_per_key: list[int] | None = None,
        index_per_key: dict[str, int] | None = None,
        jt_dict: dict[str, JaggedTensor] | None = None,
        inverse_indices: tuple[list[str], torch.Tensor] | None = None,
    ) -> None:
        keys, lengths, offsets, stride, strides = check_kjt(
            _OWNER, keys, values, weights, lengths, offsets, stride, stride_per_key_per_rank,
            stride_per_key,
        )  # fmt: skip
        check_per_key(_OWNER, keys, values.size(0), num_rows(lengths, offsets), length_per_key,
                      offset_per_key, lengths_offset_per_key)  # fmt: skip
        check_inverse_indices(_OWNER, inverse_indices)
        self._set_fields(
            keys, values, weights, lengths, offsets, stride, strides, stride_per_key,
            length_per_key, lengths_offset_per_key, offset_per_key, index_per_key, jt_dict,
            inverse_indices,
        )  # fmt: skip

    def _set_fields(
        self, keys: list[str], values: torch.Tensor, weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
        stride: int | None = None, stride_per_key_per_rank: list[list[int]] | None = None,
        stride_per_key: list[int] | None = None, length_per_key: list[int] | None = None,
        lengths_offset_per_key: list[int] | None = None, offset_per_key: list[int] | None = None,
        index_per_key: dict[str, int] | None = None,
        jt_dict: dict[str, JaggedTensor] | None = None,
        inverse_indices: tuple[list[str], torch.Tensor] | None = None,
    ) -> None:  # fmt: skip
        """The one place a KJT's state is stored: the constructor's arguments, each as
        ``_<name>`` (lengths or offsets may be None; metadata None until computed)."""
        self._keys = keys
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets
        self._stride = stride
        self._stride_per_key_per_rank = stride_per_key_per_rank
        self._stride_per_key = stride_per_key
        self._length_per_key = length_per_key
        self._lengths_offset_per_key = lengths_offset_per_key
        self._offset_per_key = offset_per_key
        self._index_per_key = index_per_key
        self._jt_dict = jt_dict
        self._inverse_indices = inverse_indices

    def _copy(self) -> KeyedJaggedTensor:
        """A shallow copy of every field but the cached dict of views (no tensor is copied)."""
        new = copy.copy(self)
        new._jt_dict = None
        return new

    def _moved(self, move: Callable[[torch.Tensor], torch.Tensor]) -> KeyedJaggedTensor:
        """A copy with every tensor passed through ``move`` (to a device, pinned), metadata
        kept."""
        new = self._copy()
        new._values = move(self._values)
        new._weights, new._lengths, new._offsets = (
            None if t is None else move(t) for t in (self._weights, self._lengths, self._offsets)
        )
        if self._inverse_indices is not None:
            new._inverse_indices = (self._inverse_indices[0], move(self._inverse_indices[1]))
        return new

    @classmethod
    def _make(cls, **fields: Any) -> KeyedJaggedTensor:
        """Build from fields known to be consistent (our own ops' outputs): no checks."""
        kjt = cls.__new__(cls)
        kjt._set_fields(**fields)
        return kjt

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def from_offsets_sync(
        cls,
        keys: list[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: list[list[int]] | None = None,
        inverse_indices: tuple[list[str], torch.Tensor] | None = None,
    ) -> KeyedJaggedTensor:
        """Build from offsets and compute the per-key metadata now (one sync)."""
        return cls(keys, values, weights, offsets=offsets, stride=stride,
                   stride_per_key_per_rank=stride_per_key_per_rank,
                   inverse_indices=inverse_indices).sync()  # fmt: skip

    @classmethod
    def from_lengths_sync(
        cls,
        keys: list[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: list[list[int]] | None = None,
        inverse_indices: tuple[list[str], torch.Tensor] | None = None,
    ) -> KeyedJaggedTensor:
        """Build from lengths and compute the per-key metadata now (one sync)."""
        return cls(keys, values, weights, lengths=lengths, stride=stride,
                   stride_per_key_per_rank=stride_per_key_per_rank,
                   inverse_indices=inverse_indices).sync()  # fmt: skip

    @classmethod
    def from_jt_dict(cls, jt_dict: dict[str, JaggedTensor]) -> KeyedJaggedTensor:
        """One key per entry, in the dict's order; different batch sizes make a VBE KJT."""
        if not jt_dict:
            return cls.empty()
        return cls(**_kjt_ops.from_jt_dict(_OWNER, jt_dict)).sync()

    @classmethod
    def concat(cls, kjt_list: list[KeyedJaggedTensor]) -> KeyedJaggedTensor:
        """The keys of all KJTs side by side (same batch size; all weighted or none)."""
        return cls._make(**_kjt_ops.concat(_OWNER, kjt_list))

    @classmethod
    def empty(
        cls,
        is_weighted: bool = False,
        device: torch.device | None = None,
        values_dtype: torch.dtype | None = None,
        weights_dtype: torch.dtype | None = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> KeyedJaggedTensor:
        """A KJT with no keys (and stride 0)."""
        weights = torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None
        return cls([], torch.empty(0, dtype=values_dtype, device=device), weights,
                   lengths=torch.empty(0, dtype=lengths_dtype, device=device), stride=0)  # fmt: skip

    @classmethod
    def empty_like(
        cls, kjt: KeyedJaggedTensor, device: torch.device | None = None
    ) -> KeyedJaggedTensor:
        """No keys but ``kjt``'s dtypes and stride (a VBE ``kjt``'s ``stride_per_key_per_rank``,
        as TorchRec); with ``device``: ``kjt``'s keys, metadata and shapes, data uninitialised."""
        if device is None:
            return cls._make(**_kjt_ops.empty_like(kjt))
        return kjt._moved(lambda t: torch.empty_like(t, device=device))

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        """``[N]`` all ids, key after key, bag after bag."""
        return self._values

    def weights(self) -> torch.Tensor:
        """``[N]`` the weights; raises if this KJT has none."""
        if self._weights is None:
            raise ValueError(
                f"{_OWNER} has no weights; build it with weights=..., or call weights_or_none()"
            )
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        """``[F * B]`` ids per bag (derived from offsets the first time if needed, then cached)."""
        if self._lengths is None:
            assert self._offsets is not None  # the constructor requires one of them
            self._lengths = torch.diff(self._offsets)
        return self._lengths

    def lengths_or_none(self) -> torch.Tensor | None:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        """``[F * B + 1]`` bag starts then ``N`` (derived from lengths if needed, then cached)."""
        if self._offsets is None:
            assert self._lengths is not None  # the constructor requires one of them
            self._offsets = complete_cumsum(self._lengths)
        return self._offsets

    def offsets_or_none(self) -> torch.Tensor | None:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    def stride(self) -> int:
        """The batch size: ``len(lengths) // len(keys)``, or the largest per-key one (VBE)."""
        if self._stride is None:
            inverse = self._inverse_indices
            self._stride = _kjt_ops.batch_size(
                self._keys, num_rows(self._lengths, self._offsets), self._stride_per_key_per_rank,
                None if inverse is None else inverse[1],
            )  # fmt: skip
        return self._stride

    def stride_per_key(self) -> list[int]:
        """Number of bags (examples) of each key."""
        if self._stride_per_key is None:
            if self._stride_per_key_per_rank is not None:
                self._stride_per_key = [sum(row) for row in self._stride_per_key_per_rank]
            else:
                self._stride_per_key = [self.stride()] * len(self._keys)
        return self._stride_per_key

    def stride_per_key_per_rank(self) -> list[list[int]]:
        """``[F][R]`` batch size of each key from each rank; ``[]`` unless VBE."""
        strides = self._stride_per_key_per_rank
        return [] if strides is None else [list(row) for row in strides]

    def variable_stride_per_key(self) -> bool:
        """Whether keys have their own batch sizes (VBE: ``stride_per_key_per_rank`` given)."""
        return self._stride_per_key_per_rank is not None

    def inverse_indices(self) -> tuple[list[str], torch.Tensor]:
        if self._inverse_indices is None:
            raise ValueError(
                f"{_OWNER} has no inverse_indices; pass inverse_indices=(keys, tensor) when "
                "building it, or call inverse_indices_or_none()"
            )
        return self._inverse_indices

    def inverse_indices_or_none(self) -> tuple[list[str], torch.Tensor] | None:
        return self._inverse_indices

    # -- per-key metadata (see [Note: KJT metadata]) -----------------------------------------

    def length_per_key(self) -> list[int]:
        """Ids of each key: one device->host sync the first time, then cached."""
        if self._length_per_key is None:
            self._length_per_key = _kjt_ops.ids_per_key(self)
        return self._length_per_key

    def length_per_key_or_none(self) -> list[int] | None:
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        """``[F + 1]`` where each key's ids start in ``values``, then ``N``."""
        if self._offset_per_key is None:
            self._offset_per_key = cumsum_list(self.length_per_key())
        return self._offset_per_key

    def offset_per_key_or_none(self) -> list[int] | None:
        return self._offset_per_key

    def lengths_offset_per_key(self) -> list[int]:
        """``[F + 1]`` where each key's bags start in ``lengths``, then ``len(lengths)``."""
        if self._lengths_offset_per_key is None:
            self._lengths_offset_per_key = cumsum_list(self.stride_per_key())
        return self._lengths_offset_per_key

    def index_per_key(self) -> dict[str, int]:
        """Key -> its position in `keys` (the last one if `permute` repeated it)."""
        if self._index_per_key is None:
            self._index_per_key = {key: i for i, key in enumerate(self._keys)}
        return self._index_per_key

    def sync(self) -> KeyedJaggedTensor:
        """Compute ``length_per_key`` and ``offset_per_key`` now; returns ``self``."""
        self.offset_per_key()
        return self

    def unsync(self) -> KeyedJaggedTensor:
        """Forget ``length_per_key`` and ``offset_per_key``; returns ``self``."""
        self._length_per_key = None
        self._offset_per_key = None
        return self

    def __getitem__(self, key: str) -> JaggedTensor:
        """One key's bags, as views into this KJT's tensors."""
        index = self.index_per_key().get(key)
        if index is None:
            raise KeyError(f"{key!r} is not a key of this {_OWNER}; its keys are {self._keys}")
        start, end = self.offset_per_key()[index], self.offset_per_key()[index + 1]
        first, last = self.lengths_offset_per_key()[index : index + 2]
        weights = self._weights
        return JaggedTensor(
            values=self._values[start:end],
            weights=None if weights is None else weights[start:end],
            lengths=self.lengths()[first:last],
        )

    def to_dict(self, compute_offsets: bool = True) -> dict[str, JaggedTensor]:
        """Key -> its `JaggedTensor` (cached); for VBE each has that key's own batch size."""
        if self._jt_dict is None:
            self._jt_dict = _kjt_ops.to_dict(self, compute_offsets)
        return self._jt_dict

    def split(self, segments: list[int]) -> list[KeyedJaggedTensor]:
        """KJTs of consecutive key groups: ``segments[i]`` keys each (0 gives a KJT of no keys)."""
        pieces = _kjt_ops.split(_OWNER, self, segments)
        return [self if fields is None else self._make(**fields) for fields in pieces]

    def permute(
        self, indices: list[int], indices_tensor: torch.Tensor | None = None
    ) -> KeyedJaggedTensor:
        """Keys ``[keys[i] for i in indices]`` with their data; keys may repeat or be left out.

        ``indices_tensor``: ``indices`` already on this KJT's device (saves a host->device copy).
        """
        return self._make(**_kjt_ops.permute(_OWNER, self, indices, indices_tensor))

    def flatten_lengths(self) -> KeyedJaggedTensor:
        """This KJT with ``lengths`` as a 1-D view (they always are 1-D here)."""
        new = self._copy()
        new._lengths, new._length_per_key = self.lengths().view(-1), self.length_per_key()
        return new

    # -- devices and streams -----------------------------------------------------------------

    def to(
        self, device: torch.device, non_blocking: bool = False, dtype: torch.dtype | None = None
    ) -> KeyedJaggedTensor:
        """A copy on ``device`` with the metadata kept; ``dtype`` converts the weights only."""
        moved = self._moved(lambda t: t.to(device, non_blocking=non_blocking))
        if moved._weights is not None and dtype is not None:
            moved._weights = moved._weights.to(dtype)
        return moved

    def pin_memory(self) -> KeyedJaggedTensor:
        """A copy in pinned host memory, metadata kept."""
        return self._moved(lambda t: t.pin_memory())

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark values, weights, lengths and offsets as in use by ``stream``."""
        for tensor in (self._values, self._weights, self._lengths, self._offsets):
            if tensor is not None:
                tensor.record_stream(stream)

    # -- checks and printing -----------------------------------------------------------------

    def validate(self) -> KeyedJaggedTensor:
        """Check the data against the metadata; raises ValueError naming the key. Syncs with
        the device; returns ``self``, with ``length_per_key`` computed (the check counts each
        key's ids, so a later `length_per_key` costs no second sync)."""
        per_key = validate_kjt(
            _OWNER, self._keys, self._values, self._weights, self._lengths, self._offsets,
            stride=self._stride, stride_per_key_per_rank=self._stride_per_key_per_rank,
            length_per_key=self._length_per_key, offset_per_key=self._offset_per_key,
            lengths_offset_per_key=self.lengths_offset_per_key(),
            stride_per_key=self.stride_per_key(), inverse_indices=self._inverse_indices,
        )  # fmt: skip
        if self._length_per_key is None and per_key is not None:
            self._length_per_key = per_key
        return self

    def __str__(self) -> str:
        if not self._keys or (self._offsets is None and self._lengths is None):
            return f"{_OWNER}()\n"
        return kjt_string(self._keys, self._values, self._weights, self.offsets(),
                          self.lengths_offset_per_key())  # fmt: skip

    def __repr__(self) -> str:
        batch = (
            f"stride_per_key_per_rank={self._stride_per_key_per_rank}"
            if self.variable_stride_per_key()
            else f"stride={self.stride()}"
        )
        tensors = describe(values=self._values, weights=self._weights, lengths=self._lengths,
                           offsets=self._offsets)  # fmt: skip
        return f"{_OWNER}(keys={self._keys}, {batch}, {tensors})"
