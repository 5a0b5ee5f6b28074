"""Feature processors: per-id weights computed from the input, TorchRec's ``feature_processor_``.

A position-weighted feature weighs each id by a learnt weight of its position in its bag: in
a bag ``[a, b, c]`` (e.g. the last items a user clicked, most recent first) the pooled vector is
``w[0] * E[a] + w[1] * E[b] + w[2] * E[c]``, ``w`` a parameter of ``max_feature_length`` entries
starting at 1.0. Bags longer than ``max_feature_length`` are refused (truncate them first).

Example, one feature, batch of 2::

    bags     [[7, 8, 9], [4]]      lengths [3, 1]
    position  [0, 1, 2], [0]
    weights  [w[0], w[1], w[2], w[0]]

`PositionWeightedModule` does this for one `JaggedTensor`; `PositionWeightedModuleCollection` for
the keys of a `KeyedJaggedTensor` it has a length for (the other keys get weight 1.0). The
processed features go into a weighted `EmbeddingBagCollection`, see
`FeatureProcessedEmbeddingBagCollection`.

[Note: position weights in a graph]
Under `torch.compile` and `torch.export` the per-key loop above would cut ``values`` at
``length_per_key`` (a host sync, so a graph break). There the weights of every key come from one
gather instead: the keys' position weights (a ``[1]`` of ones for a key without) concatenated,
and each id reads entry ``base[its key] + its position`` (position 0 for a key without
weights), its key found by ``repeat_interleave`` over the lengths, whose total ``N`` is known
from ``values``. The bag-length check becomes `torch._assert_async` per key (its message names
the feature and the limit, not the bag's length, which only a host sync could read).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from shardkit.modules._traced import key_of_bag
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = [
    "FeatureProcessor",
    "FeatureProcessorsCollection",
    "PositionWeightedModule",
    "PositionWeightedModuleCollection",
    "get_stride_per_key_per_rank",
    "get_weights_list",
]


class FeatureProcessor(nn.Module):
    """Base of the processors of one feature: a `JaggedTensor` in, the same with weights out."""

    @abc.abstractmethod
    def forward(self, features: JaggedTensor) -> JaggedTensor:
        """``features`` -> the same values and lengths, with ``weights`` ``[N]`` set."""


class FeatureProcessorsCollection(nn.Module):
    """Base of the processors of many features: a `KeyedJaggedTensor` in and out."""

    @abc.abstractmethod
    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` -> the same keys, values and lengths, with ``weights`` ``[N]`` set."""


def positions(offsets: torch.Tensor, num_values: int) -> torch.Tensor:
    """``[N]`` the position of each id in its bag, from the bags' ``offsets`` ``[B + 1]``."""
    offsets = offsets.long()
    starts = torch.repeat_interleave(offsets[:-1], offsets.diff(), output_size=num_values)
    return torch.arange(num_values, device=offsets.device) - starts


def _position_weights(
    weight: torch.Tensor, position: torch.Tensor, lengths: torch.Tensor, what: str
) -> torch.Tensor:
    """``weight[position]``, refusing bags longer than ``weight`` (``[L]``)."""
    if lengths.numel() and int(lengths.max()) > weight.numel():
        raise ValueError(
            f"{what}: a bag has {int(lengths.max())} ids but max_feature_length is "
            f"{weight.numel()}; truncate bags to {weight.numel()} ids or raise max_feature_length"
        )
    return weight.gather(0, position)


