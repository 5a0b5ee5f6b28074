"""Synthetic Criteo-like data at Criteo-Terabyte's table sizes, for scale tests.

[Note: synthetic examples]
Example ``i`` is a pure function of ``(seed, i)`` (see [Note: counter-based randomness]): any
batch of any indices is generated at once, vectorised, without state, and the same example is
the same on every rank, world size and torch release. For example ``i`` and feature ``f``:

- the bag length is uniform in ``[min_ids_per_bag, max_ids_per_bag]``;
- each id is drawn from a power law over the table's ``n`` rows: the ``k``-th most frequent row
  has probability ``∝ ∫_{k+1}^{k+2} x^(-s) dx ≈ (k + 1.5)^(-s)`` (a bounded Pareto, sampled by
  inverting its CDF; ``s = zipf_exponent``, 0 is uniform), and frequency rank ``k`` is row
  ``(a_f k + c_f) mod n`` with ``a_f`` coprime to ``n``, so hot rows are spread over the table
  as hashed real ids are, not packed at its start;
- the ``num_dense`` dense features are ``log(1 + count)`` of exponentially distributed counts
  (mean 10), like DLRM's transformed Criteo counts;
- the label is 1 with probability ``sigmoid(bias + sum of effect(f, id) over the ids of the
  first num_signal_features features (averaged per bag) + dense_effect * dense_0)``, where
  each row's effect is a fixed uniform in ``±signal_strength * sqrt(3)`` (unit variance at
  strength 1): a model that learns the frequent rows' embeddings learns something.

The seed is the world: it fixes every row's effect and which rows are hot. Held-out data must
come from the same world, with other example numbers (``first_example``); a data set with
another seed has other effects, and a model trained on one predicts nothing on the other
(validation AUC 0.49 in ``shardkit train --data synthetic`` before it used ``first_example``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from shardkit.data._batch import Batch
from shardkit.data._hash import mix_int, uniform
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["TERABYTE_NUM_EMBEDDINGS", "SyntheticConfig", "SyntheticDataset"]

# Rows per table of the public DLRM benchmark config for Criteo Terabyte (MLPerf).
TERABYTE_NUM_EMBEDDINGS = (
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10, 2209,
    11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35,
)  # fmt: skip

# Streams of `uniform(seed, stream, ...)`: one per random quantity, so they never collide.
_LENGTH, _ID, _DENSE, _EFFECT, _LABEL, _SPREAD = range(6)


@dataclass(frozen=True)
class SyntheticConfig:
    """What to generate (see [Note: synthetic examples]).

    Args:
        num_examples: the data set's length (examples ``0 .. num_examples - 1``).
        num_embeddings: caps every table at this many rows (e.g. ``--num-embeddings``), or None.
        table_sizes: the tables' rows before the cap (default: Criteo Terabyte's 26).
        zipf_exponent: ``s`` of the power law, >= 0 (0: uniform ids).
        min_ids_per_bag, max_ids_per_bag: bag lengths, uniform in that range (0 allowed).
        num_dense: dense features per example.
        num_signal_features: how many features (the first ones) move the label.
        signal_strength: the standard deviation of a row's effect on the logit.
        dense_effect: the weight of dense feature 0 in the logit.
        bias: the logit's constant (-1.2 gives about 25% positives).
        seed: everything follows from it: the effects of the rows, which rows are hot, and
            every example.
        first_example: the data set is examples ``first_example ..
            first_example + num_examples - 1`` of the seed's world. A held-out split of the
            same world (same effects, same hot rows, other examples) is
            ``dataclasses.replace(train, num_examples=n, first_example=train.num_examples)``;
            another seed is another world, whose labels a model trained here cannot predict.
    """

    num_examples: int
    num_embeddings: int | None = None
    table_sizes: tuple[int, ...] = TERABYTE_NUM_EMBEDDINGS
    zipf_exponent: float = 1.05
    min_ids_per_bag: int = 1
    max_ids_per_bag: int = 1
    num_dense: int = 13
    num_signal_features: int = 3
    signal_strength: float = 1.0
    dense_effect: float = 0.3
    bias: float = -1.2
    seed: int = 0
    first_example: int = 0
    keys: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_sizes", tuple(self.table_sizes))
        _check_config(self)
        object.__setattr__(self, "keys", tuple(f"cat_{i}" for i in range(self.num_features)))

    @property
    def num_features(self) -> int:
        return len(self.table_sizes)

    @property
    def num_embeddings_per_feature(self) -> tuple[int, ...]:
        """The rows of each table after the cap: what the model's configs need."""
        cap = self.num_embeddings
        return tuple(n if cap is None else min(n, cap) for n in self.table_sizes)


