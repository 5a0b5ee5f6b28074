"""Metrics that are ratios of weighted sums: log loss, normalised entropy, accuracy.

Each keeps a few float64 sums; ``compute()`` all-reduces them once, so the value over N ranks is
the value of one process that saw every rank's examples (up to float64 rounding).
"""

from __future__ import annotations

import math

import torch

from shardkit.metrics._inputs import Inputs, prepare
from shardkit.metrics._ranks import Group, sum_over_ranks

__all__ = ["Accuracy", "LogLoss", "NormalizedEntropy", "SumMetric", "binary_entropy", "safe_ratio"]


class SumMetric:
    """Base: ``update`` adds per-example statistics to float64 sums, ``compute`` combines the
    ranks' sums. Subclasses name their sums and turn them into a value.

    Args:
        from_logits: ``update`` gets logits (default) or probabilities.
        group: the ranks to combine (default: the world, when a process group is up).
    """

    num_sums = 0

    def __init__(self, *, from_logits: bool = True, group: Group = None) -> None:
        self.from_logits = from_logits
        self.group = group
        self._sums = torch.zeros(self.num_sums, dtype=torch.float64)

    def update(
        self,
        predictions: torch.Tensor,
        labels: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> None:
        """Add a batch: ``predictions`` ``[B]`` or ``[B, 1]`` (logits or probabilities, as
        built), ``labels`` ``[B]`` in {0, 1}, ``weights`` ``[B]`` (default 1; 0 ignores an
        example, e.g. padding)."""
        inputs = prepare(type(self).__name__, predictions, labels, weights,
                         from_logits=self.from_logits)  # fmt: skip
        with torch.no_grad():
            stats = self._statistics(inputs)  # [num_sums] on the inputs' device
        self._sums = self._sums.to(stats.device) + stats

    def compute(self) -> float:
        """The value over every update on every rank of the group (a collective: every rank must
        call it). ``nan`` when it is undefined (no examples; see each metric)."""
        return self._value(sum_over_ranks(self._sums, self.group).tolist())

    def reset(self) -> None:
        """Forget every update (on this rank)."""
        self._sums = torch.zeros(self.num_sums, dtype=torch.float64)

    def _statistics(self, inputs: Inputs) -> torch.Tensor:
        raise NotImplementedError

    def _value(self, sums: list[float]) -> float:
        raise NotImplementedError


def safe_ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, or ``nan`` when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else math.nan


def binary_entropy(p: float) -> float:
    """``-(p log p + (1 - p) log(1 - p))`` in nats; 0 at p = 0 or 1."""
    return -sum(q * math.log(q) for q in (p, 1.0 - p) if q > 0)


class LogLoss(SumMetric):
    """Weighted mean binary cross-entropy (nats): ``sum(w * ce) / sum(w)``."""

    num_sums = 2

    def _statistics(self, inputs: Inputs) -> torch.Tensor:
        w = inputs.weights
        return torch.stack([(w * inputs.cross_entropy()).sum(), w.sum()])

    def _value(self, sums: list[float]) -> float:
        return safe_ratio(sums[0], sums[1])


class NormalizedEntropy(SumMetric):
    """Log loss divided by the entropy of the (weighted) base rate ``p = sum(w y) / sum(w)``:
    below 1 means better than always predicting ``p``. ``nan`` when ``p`` is 0 or 1."""

    num_sums = 3

    def _statistics(self, inputs: Inputs) -> torch.Tensor:
        w = inputs.weights
        return torch.stack([(w * inputs.cross_entropy()).sum(), w.sum(), (w * inputs.labels).sum()])

    def _value(self, sums: list[float]) -> float:
        log_loss = safe_ratio(sums[0], sums[1])
        entropy = binary_entropy(safe_ratio(sums[2], sums[1])) if sums[1] > 0 else 0.0
        return safe_ratio(log_loss, entropy)


class Accuracy(SumMetric):
    """Weighted share of examples whose probability is on the label's side of ``threshold``.

    Args:
        threshold: probability above which the prediction is 1 (default 0.5).
        from_logits, group: as `SumMetric`.
    """

    num_sums = 2

    def __init__(self, *, threshold: float = 0.5, from_logits: bool = True, group: Group = None):
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"Accuracy: threshold must be in (0, 1), got {threshold}")
        super().__init__(from_logits=from_logits, group=group)
        self.threshold = threshold

    def _statistics(self, inputs: Inputs) -> torch.Tensor:
        predicted = inputs.probabilities() > self.threshold
        correct = (predicted == (inputs.labels > 0.5)).to(torch.float64)
        w = inputs.weights
        return torch.stack([(w * correct).sum(), w.sum()])

    def _value(self, sums: list[float]) -> float:
        return safe_ratio(sums[0], sums[1])
