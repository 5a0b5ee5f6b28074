"""The collections' forward as `torch.export` traces it: aten operators only, no host sync.

[Note: exported lookups]
An exported program runs where shardkit is not installed (a serving process with only torch,
or an AOTInductor package), so what it calls must be torch's own operators: ``embedding_bag``
and ``embedding`` on the stacked tables (the eager kernel's forward), not the compiled kernel's
``shardkit::`` operators. And its shapes must follow the input's without reading the data: the
eager forward reads ``length_per_key`` (one sync) to cut ``values`` into each group's ids, which
would fix the program to one batch's id counts.

So each group's kernel input is built at the size of the whole ``values`` (``N``, a symbolic size
the input gives): bags of the group's keys, in the plan's order, at the front; then the other
keys' places, as row 0 with weight 0 in the last bag (they add nothing, and torch's quantized
operators want the last offset to be ``N``). The position ``j`` of that layout is filled from ``values[source[j]]``:
``j``'s bag is found by ``searchsorted`` in the group's offsets and ``source`` is that bag's start
in ``values`` plus ``j``'s place in the bag. When the group is all of the KJT's keys in order (one
table dim, keys as the module lists them: the common case) that is the identity and ``values``
is used as it is. A sequence collection's rows are looked up in the KJT's own order and cut per
key with the per-key id counts as unbacked sizes (``torch._check`` states what the cut needs).

Id validation becomes ``torch._assert_async``: one check per key, in the graph, that raises with
the key, its table and the rule (not the bad id and its position, which the message could only
name after a host sync).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from shardkit.modules._inputs import InputPlan
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = [
    "assert_ids_in_range",
    "ids_per_key_unbacked",
    "key_of_bag",
    "traced_group_input",
    "traced_pooled",
    "traced_sequence",
]


def key_of_bag(num_keys: int, stride: int, device: torch.device) -> torch.Tensor:
    """``[K * B]`` the key of each bag (key-major): ``arange // B``, not ``repeat_interleave``,
    whose traced form guards ``B != 1`` and would refuse a batch of one."""
    return torch.div(torch.arange(num_keys * stride, device=device), max(stride, 1),
                     rounding_mode="floor")  # fmt: skip


def _bag_starts(lengths: torch.Tensor) -> torch.Tensor:
    """``[bags + 1]`` int64 offsets of ``lengths``."""
    offsets = lengths.new_zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    return offsets


def traced_group_input(
    kjt: KeyedJaggedTensor,
    key_index: Sequence[int],
    row_bases: Sequence[int],
    mean_per_key: Sequence[bool],
    *,
    use_weights: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A lookup's input with no host sync (see [Note: exported lookups]).

    Args:
        kjt: one batch size ``B`` for all keys.
        key_index: the keys to look up (positions in ``kjt``), in the order of the output bags.
        row_bases: per looked-up key, its table's first row in the stacked buffer.
        mean_per_key: per looked-up key, whether its bags are MEAN pooled.
        use_weights: take ``kjt``'s weights (if any) as per-id weights.

    Returns:
        ``ids`` ``[N]`` int64, ``offsets`` ``[K * B + 1]`` int64, and per-id weights ``[N]``
        (the KJT's, times ``1 / length`` for MEAN bags) or None. When the keys are not all of
        ``kjt``'s in order, the ids of the others come last, as row 0 of weight 0 in the last
        bag (torch's quantized operators want the last offset to be ``N``).
    """
    values, lengths = kjt.values(), kjt.lengths()
    weights = kjt.weights_or_none() if use_weights else None
    num_keys, num_ids = len(kjt.keys()), values.numel()
    stride = lengths.numel() // max(num_keys, 1)
    device = values.device
    if list(key_index) == list(range(num_keys)):
        group_lengths, source = lengths, None
    else:  # bag (k, b) of the group is bag (key_index[k], b) of the KJT
        picked = torch.tensor(list(key_index), dtype=torch.int64, device=device)
        keys = key_of_bag(len(key_index), stride, device)
        bags = (
            picked[keys] * stride
            + torch.arange(len(key_index) * stride, device=device)
            - keys * stride
        )
        group_lengths = lengths[bags]  # [K * B]
        source = _bag_starts(lengths)[bags]  # [K * B] each bag's first id in values
    offsets = _bag_starts(group_lengths)  # [K * B + 1]
    bag = None
    if source is not None or any(row_bases) or any(mean_per_key):
        position = torch.arange(num_ids, device=device)
        bag = torch.searchsorted(offsets, position, right=True) - 1
        bag = bag.clamp(0, max(group_lengths.numel() - 1, 0))  # [N] the bag of each position
    ids = values.long()
    valid = None
    if source is not None:
        assert bag is not None
        valid = position < offsets[-1]
        ids = ids[torch.where(valid, source[bag] + position - offsets[bag], 0)]
        if weights is not None:
            weights = weights[torch.where(valid, source[bag] + position - offsets[bag], 0)]
    if any(row_bases):
        assert bag is not None
        base = torch.tensor(list(row_bases), dtype=torch.int64, device=device)
        ids = ids + base[key_of_bag(len(row_bases), stride, device)][bag]
    if any(mean_per_key):
        assert bag is not None
        mean = torch.tensor(list(mean_per_key), dtype=torch.bool, device=device)
        scale = 1.0 / group_lengths.clamp(min=1).float()
        scale = torch.where(mean[key_of_bag(len(mean_per_key), stride, device)], scale, 1.0)[bag]
        weights = scale if weights is None else weights * scale
    if valid is not None:  # the positions past the group's ids: row 0, weight 0, last bag
        ids = torch.where(valid, ids, 0)
        weights = torch.where(valid, 1.0 if weights is None else weights, 0.0)
        offsets = torch.cat([offsets[:-1], offsets.new_full((1,), num_ids)])
    return ids, offsets, weights