class PositionWeightedModule(FeatureProcessor):
    """Weighs each id of one feature by the learnt weight of its position in its bag.

    Args:
        max_feature_length: the longest bag (the number of position weights).
        device: where the weights live.

    ``position_weight`` ``[max_feature_length]`` (TorchRec's ``state_dict`` name) starts at 1.0.
    """

    def __init__(self, max_feature_length: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        if max_feature_length < 1:
            raise ValueError(f"max_feature_length must be >= 1, got {max_feature_length}")
        self.position_weight = nn.Parameter(torch.empty(max_feature_length, device=device))
        self._pre_processed = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.position_weight.fill_(1.0)

    def forward(self, features: JaggedTensor) -> JaggedTensor:
        """``features``: ``[N]`` ids in bags. Returns them with ``weights`` ``[N]``."""
        if self._pre_processed:
            position = features.weights().to(torch.int64)
        else:
            position = positions(features.offsets(), features.values().numel())
        weights = _position_weights(
            self.position_weight, position, features.lengths(), "PositionWeightedModule"
        )
        return JaggedTensor(
            values=features.values(),
            lengths=features.lengths(),
            offsets=features.offsets(),
            weights=weights,
        )

    def pre_process_input(self, features: JaggedTensor) -> None:
        """Write each id's position into ``features.weights()`` (in place), which `forward` then
        reads instead of computing it (TorchRec's inference path)."""
        self._pre_processed = True
        features.weights().copy_(positions(features.offsets(), features.values().numel()))


class PositionWeightedModuleCollection(FeatureProcessorsCollection):
    """Position weights for several features of a `KeyedJaggedTensor`.

    Args:
        max_feature_lengths: ``{feature: longest bag}``; other features get weight 1.0.
        device: where the weights live.

    ``position_weights.<feature>`` ``[max_feature_length]`` (TorchRec's ``state_dict`` names)
    start at 1.0.
    """

    def __init__(
        self, max_feature_lengths: Mapping[str, int], device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        for key, length in max_feature_lengths.items():
            if length < 1 or "." in key:
                raise ValueError(
                    f"position weights of feature {key!r}: max_feature_length must be >= 1 (got "
                    f"{length}) and the feature name free of '.' (a state_dict key separator)"
                )
        self.max_feature_lengths = dict(max_feature_lengths)
        self.position_weights = nn.ParameterDict(
            {
                key: nn.Parameter(torch.empty(length, device=device))
                for key, length in self.max_feature_lengths.items()
            }
        )
        self._pre_processed = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for weight in self.position_weights.values():
                weight.fill_(1.0)

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` -> the same with ``weights`` ``[N]``: position weights for the features
        with a max length, 1.0 for the others (any input weights are replaced)."""
        if self._pre_processed:
            position = features.weights().to(torch.int64)
        else:
            position = positions(features.offsets(), features.values().numel())
        if torch.compiler.is_compiling():  # see [Note: position weights in a graph]
            by_key = {k: self.position_weights[k] for k in self.max_feature_lengths}
            return _with_weights(features, traced_position_weights(features, position, by_key))
        lengths_per_key = features.lengths().split(_bags_per_key(features))
        pieces = []
        for key, seq, lengths in zip(
            features.keys(), position.split(features.length_per_key()), lengths_per_key
        ):
            if key in self.position_weights:
                what = f"position weights of feature '{key}'"
                pieces.append(_position_weights(self.position_weights[key], seq, lengths, what))
            else:
                pieces.append(torch.ones(seq.numel(), device=seq.device))
        weights = torch.cat(pieces) if pieces else features.weights_or_none()
        return _with_weights(features, weights)

    def pre_process_input(self, features: KeyedJaggedTensor) -> None:
        """Write each id's position into ``features.weights()`` (in place); see
        `PositionWeightedModule.pre_process_input`."""
        self._pre_processed = True
        features.weights().copy_(positions(features.offsets(), features.values().numel()))

    def copy(self, device: torch.device | str) -> nn.Module:
        """TorchRec's ``CopyMixIn``: this module on ``device``."""
        return self.to(device)


def traced_position_weights(
    features: KeyedJaggedTensor, position: torch.Tensor, weights_by_key: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """``[N]`` each id's weight, ``weights_by_key[key][position]`` (1.0 for keys without
    weights), with no host sync: see [Note: position weights in a graph].

    Args:
        features: one batch size for all keys.
        position: ``[N]`` each id's position in its bag.
        weights_by_key: ``{key: [max_feature_length]}`` position weights.
    """
    values, lengths = features.values(), features.lengths()
    keys = features.keys()
    stride = lengths.numel() // max(len(keys), 1)
    device = values.device
    pieces, bases, weighted = [], [], []
    at = 0
    for k, key in enumerate(keys):
        found = weights_by_key.get(key)
        if found is None:
            weight = torch.ones(1, device=device)
        else:
            weight = found
            longest = weight.numel()
            torch._assert_async(
                (lengths[k * stride : (k + 1) * stride] <= longest).all(),
                f"position weights of feature '{key}': a bag has more ids than "
                f"max_feature_length ({longest}); truncate bags to {longest} ids or raise "
                "max_feature_length",
            )
        pieces.append(weight)
        bases.append(at)
        weighted.append(key in weights_by_key)
        at += weight.numel()
    if not pieces:
        return torch.ones(values.numel(), device=device)
    bag_key = key_of_bag(len(keys), stride, device)
    key_of_id = torch.repeat_interleave(bag_key, lengths, output_size=values.numel())
    base = torch.tensor(bases, dtype=torch.int64, device=device)[key_of_id]
    use = torch.tensor(weighted, dtype=torch.bool, device=device)[key_of_id]
    return torch.cat(pieces)[base + torch.where(use, position, 0)]


def _bags_per_key(features: KeyedJaggedTensor) -> list[int]:
    return list(features.stride_per_key())


def _with_weights(features: KeyedJaggedTensor, weights: torch.Tensor | None) -> KeyedJaggedTensor:
    variable = features.variable_stride_per_key()
    fields: dict[str, Any] = {
        "stride_per_key_per_rank": features.stride_per_key_per_rank() if variable else None,
        "stride": None if variable else features.stride(),
    }
    return KeyedJaggedTensor(
        keys=features.keys(),
        values=features.values(),
        weights=weights,
        lengths=features.lengths(),
        offsets=features.offsets(),
        length_per_key=features.length_per_key_or_none(),  # known ones only: no sync
        offset_per_key=features.offset_per_key_or_none(),
        inverse_indices=features.inverse_indices_or_none(),
        **fields,
    )


def get_weights_list(
    cat_seq: torch.Tensor,
    features: KeyedJaggedTensor,
    position_weights: Mapping[str, torch.Tensor],
) -> torch.Tensor | None:
    """TorchRec's helper: ``[N]`` each id's weight, ``position_weights[key][position]`` for the
    keys with weights and 1.0 for the others, from ``cat_seq`` ``[N]`` the ids' positions."""
    weights = []
    for key, seq in zip(features.keys(), cat_seq.split(features.length_per_key())):
        if key in position_weights:
            weights.append(position_weights[key].gather(0, seq.long()))
        else:
            weights.append(torch.ones(seq.numel(), device=features.values().device))
    return torch.cat(weights) if weights else features.weights_or_none()


def get_stride_per_key_per_rank(kjt: KeyedJaggedTensor) -> list[list[int]] | None:
    """TorchRec's helper: the KJT's batch size per key and rank when it varies, else None."""
    if not kjt.variable_stride_per_key():
        return None
    return kjt.stride_per_key_per_rank()