def _check_config(config: SyntheticConfig) -> None:
    def fail(rule: str, value: object) -> None:
        raise ValueError(f"SyntheticConfig: {rule}, got {value!r}")

    if config.num_examples < 1:
        fail("num_examples must be >= 1", config.num_examples)
    sizes = config.table_sizes
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        fail("table_sizes must be a non-empty list of ints >= 1", sizes)
    if config.num_embeddings is not None and config.num_embeddings < 1:
        fail("num_embeddings (the cap) must be >= 1 or None", config.num_embeddings)
    if not config.zipf_exponent >= 0:
        fail("zipf_exponent must be >= 0 (0: uniform)", config.zipf_exponent)
    if not 0 <= config.min_ids_per_bag <= config.max_ids_per_bag:
        fail("need 0 <= min_ids_per_bag <= max_ids_per_bag",
             (config.min_ids_per_bag, config.max_ids_per_bag))  # fmt: skip
    if config.num_dense < 1:
        fail("num_dense must be >= 1", config.num_dense)
    if not 0 <= config.num_signal_features <= len(sizes):
        fail(f"num_signal_features must be in [0, {len(sizes)}] (the number of features)",
             config.num_signal_features)  # fmt: skip
    if config.seed < 0:
        fail("seed must be >= 0", config.seed)
    if config.first_example < 0:
        fail("first_example must be >= 0", config.first_example)


