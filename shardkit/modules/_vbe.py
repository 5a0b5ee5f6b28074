"""Variable batch per feature (VBE) into an `EmbeddingBagCollection`: a KJT whose keys have
their own batch sizes (``stride_per_key``), deduplicated, with ``inverse_indices`` mapping each
example of the full batch to its bag.

Worked example, batch of 3 examples, "user" deduplicated to one bag, "item" not::

    keys        user      item
    bags        [7 8]     [1] [2] []          lengths [2, 1, 1, 0], stride_per_key [1, 3]
    inverse     [0 0 0]   [0 1 2]

`expand_variable_batch` gives the plain KJT of the full batch: user ``[7 8] [7 8] [7 8]``,
item ``[1] [2] []``. Pooling it equals pooling the deduplicated bags and expanding the pooled
rows by ``inverse_indices`` (TorchRec's unsharded semantics), and so do the gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["expand_bags", "expand_variable_batch"]


def expand_variable_batch(
    features: KeyedJaggedTensor, *, keys: Sequence[str] | None = None
) -> KeyedJaggedTensor:
    """``features`` for the full batch: each key's bags repeated by its ``inverse_indices``
    row (``features`` itself when its keys share one batch size). ``keys``: expand only these
    (the result has only them)."""
    if not features.variable_stride_per_key():
        return (
            features if keys is None else features.permute([features.keys().index(k) for k in keys])
        )
    found = features.inverse_indices_or_none()
    if found is None:
        raise ValueError(
            f"a KeyedJaggedTensor with a batch size per key ({features.stride_per_key()}) needs "
            "inverse_indices (keys, [num_keys, B]) to say which bag each example uses; build it "
            "with inverse_indices=, or give every key the same batch size"
        )
    only, (keys, inverse) = keys, found
    chosen = features.keys() if only is None else only
    missing = [k for k in chosen if k not in keys]
    if missing:
        raise ValueError(
            f"inverse_indices lacks keys {missing} of the KeyedJaggedTensor (it has {list(keys)}); "
            "give every key a row, torch.arange(B) for a key that is not deduplicated"
        )
    row = {key: i for i, key in enumerate(keys)}
    by_key = features.to_dict()
    return KeyedJaggedTensor.from_jt_dict(
        {key: expand_bags(by_key[key], inverse[row[key]].long()) for key in chosen}
    )


def expand_bags(jt: JaggedTensor, index: torch.Tensor) -> JaggedTensor:
    """The bags ``index`` ``[B]`` picks from ``jt``, in that order. ``jt``'s values may be
    ids ``[n]`` or rows ``[n, D]`` (a sequence collection's output; the gather's gradient adds
    the rows' gradients back into the bags they came from)."""
    lengths = jt.lengths()[index]  # [B]
    starts = jt.offsets()[:-1][index]
    new_starts = torch.cumsum(lengths, 0) - lengths
    within = torch.arange(int(lengths.sum()), device=lengths.device)
    positions = within + (starts - new_starts).repeat_interleave(lengths)
    weights = jt.weights_or_none()
    return JaggedTensor(
        values=jt.values()[positions],
        lengths=lengths,
        weights=None if weights is None else weights[positions],
    )