def traced_pooled(
    kjt: KeyedJaggedTensor,
    plan: InputPlan,
    weights_per_group: Sequence[torch.Tensor],
    weighted: bool,
    feature_names: Sequence[str],
) -> torch.Tensor:
    """An `EmbeddingBagCollection`'s pooled output ``[B, sum(dims)]`` in ``feature_names``
    order, from aten operators only (see [Note: exported lookups])."""
    index_of = {key: i for i, key in enumerate(kjt.keys())}
    stride = kjt.lengths().numel() // max(len(kjt.keys()), 1)
    pooled: dict[str, torch.Tensor] = {}
    for weight, spec in zip(weights_per_group, plan.groups):
        keys = plan.keys[spec.first_key : spec.first_key + spec.num_keys]
        ids, offsets, psw = traced_group_input(
            kjt, [index_of[k] for k in keys], spec.row_base_per_key, spec.mean_per_key,
            use_weights=weighted or any(spec.mean_per_key),  # as the eager forward
        )  # fmt: skip
        out = F.embedding_bag(ids, weight, offsets, mode="sum", include_last_offset=True,
                              per_sample_weights=None if psw is None else psw.to(weight.dtype))  # fmt: skip
        for position, key in enumerate(keys):  # out: [K * B, D] key-major
            pooled[key] = out[position * stride : (position + 1) * stride]
    return torch.cat([pooled[f] for f in feature_names], dim=1)


def ids_per_key_unbacked(kjt: KeyedJaggedTensor) -> tuple[list, list]:
    """``(starts, counts)``: where each key's ids start in ``values`` and how many there are,
    as unbacked sizes when traced (one host read eager), with the facts a cut at them needs
    stated by `torch._check` (counts >= 0, summing to ``len(values)``)."""
    values, lengths = kjt.values(), kjt.lengths()
    num_keys = len(kjt.keys())
    stride = lengths.numel() // max(num_keys, 1)
    bag_key = key_of_bag(num_keys, stride, values.device)
    counts = lengths.new_zeros(num_keys).index_add_(0, bag_key, lengths).tolist()
    starts = [0]
    for count in counts:
        torch._check(count >= 0)
        starts.append(starts[-1] + count)
    torch._check(starts[-1] == values.numel())
    return starts, counts


def traced_sequence(
    kjt: KeyedJaggedTensor,
    plan: InputPlan,
    weights_per_group: Sequence[torch.Tensor],
    feature_names: Sequence[str],
) -> dict[str, JaggedTensor]:
    """An `EmbeddingCollection`'s output from aten operators only: each group's rows looked up
    in the KJT's order, cut per key at unbacked sizes (see [Note: exported lookups])."""
    values, lengths = kjt.values(), kjt.lengths()
    num_keys, num_ids = len(kjt.keys()), values.numel()
    stride = lengths.numel() // max(num_keys, 1)
    starts, counts = ids_per_key_unbacked(kjt)
    index_of = {key: i for i, key in enumerate(kjt.keys())}
    out: dict[str, JaggedTensor] = {}
    for weight, spec in zip(weights_per_group, plan.groups):
        keys = plan.keys[spec.first_key : spec.first_key + spec.num_keys]
        base = [0] * num_keys
        for key, row_base in zip(keys, spec.row_base_per_key):
            base[index_of[key]] = row_base
        ids = values.long()
        if any(base):
            bases = torch.tensor(base, dtype=torch.int64, device=values.device)
            per_bag = bases[key_of_bag(num_keys, stride, values.device)]
            ids = ids + torch.repeat_interleave(per_bag, lengths, output_size=num_ids)
        rows = F.embedding(ids.clamp(0, weight.shape[0] - 1), weight)  # [N, D]
        for key in keys:
            k = index_of[key]
            piece = rows.narrow(0, starts[k], counts[k])
            out[key] = JaggedTensor(piece, lengths=lengths[k * stride : (k + 1) * stride])
    return {f: out[f] for f in feature_names}


def assert_ids_in_range(kjt: KeyedJaggedTensor, plan: InputPlan) -> None:
    """Every id of each key the module reads is in ``[0, num_embeddings)``, and the lengths
    cover ``values``: `torch._assert_async` in the graph (see [Note: exported lookups])."""
    values, lengths = kjt.values(), kjt.lengths()
    num_keys = len(kjt.keys())
    stride = lengths.numel() // max(num_keys, 1)
    torch._assert_async(
        lengths.sum() == values.numel(),
        "KeyedJaggedTensor: the lengths do not sum to the number of values; each id belongs to "
        "exactly one bag, so sum(lengths) must equal len(values)",
    )
    bag_key = key_of_bag(num_keys, stride, values.device)
    key_of_id = torch.repeat_interleave(bag_key, lengths, output_size=values.numel())
    index_of = {key: i for i, key in enumerate(kjt.keys())}
    for position, key in enumerate(plan.keys):
        limit = plan.num_embeddings_per_key[position]
        mine = key_of_id == index_of[key]
        bad = mine & ((values < 0) | (values >= limit))
        torch._assert_async(
            ~bad.any(),
            f"feature '{key}' (table '{plan.table_per_key[position]}'): an id is out of range: "
            f"ids must satisfy 0 <= id < num_embeddings = {limit}. Map ids into range (e.g. id "
            "% num_embeddings), or pass validate_ids=False to skip this check",
        )
