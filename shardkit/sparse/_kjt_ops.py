"""The work behind the KeyedJaggedTensor: its computed metadata (batch size, ids per key) and
the ops that build new KJTs (split, permute, concat, to and from dicts of JaggedTensors).

Each function reads a KJT only through its public accessors (`KeyedJagged`), checks its own
arguments (free checks, see [Note: free checks] in `_checks`), and returns the new KJT's
constructor arguments; the class builds the KJT from them (`KeyedJaggedTensor._make`), so this
module does not know the class. Each one slices or gathers with the cached per-key lists (see
[Note: KJT metadata] in `_kjt`), never loops over the batch, and hands on the metadata it already
knows, so the result needs no device->host sync of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from shardkit.sparse._checks import check_ids, check_non_negative_ints
from shardkit.sparse._jagged import JaggedTensor
from shardkit.sparse._segments import (
    boundary_diffs,
    complete_cumsum,
    cumsum_list,
    gather_segments,
)

__all__ = [
    "KeyedJagged",
    "batch_size",
    "concat",
    "empty_like",
    "from_jt_dict",
    "ids_per_key",
    "permute",
    "split",
    "to_dict",
]

Fields = dict[str, Any]  # keyword arguments of the KeyedJaggedTensor constructor


class KeyedJagged(Protocol):
    """What these functions read of a `KeyedJaggedTensor`: public accessors only."""

    def keys(self) -> list[str]: ...
    def values(self) -> torch.Tensor: ...
    def weights(self) -> torch.Tensor: ...
    def weights_or_none(self) -> torch.Tensor | None: ...
    def lengths(self) -> torch.Tensor: ...
    def lengths_or_none(self) -> torch.Tensor | None: ...
    def offsets(self) -> torch.Tensor: ...
    def device(self) -> torch.device: ...
    def stride(self) -> int: ...
    def stride_per_key(self) -> list[int]: ...
    def stride_per_key_per_rank(self) -> list[list[int]]: ...
    def variable_stride_per_key(self) -> bool: ...
    def length_per_key(self) -> list[int]: ...
    def length_per_key_or_none(self) -> list[int] | None: ...
    def offset_per_key(self) -> list[int]: ...
    def lengths_offset_per_key(self) -> list[int]: ...
    def inverse_indices(self) -> tuple[list[str], torch.Tensor]: ...
    def inverse_indices_or_none(self) -> tuple[list[str], torch.Tensor] | None: ...


def batch_size(
    keys: list[str],
    num_bags: int,
    stride_per_key_per_rank: list[list[int]] | None,
    inverse_indices: torch.Tensor | None,
) -> int:
    """Bags over keys, or (VBE) the inverse indices' width or the largest key's bags."""
    if not keys:
        return 0
    if stride_per_key_per_rank is None:
        return num_bags // len(keys)
    if inverse_indices is not None and inverse_indices.numel() > 0:
        return inverse_indices.size(-1)
    return max((sum(row) for row in stride_per_key_per_rank), default=0)


def ids_per_key(kjt: KeyedJagged) -> list[int]:
    """``length_per_key``: one device->host sync, no loop over keys or batch."""
    if not kjt.keys():
        return []
    lengths = kjt.lengths_or_none()
    if lengths is None:
        return boundary_diffs(kjt.offsets(), kjt.lengths_offset_per_key())
    if not kjt.variable_stride_per_key():
        return lengths.view(len(kjt.keys()), kjt.stride()).sum(1).tolist()  # [F, B] -> [F]
    return boundary_diffs(complete_cumsum(lengths), kjt.lengths_offset_per_key())


def to_dict(kjt: KeyedJagged, compute_offsets: bool) -> dict[str, JaggedTensor]:
    """Key -> JaggedTensor of views into the KJT's tensors (one split of values per field)."""
    keys = kjt.keys()
    if not keys:
        return {}
    values = torch.split(kjt.values(), kjt.length_per_key())
    weights = kjt.weights_or_none()
    weights_per_key = (
        [None] * len(keys) if weights is None else torch.split(weights, kjt.length_per_key())
    )
    lengths = kjt.lengths()
    if kjt.variable_stride_per_key():
        lengths_per_key = list(torch.split(lengths, kjt.stride_per_key()))
        offsets_per_key = [complete_cumsum(one) if compute_offsets else None
                           for one in lengths_per_key]  # fmt: skip
    else:
        table = lengths.view(len(keys), kjt.stride())  # [F, B]
        lengths_per_key = list(table.unbind(0))
        offsets_per_key = [None] * len(keys)
        if compute_offsets:  # every key's offsets in one cumsum
            offsets = table.new_zeros(len(keys), kjt.stride() + 1)  # [F, B + 1]
            offsets[:, 1:] = torch.cumsum(table, 1, dtype=table.dtype)
            offsets_per_key = list(offsets.unbind(0))
    return {
        key: JaggedTensor(
            values=values[i],
            weights=weights_per_key[i],
            lengths=lengths_per_key[i],
            offsets=offsets_per_key[i],
        )
        for i, key in enumerate(keys)
    }


