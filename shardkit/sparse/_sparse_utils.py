"""Helpers around the sparse types at TorchRec's path ``torchrec.sparse.jagged_tensor``:
conversion modules, equality checks, flattening lists of KJTs into tensors and back, and
regrouping pooled embeddings."""

from __future__ import annotations

import abc

import torch
from torch import nn

from shardkit.sparse._jagged import JaggedTensor
from shardkit.sparse._keyed import KeyedTensor
from shardkit.sparse._kjt import KeyedJaggedTensor

__all__ = [
    "ComputeJTDictToKJT",
    "ComputeKJTToJTDict",
    "JaggedTensorMeta",
    "flatten_kjt_list",
    "jt_is_equal",
    "kjt_is_equal",
    "permute_multi_embedding",
    "regroup_kts",
    "unflatten_kjt_list",
]

# Tensors per KJT in `flatten_kjt_list`: values, weights, lengths, offsets,
# stride_per_key_per_rank (as a tensor), inverse indices.
_FIELDS = 6


class JaggedTensorMeta(abc.ABCMeta):
    """TorchRec's metaclass of its sparse types (an ABC metaclass; shardkit's sparse types are
    plain classes, so ``isinstance`` on them costs nothing extra)."""


class ComputeKJTToJTDict(nn.Module):
    """A module whose forward is ``kjt.to_dict()``: key -> `JaggedTensor`."""

    def forward(self, keyed_jagged_tensor: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        return keyed_jagged_tensor.to_dict()


class ComputeJTDictToKJT(nn.Module):
    """A module whose forward is ``KeyedJaggedTensor.from_jt_dict(jt_dict)``."""

    def forward(self, jt_dict: dict[str, JaggedTensor]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_jt_dict(jt_dict)


def _same(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.allclose(a, b))
    return a == b


def jt_is_equal(jt_1: JaggedTensor, jt_2: JaggedTensor) -> bool:
    """Whether two JaggedTensors hold the same values, weights, lengths and offsets (allclose;
    absent weights equal only absent weights)."""
    if not isinstance(jt_1, JaggedTensor) or not isinstance(jt_2, JaggedTensor):
        return False
    pairs = [(jt_1.values(), jt_2.values()), (jt_1.weights_or_none(), jt_2.weights_or_none()),
             (jt_1.lengths(), jt_2.lengths()), (jt_1.offsets(), jt_2.offsets())]  # fmt: skip
    return all(_same(a, b) for a, b in pairs)


def kjt_is_equal(kjt_1: KeyedJaggedTensor, kjt_2: KeyedJaggedTensor) -> bool:
    """Whether two KJTs have the same keys in the same order and the same values, weights,
    lengths, offsets, per-key lengths and batch size (allclose)."""
    if not isinstance(kjt_1, KeyedJaggedTensor) or not isinstance(kjt_2, KeyedJaggedTensor):
        return False
    if kjt_1.keys() != kjt_2.keys():
        return False
    pairs = [(kjt_1.values(), kjt_2.values()), (kjt_1.weights_or_none(), kjt_2.weights_or_none()),
             (kjt_1.lengths(), kjt_2.lengths()), (kjt_1.offsets(), kjt_2.offsets()),
             (kjt_1.length_per_key(), kjt_2.length_per_key()),
             (kjt_1.offset_per_key(), kjt_2.offset_per_key()),
             (kjt_1.stride(), kjt_2.stride())]  # fmt: skip
    return all(_same(a, b) for a, b in pairs)


def flatten_kjt_list(
    kjt_arr: list[KeyedJaggedTensor],
) -> tuple[list[torch.Tensor | None], list[list[str]]]:
    """The tensors of each KJT (six per KJT, None where absent) and each KJT's keys;
    `unflatten_kjt_list` rebuilds the list."""
    data: list[torch.Tensor | None] = []
    contexts = []
    for kjt in kjt_arr:
        strides = kjt.stride_per_key_per_rank() if kjt.variable_stride_per_key() else None
        inverse = kjt.inverse_indices_or_none()
        data += [kjt.values(), kjt.weights_or_none(), kjt.lengths(), kjt.offsets(),
                 None if strides is None else torch.tensor(strides, dtype=torch.int64),
                 None if inverse is None else inverse[1]]  # fmt: skip
        contexts.append(list(kjt.keys()))
    return data, contexts


def unflatten_kjt_list(
    values: list[torch.Tensor | None], contexts: list[list[str]]
) -> list[KeyedJaggedTensor]:
    """The KJTs `flatten_kjt_list` flattened."""
    out = []
    for j, keys in enumerate(contexts):
        vals, weights, lengths, offsets, strides, inverse = values[j * _FIELDS : (j + 1) * _FIELDS]
        assert vals is not None, "a flattened KJT always has values"
        out.append(
            KeyedJaggedTensor(
                keys, vals, weights, lengths, offsets,
                stride_per_key_per_rank=None if strides is None else strides.tolist(),
                inverse_indices=None if inverse is None else (keys, inverse),
            )
        )  # fmt: skip
    return out


def regroup_kts(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[torch.Tensor]:
    """One tensor per group of keys, its keys' embeddings side by side
    (`KeyedTensor.regroup`)."""
    return KeyedTensor.regroup(keyed_tensors, groups)


def permute_multi_embedding(
    keyed_tensors: list[KeyedTensor], groups: list[list[str]]
) -> list[torch.Tensor]:
    """The same as `regroup_kts` (TorchRec's other kernel for it)."""
    return KeyedTensor.regroup(keyed_tensors, groups)
