"""The sparse types as pytree nodes, so that they pass into and out of `torch.compile`d and
`torch.export`ed functions.

[Note: sparse pytrees]
A pytree node flattens to its tensors (the leaves, which a compiler or exporter traces and may
give symbolic sizes) and a *context*: the static structure, which must be equal between two
inputs for one traced program to serve both. So the context holds only what does not change
from batch to batch:

- `JaggedTensor`: leaves ``values, weights, lengths``; no context.
- `KeyedJaggedTensor`: leaves ``values, weights, lengths, inverse_indices``; context the keys,
  and for a batch size per key (VBE) ``stride_per_key_per_rank`` (VBE batches differ by key, so
  their sizes are structure), and the inverse indices' keys.
- `KeyedTensor`: leaf ``values``; context the keys, ``length_per_key`` and ``key_dim``.

Offsets are not a leaf: a KJT built from offsets flattens to the lengths they describe (one
``diff``), so a KJT given lengths and one given offsets have the same structure. The batch size
is not context either: it is ``len(lengths) // len(keys)``, so with a symbolic ``lengths`` size
(``torch.export`` ``Dim``s) it is symbolic too, and one exported program serves every batch size.
Cached per-key metadata (``length_per_key``, ...) is dropped: it is data, and a traced program
recomputes what it needs from the tensors. An absent tensor (no weights) is a ``None`` leaf, so
``dynamic_shapes`` name the leaves in order, e.g. ``[{0: ids}, None, {0: num_keys * batch},
None]`` for a KJT's values, weights, lengths and inverse indices.

Each type is registered once, when `shardkit.sparse` is imported, with a serialized type name
(``shardkit.KeyedJaggedTensor``, ...) and JSON-able contexts, so a `torch.export.save`d program
whose inputs or outputs are these types round-trips through `torch.export.load` in a process
that imports shardkit. A program meant for a process without shardkit takes plain tensors
instead (see `shardkit.export_program`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from shardkit.sparse._jagged import JaggedTensor
from shardkit.sparse._keyed import KeyedTensor
from shardkit.sparse._kjt import KeyedJaggedTensor

__all__ = ["register_sparse_pytrees"]

_JT_FIELDS = ("_values", "_weights", "_lengths")
_KJT_FIELDS = ("_values", "_weights", "_lengths", "_inverse_indices")

Context = Any


# -- JaggedTensor ------------------------------------------------------------------------------


def _jt_flatten(jt: JaggedTensor) -> tuple[list[torch.Tensor | None], Context]:
    return [jt.values(), jt.weights_or_none(), jt.lengths()], None


def _jt_flatten_with_keys(jt: JaggedTensor) -> tuple[list[tuple[Any, Any]], Context]:
    leaves, context = _jt_flatten(jt)
    return [(pytree.GetAttrKey(name), leaf) for name, leaf in zip(_JT_FIELDS, leaves)], context


def _jt_unflatten(leaves: Any, context: Context) -> JaggedTensor:
    values, weights, lengths = leaves
    return JaggedTensor(values=values, weights=weights, lengths=lengths)


# -- KeyedJaggedTensor -------------------------------------------------------------------------


def _kjt_context(kjt: KeyedJaggedTensor) -> Context:
    strides = kjt.stride_per_key_per_rank() if kjt.variable_stride_per_key() else None
    inverse = kjt.inverse_indices_or_none()
    return (
        tuple(kjt.keys()),
        None if strides is None else tuple(tuple(row) for row in strides),
        None if inverse is None else tuple(inverse[0]),
    )


def _kjt_flatten(kjt: KeyedJaggedTensor) -> tuple[list[torch.Tensor | None], Context]:
    inverse = kjt.inverse_indices_or_none()
    leaves = [kjt.values(), kjt.weights_or_none(), kjt.lengths(),
              None if inverse is None else inverse[1]]  # fmt: skip
    return leaves, _kjt_context(kjt)


def _kjt_flatten_with_keys(kjt: KeyedJaggedTensor) -> tuple[list[tuple[Any, Any]], Context]:
    leaves, context = _kjt_flatten(kjt)
    return [(pytree.GetAttrKey(name), leaf) for name, leaf in zip(_KJT_FIELDS, leaves)], context


def _kjt_unflatten(leaves: Any, context: Context) -> KeyedJaggedTensor:
    values, weights, lengths, inverse = leaves
    keys, strides, inverse_keys = context
    return KeyedJaggedTensor._make(
        keys=list(keys),
        values=values,
        weights=weights,
        lengths=lengths,
        stride_per_key_per_rank=None if strides is None else [list(row) for row in strides],
        inverse_indices=None if inverse_keys is None else (list(inverse_keys), inverse),
    )


def _kjt_to_json(context: Context) -> Any:
    keys, strides, inverse_keys = context
    return [list(keys), None if strides is None else [list(r) for r in strides],
            None if inverse_keys is None else list(inverse_keys)]  # fmt: skip


def _kjt_from_json(data: Any) -> Context:
    keys, strides, inverse_keys = data
    return (
        tuple(keys),
        None if strides is None else tuple(tuple(row) for row in strides),
        None if inverse_keys is None else tuple(inverse_keys),
    )


# -- KeyedTensor -------------------------------------------------------------------------------


def _kt_flatten(kt: KeyedTensor) -> tuple[list[torch.Tensor], Context]:
    return [kt.values()], (tuple(kt.keys()), tuple(kt.length_per_key()), kt.key_dim())


def _kt_flatten_with_keys(kt: KeyedTensor) -> tuple[list[tuple[Any, Any]], Context]:
    leaves, context = _kt_flatten(kt)
    return [(pytree.GetAttrKey("_values"), leaves[0])], context


def _kt_unflatten(leaves: Any, context: Context) -> KeyedTensor:
    keys, length_per_key, key_dim = context
    return KeyedTensor(keys=list(keys), length_per_key=list(length_per_key),
                       values=leaves[0], key_dim=key_dim)  # fmt: skip


def _kt_to_json(context: Context) -> Any:
    keys, length_per_key, key_dim = context
    return [list(keys), list(length_per_key), key_dim]


def _kt_from_json(data: Any) -> Context:
    keys, length_per_key, key_dim = data
    return tuple(keys), tuple(length_per_key), key_dim


def register_sparse_pytrees() -> None:
    """Register the three types (see [Note: sparse pytrees]); a second call does nothing."""
    if KeyedJaggedTensor in pytree.SUPPORTED_NODES:
        return
    pytree.register_pytree_node(
        JaggedTensor,
        _jt_flatten,
        _jt_unflatten,
        serialized_type_name="shardkit.JaggedTensor",
        flatten_with_keys_fn=_jt_flatten_with_keys,
    )
    pytree.register_pytree_node(
        KeyedJaggedTensor,
        _kjt_flatten,
        _kjt_unflatten,
        serialized_type_name="shardkit.KeyedJaggedTensor",
        to_dumpable_context=_kjt_to_json,
        from_dumpable_context=_kjt_from_json,
        flatten_with_keys_fn=_kjt_flatten_with_keys,
    )
    pytree.register_pytree_node(
        KeyedTensor,
        _kt_flatten,
        _kt_unflatten,
        serialized_type_name="shardkit.KeyedTensor",
        to_dumpable_context=_kt_to_json,
        from_dumpable_context=_kt_from_json,
        flatten_with_keys_fn=_kt_flatten_with_keys,
    )