def from_jt_dict(owner: str, jt_dict: dict[str, JaggedTensor]) -> Fields:
    """The JaggedTensors key after key, with ``length_per_key`` from their sizes (no sync).

    Different batch sizes make a VBE KJT. ``jt_dict`` must not be empty.
    """
    jts = list(jt_dict.values())
    weighted = [jt.weights_or_none() is not None for jt in jts]
    if any(weighted) and not all(weighted):
        raise ValueError(
            f"{owner}.from_jt_dict: keys {_names(jt_dict, weighted, True)} have weights but "
            f"{_names(jt_dict, weighted, False)} do not; give every JaggedTensor weights, or none"
        )
    for key, jt in jt_dict.items():
        check_ids(f"{owner}.from_jt_dict", jt.values(), key=key)
    stride_per_key = [jt.lengths().numel() for jt in jts]
    fixed = len(set(stride_per_key)) == 1
    return {
        "keys": list(jt_dict),
        "values": _cat_ids([jt.values() for jt in jts]),
        "weights": torch.cat([jt.weights() for jt in jts]) if weighted[0] else None,
        "lengths": torch.cat([jt.lengths() for jt in jts]),
        "stride": stride_per_key[0] if fixed else None,
        "stride_per_key_per_rank": None if fixed else [[stride] for stride in stride_per_key],
        "length_per_key": [jt.values().size(0) for jt in jts],
    }