class SyntheticDataset:
    """``config.num_examples`` generated examples, a `MapDataset` for `GlobalBatchIterator`
    (use ``shuffle=False``: the examples are independent already, and a shuffle of a huge
    ``num_examples`` would cost a sort of that many keys)::

        config = SyntheticConfig(num_examples=10**8, num_embeddings=10**6)
        it = GlobalBatchIterator(SyntheticDataset(config), batch_size=4096, shuffle=False)
        tables = dict(zip(config.keys, config.num_embeddings_per_feature))
    """

    def __init__(self, config: SyntheticConfig) -> None:
        self.config = config
        sizes = config.num_embeddings_per_feature
        self._sizes = torch.tensor(sizes, dtype=torch.int64)  # [F]
        self._spread = torch.tensor([_coprime_multiplier(config.seed, f, n)
                                     for f, n in enumerate(sizes)])  # fmt: skip
        self._offset = torch.tensor([mix_int(config.seed, _SPREAD, f) % n
                                     for f, n in enumerate(sizes)])  # fmt: skip

    def __len__(self) -> int:
        return self.config.num_examples

    def batch(self, indices: torch.Tensor) -> Batch:
        """Examples ``indices`` (``[B]`` int64, each in ``[0, num_examples)``)."""
        indices = indices.to(torch.int64)
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= len(self)):
            raise IndexError(
                f"SyntheticDataset: indices must be in [0, {len(self)}), got "
                f"[{int(indices.min())}, {int(indices.max())}]"
            )
        indices = indices + self.config.first_example  # the examples' numbers in the world
        lengths = self._lengths(indices)  # [F * B], key-major
        bag, slot = _bags(lengths)  # per id: its bag (f * B + b) and position in the bag
        num_examples = indices.numel()
        feature, example = bag // max(num_examples, 1), indices[bag % max(num_examples, 1)]
        ids = self._ids(feature, example, slot)  # [N]
        dense = self._dense(indices)  # [B, D]
        labels = self._labels(indices, dense, ids, bag, feature, lengths)
        sparse = KeyedJaggedTensor(keys=list(self.config.keys), values=ids,
                                   lengths=lengths.to(torch.int32), stride=num_examples)  # fmt: skip
        return Batch(dense_features=dense, sparse_features=sparse, labels=labels)

    def _lengths(self, indices: torch.Tensor) -> torch.Tensor:
        low, high = self.config.min_ids_per_bag, self.config.max_ids_per_bag
        num_features = self.config.num_features
        if low == high:
            return torch.full((num_features * indices.numel(),), low, dtype=torch.int64)
        feature = torch.arange(num_features).unsqueeze(1)  # [F, 1]
        u = uniform(self.config.seed, _LENGTH, indices.unsqueeze(0), feature)  # [F, B]
        return (low + (u * (high - low + 1)).long()).reshape(-1)

    def _ids(
        self, feature: torch.Tensor, example: torch.Tensor, slot: torch.Tensor
    ) -> torch.Tensor:
        u = uniform(self.config.seed, _ID, example, feature, slot)  # [N]
        n = self._sizes[feature]
        rank = _power_law_rank(u, n, self.config.zipf_exponent)
        return (self._spread[feature] * rank + self._offset[feature]) % n

    def _dense(self, indices: torch.Tensor) -> torch.Tensor:
        column = torch.arange(self.config.num_dense).unsqueeze(0)  # [1, D]
        u = uniform(self.config.seed, _DENSE, indices.unsqueeze(1), column)  # [B, D]
        counts = torch.floor(-torch.log1p(-u) * 10.0)  # exponential, mean 10
        return torch.log1p(counts).to(torch.float32)

    def _labels(
        self,
        indices: torch.Tensor,
        dense: torch.Tensor,
        ids: torch.Tensor,
        bag: torch.Tensor,
        feature: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        config = self.config
        num_examples = indices.numel()
        signal = feature < config.num_signal_features  # [N]
        effect = (2.0 * uniform(config.seed, _EFFECT, feature, ids) - 1.0) * math.sqrt(3.0)
        effect = torch.where(signal, effect * config.signal_strength, torch.zeros_like(effect))
        per_bag = torch.zeros(lengths.numel(), dtype=torch.float64).index_add_(0, bag, effect)
        per_bag = per_bag / lengths.clamp(min=1)  # mean over each bag's ids
        logit = per_bag.view(config.num_features, num_examples).sum(0)  # [B]
        logit = logit + config.bias + config.dense_effect * (dense[:, 0].double() - 2.4)
        u = uniform(config.seed, _LABEL, indices)
        return (u < torch.sigmoid(logit)).to(torch.float32)


def _bags(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For every id of the flat values: its bag, and its position in that bag."""
    num_bags = lengths.numel()
    bag = torch.repeat_interleave(torch.arange(num_bags), lengths)
    starts = torch.cumsum(lengths, 0) - lengths  # [num_bags]
    slot = torch.arange(bag.numel()) - starts[bag]
    return bag, slot


def _power_law_rank(u: torch.Tensor, n: torch.Tensor, s: float) -> torch.Tensor:
    """Invert the CDF of density ``∝ x^(-s)`` on ``[1, n + 1)``; the rank is ``floor(x) - 1``."""
    top = (n + 1).to(torch.float64)
    if abs(s - 1.0) < 1e-12:
        x = torch.exp(u * torch.log(top))
    else:
        a = 1.0 - s
        x = (1.0 + u * (top**a - 1.0)) ** (1.0 / a)
    return torch.minimum(x.floor().long() - 1, n - 1).clamp(min=0)


def _coprime_multiplier(seed: int, feature: int, n: int) -> int:
    """A multiplier coprime to ``n`` (so ``k -> a k + c mod n`` permutes the rows)."""
    a = mix_int(seed, _SPREAD, feature, 1) % (1 << 31) | 1
    while math.gcd(a, n) != 1:
        a += 2
    return a % n if n > 1 else 0
