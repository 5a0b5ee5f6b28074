"""`KeyedTensor`: dense per-key tensors (pooled embeddings) concatenated along one dimension.

[Note: regroup]
`KeyedTensor.regroup` turns the outputs of several modules (each a KeyedTensor) into the groups
the next layer wants, e.g. ``[["user", "product"], ["ad"]]``. All inputs are concatenated along
``key_dim`` (skipped for one input), one ``index_select`` picks every group's columns in order
and one ``split`` cuts the groups apart. The index is built from the host-side per-key offsets,
so there is no sync; the number of kernels does not depend on the batch or the number of keys;
and autograd goes through ``index_select`` (its backward is one ``index_add``, which also sums
the gradients of a key that appears in several groups).
"""

from __future__ import annotations

import itertools

import torch

from shardkit.sparse._checks import check_keys, check_non_negative_ints
from shardkit.sparse._format import describe, kt_string
from shardkit.sparse._segments import cumsum_list, gather_segments

__all__ = ["KeyedTensor"]

_OWNER = "KeyedTensor"


class KeyedTensor:
    """Dense tensors of different widths under keys, concatenated along ``key_dim``.

    Worked example: pooled embeddings of a batch of 2 for keys "product" (dim 2) and "user"
    (dim 3), ``key_dim=1``::

        example   product      user
        0         [1, 1]       [2, 2, 2]
        1         [3, 3]       [4, 4, 4]

        keys           = ["product", "user"]
        length_per_key = [2, 3]
        offset_per_key = [0, 2, 5]
        values         = [[1, 1, 2, 2, 2],        # [B, sum(length_per_key)] = [2, 5]
                          [3, 3, 4, 4, 4]]
        kt["user"]     = [[2, 2, 2], [4, 4, 4]]   # [B, 3], a view of values

    Args:
        keys: one name per tensor, unique.
        length_per_key: width of each key's tensor along ``key_dim``.
        values: the concatenated tensor, e.g. ``[B, sum(length_per_key)]``.
        key_dim: the dimension the keys are laid out along (1: ``B`` is dimension 0).
        offset_per_key, index_per_key: cached metadata, as the methods return it.
    """

    def __init__(
        self,
        keys: list[str],
        length_per_key: list[int],
        values: torch.Tensor,
        key_dim: int = 1,
        offset_per_key: list[int] | None = None,
        index_per_key: dict[str, int] | None = None,
    ) -> None:
        keys = check_keys(_OWNER, keys)
        length_per_key = check_non_negative_ints(_OWNER, "length_per_key", length_per_key)
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"{_OWNER}: values must be a torch.Tensor, got {type(values).__name__}")
        if not 0 <= key_dim < values.dim():
            raise ValueError(
                f"{_OWNER}: key_dim {key_dim} is not a dimension of values with shape "
                f"{tuple(values.shape)}; pass key_dim in [0, {values.dim()})"
            )
        width = values.size(key_dim)
        if len(length_per_key) != len(keys) or sum(length_per_key) != width:
            raise ValueError(
                f"{_OWNER}: length_per_key {length_per_key} for keys {keys} must have one entry "
                f"per key summing to values.shape[{key_dim}] = {width}"
            )
        self._keys = keys
        self._length_per_key = length_per_key
        self._values = values
        self._key_dim = key_dim
        self._offset_per_key = offset_per_key
        self._index_per_key = index_per_key

    @staticmethod
    def from_tensor_list(
        keys: list[str], tensors: list[torch.Tensor], key_dim: int = 1, cat_dim: int = 1
    ) -> KeyedTensor:
        """Concatenate ``tensors`` along ``cat_dim``, key ``keys[i]`` for ``tensors[i]``."""
        if len(keys) != len(tensors) or not tensors:
            raise ValueError(
                f"{_OWNER}.from_tensor_list: {len(keys)} keys for {len(tensors)} tensors; "
                "give one key per tensor, and at least one tensor"
            )
        return KeyedTensor(
            keys=keys,
            length_per_key=[t.size(key_dim) for t in tensors],
            values=torch.cat(tensors, dim=cat_dim),
            key_dim=key_dim,
        )

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        """The concatenated tensor, e.g. ``[B, sum(length_per_key)]``."""
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def device(self) -> torch.device:
        return self._values.device

    def length_per_key(self) -> list[int]:
        """Width of each key along ``key_dim``."""
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        """``[F + 1]`` where each key starts along ``key_dim``, then the total width."""
        if self._offset_per_key is None:
            self._offset_per_key = cumsum_list(self._length_per_key)
        return self._offset_per_key

    def _key_indices(self) -> dict[str, int]:
        if self._index_per_key is None:
            self._index_per_key = {key: i for i, key in enumerate(self._keys)}
        return self._index_per_key

    def __getitem__(self, key: str) -> torch.Tensor:
        """The key's tensor, a view of ``values``."""
        index = self._key_indices().get(key)
        if index is None:
            raise KeyError(f"{key!r} is not a key of this {_OWNER}; its keys are {self._keys}")
        start = self.offset_per_key()[index]
        return self._values.narrow(self._key_dim, start, self._length_per_key[index])

    def to_dict(self) -> dict[str, torch.Tensor]:
        """Key -> its tensor (views of ``values``, from one split)."""
        parts = self._values.split(self._length_per_key, dim=self._key_dim)
        return dict(zip(self._keys, parts))

    @staticmethod
    def regroup(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[torch.Tensor]:
        """One tensor per group: its keys' tensors concatenated along ``key_dim``.

        Keys may appear in several groups or in none. Differentiable; see [Note: regroup].
        """
        return _regroup(keyed_tensors, groups)

    @staticmethod
    def regroup_as_dict(
        keyed_tensors: list[KeyedTensor], groups: list[list[str]], keys: list[str]
    ) -> dict[str, torch.Tensor]:
        """`regroup`, with ``keys[i]`` naming group ``i``."""
        if len(groups) != len(keys):
            raise ValueError(
                f"{_OWNER}.regroup_as_dict: {len(groups)} groups but {len(keys)} keys {keys}; "
                "give one name per group"
            )
        return dict(zip(keys, _regroup(keyed_tensors, groups)))

    def to(self, device: torch.device, non_blocking: bool = False) -> KeyedTensor:
        """A copy on ``device``."""
        return KeyedTensor(
            keys=self._keys,
            length_per_key=self._length_per_key,
            values=self._values.to(device, non_blocking=non_blocking),
            key_dim=self._key_dim,
            offset_per_key=self._offset_per_key,
            index_per_key=self._index_per_key,
        )

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark ``values`` as in use by ``stream``."""
        self._values.record_stream(stream)

    def __str__(self) -> str:
        if not self._keys:
            return f"{_OWNER}()\n"
        return kt_string(self._keys, [self[key] for key in self._keys])

    def __repr__(self) -> str:
        return (
            f"{_OWNER}(keys={self._keys}, length_per_key={self._length_per_key}, "
            f"key_dim={self._key_dim}, {describe(values=self._values)})"
        )


def _regroup(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[torch.Tensor]:
    """See [Note: regroup]."""
    if not keyed_tensors:
        raise ValueError(f"{_OWNER}.regroup: got no KeyedTensors; pass at least one")
    key_dim = keyed_tensors[0].key_dim()
    dims = [kt.key_dim() for kt in keyed_tensors]
    if len(set(dims)) > 1:
        raise ValueError(
            f"{_OWNER}.regroup: the KeyedTensors have key_dim {dims}; they must share one"
        )
    wanted = [key for group in groups for key in group]
    known = list(itertools.chain.from_iterable(kt.keys() for kt in keyed_tensors))
    known_set = set(known)
    missing = [key for key in wanted if key not in known_set]
    if missing:
        raise ValueError(
            f"{_OWNER}.regroup: groups name {missing}, which no KeyedTensor has; the keys are "
            f"{known}"
        )
    # Only inputs that give a key take part, so the others get no gradient (None, not zeros).
    used = set(wanted)
    keyed_tensors = [kt for kt in keyed_tensors if used.intersection(kt.keys())] or keyed_tensors
    span = _spans(keyed_tensors)
    values = [kt.values() for kt in keyed_tensors]
    flat = values[0] if len(values) == 1 else torch.cat(values, dim=key_dim)
    starts = [span[key][0] for key in wanted]
    sizes = [span[key][1] for key in wanted]
    index = gather_segments(starts, sizes, flat.device)
    picked = flat.index_select(key_dim, index)
    group_sizes = [sum(span[key][1] for key in group) for group in groups]
    return list(picked.split(group_sizes, dim=key_dim))


def _spans(keyed_tensors: list[KeyedTensor]) -> dict[str, tuple[int, int]]:
    """Key -> (start, width) in the concatenation of all values along ``key_dim``."""
    span: dict[str, tuple[int, int]] = {}
    base = 0
    for position, kt in enumerate(keyed_tensors):
        for key, start, width in zip(kt.keys(), kt.offset_per_key(), kt.length_per_key()):
            if key in span:
                raise ValueError(
                    f"{_OWNER}.regroup: key {key!r} is in more than one KeyedTensor (again in "
                    f"number {position}); each key must come from exactly one, rename one of them"
                )
            span[key] = (base + start, width)
        base += kt.offset_per_key()[-1]
    return span