def _cat_ids(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` of ids in which empty tensors take no part in type promotion: an empty
    float32 ``torch.tensor([])`` must not turn int64 ids next to it into floats."""
    return torch.cat([part for part in parts if part.numel()] or parts)


def _names(jt_dict: dict[str, JaggedTensor], flags: list[bool], want: bool) -> list[str]:
    return [key for key, flag in zip(jt_dict, flags) if flag == want]


def split(owner: str, kjt: KeyedJagged, segments: list[int]) -> list[Fields | None]:
    """Consecutive key groups; None for a segment of all keys, which is ``kjt`` itself (as
    TorchRec)."""
    segments = check_non_negative_ints(f"{owner}.split", "segments", segments)
    keys = kjt.keys()
    if sum(segments) > len(keys):
        raise ValueError(
            f"{owner}.split: segments {segments} take {sum(segments)} keys but there are "
            f"{len(keys)} ({keys}); the segments count consecutive keys and must not sum to "
            "more than len(keys)"
        )
    out: list[Fields | None] = []
    start = 0
    for segment in segments:
        end = start + segment
        if segment == len(keys):
            out.append(None)
        elif segment == 0:
            out.append(_no_keys(kjt))
        else:
            out.append(_key_range(kjt, start, end))
        start = end
    return out


def _no_keys(kjt: KeyedJagged) -> Fields:
    """The 0-key piece of a split: same dtypes, device and stride; int32 lengths and offsets."""
    device, weights = kjt.device(), kjt.weights_or_none()
    return {
        "keys": [],
        "values": torch.empty(0, dtype=kjt.values().dtype, device=device),
        "weights": None if weights is None else torch.empty(0, dtype=weights.dtype, device=device),
        "lengths": torch.empty(0, dtype=torch.int32, device=device),
        "offsets": torch.empty(0, dtype=torch.int32, device=device),
        "stride": kjt.stride(),
        "stride_per_key_per_rank": [] if kjt.variable_stride_per_key() else None,
        "length_per_key": [],
        "offset_per_key": [0],
    }


def _key_range(kjt: KeyedJagged, start: int, end: int) -> Fields:
    """Keys ``start .. end - 1``: slices of the tensors and of every per-key list."""
    value_bounds = kjt.offset_per_key()[start : end + 1]
    bag_bounds = kjt.lengths_offset_per_key()[start : end + 1]
    first, last = value_bounds[0], value_bounds[-1]
    weights = kjt.weights_or_none()
    strides = kjt.stride_per_key_per_rank()
    return {
        "keys": kjt.keys()[start:end],
        "values": kjt.values()[first:last],
        "weights": None if weights is None else weights[first:last],
        "lengths": kjt.lengths()[bag_bounds[0] : bag_bounds[-1]],
        "stride": kjt.stride(),
        "stride_per_key_per_rank": strides[start:end] if kjt.variable_stride_per_key() else None,
        "stride_per_key": kjt.stride_per_key()[start:end],
        "length_per_key": kjt.length_per_key()[start:end],
        "offset_per_key": [bound - first for bound in value_bounds],
        "lengths_offset_per_key": [bound - bag_bounds[0] for bound in bag_bounds],
    }


def permute(
    owner: str, kjt: KeyedJagged, indices: list[int], indices_tensor: torch.Tensor | None
) -> Fields:
    """Keys in the order ``indices`` (repeats allowed): one gather for values and weights."""
    keys = kjt.keys()
    bad = [
        i
        for i in indices
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(keys)
    ]
    if bad:
        raise ValueError(
            f"{owner}.permute: indices {list(indices)} include {bad[0]!r}, which is not a key "
            f"position; this KJT has {len(keys)} keys, so each index must be in [0, {len(keys)})"
        )
    length_per_key, stride_per_key = kjt.length_per_key(), kjt.stride_per_key()
    device = kjt.device()
    value_index = gather_segments(
        [kjt.offset_per_key()[i] for i in indices], [length_per_key[i] for i in indices], device
    )
    if kjt.variable_stride_per_key():
        bag_index = gather_segments(
            [kjt.lengths_offset_per_key()[i] for i in indices],
            [stride_per_key[i] for i in indices],
            device,
        )
        lengths = kjt.lengths().index_select(0, bag_index)
    else:
        if indices_tensor is None:
            indices_tensor = torch.tensor(indices, dtype=torch.int64, device=device)
        table = kjt.lengths().view(len(keys), kjt.stride())  # [F, B]
        lengths = table.index_select(0, indices_tensor).view(-1)
    return _permuted(kjt, indices, lengths, value_index)


def _permuted(
    kjt: KeyedJagged, indices: list[int], lengths: torch.Tensor, value_index: torch.Tensor
) -> Fields:
    weights = kjt.weights_or_none()
    length_per_key = [kjt.length_per_key()[i] for i in indices]
    stride_per_key = [kjt.stride_per_key()[i] for i in indices]
    strides = kjt.stride_per_key_per_rank()
    return {
        "keys": [kjt.keys()[i] for i in indices],
        "values": kjt.values().index_select(0, value_index),
        "weights": None if weights is None else weights.index_select(0, value_index),
        "lengths": lengths,
        "stride": kjt.stride(),
        "stride_per_key_per_rank": (
            [strides[i] for i in indices] if kjt.variable_stride_per_key() else None
        ),
        "stride_per_key": stride_per_key,
        "length_per_key": length_per_key,
        "offset_per_key": cumsum_list(length_per_key),
        "lengths_offset_per_key": cumsum_list(stride_per_key),
    }


def concat(owner: str, kjts: Sequence[KeyedJagged]) -> Fields:
    """All keys of all KJTs in order; the batch description must agree (see `_agree`)."""
    if not kjts:
        raise ValueError(f"{owner}.concat: got no KeyedJaggedTensors; pass a non-empty list")
    stride, vbe = _agree(owner, kjts)
    weighted = kjts[0].weights_or_none() is not None
    known = all(k.length_per_key_or_none() is not None for k in kjts)
    inverse = None
    if kjts[0].inverse_indices_or_none() is not None:
        parts = [k.inverse_indices() for k in kjts]
        inverse = ([name for part in parts for name in part[0]], torch.cat([p[1] for p in parts]))
    return {
        "keys": list(itertools.chain.from_iterable(k.keys() for k in kjts)),
        "values": _cat_ids([k.values() for k in kjts]),
        "weights": torch.cat([k.weights() for k in kjts]) if weighted else None,
        "lengths": torch.cat([k.lengths() for k in kjts]),
        "stride": None if vbe else stride,
        "stride_per_key_per_rank": (
            [row for k in kjts for row in k.stride_per_key_per_rank()] if vbe else None
        ),
        "length_per_key": [n for k in kjts for n in k.length_per_key()] if known else None,
        "inverse_indices": inverse,
    }


def _agree(owner: str, kjts: Sequence[KeyedJagged]) -> tuple[int, bool]:
    """Same weightedness, VBE or not, same stride (KJTs without keys aside), inverse indices on
    all or none. Returns the stride and whether they are VBE."""

    def differ(name: str, flags: list[object]) -> None:
        if len(set(flags)) > 1:
            raise ValueError(
                f"{owner}.concat: the KJTs differ in {name} ({flags}, in list order); "
                f"concatenate only KJTs that agree on it"
            )

    differ("being weighted", [k.weights_or_none() is not None for k in kjts])
    differ("variable batch size per key", [k.variable_stride_per_key() for k in kjts])
    differ("having inverse_indices", [k.inverse_indices_or_none() is not None for k in kjts])
    vbe = kjts[0].variable_stride_per_key()
    with_keys = [k for k in kjts if k.keys()] or kjts
    if not vbe:
        differ("stride (batch size)", [k.stride() for k in with_keys])
    return with_keys[0].stride(), vbe


def empty_like(kjt: KeyedJagged) -> Fields:
    """No keys but ``kjt``'s dtypes and device; as TorchRec, a VBE KJT's per-rank batch sizes
    stay on the key-less copy, so ``stride_per_key_per_rank()`` still describes the batch (and
    ``stride()`` is 0, as for any KJT without keys)."""
    here, weights = kjt.device(), kjt.weights_or_none()
    vbe = kjt.variable_stride_per_key()
    return {
        "keys": [],
        "values": torch.empty(0, dtype=kjt.values().dtype, device=here),
        "weights": None if weights is None else torch.empty(0, dtype=weights.dtype, device=here),
        "lengths": torch.empty(0, dtype=kjt.lengths().dtype, device=here),
        "stride": None if vbe else kjt.stride(),
        "stride_per_key_per_rank": kjt.stride_per_key_per_rank() if vbe else None,
    }
