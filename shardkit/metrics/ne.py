"""Normalized entropy (and log loss) with TorchRec's formulas (``torchrec.metrics.ne``).

With weights ``w``, labels ``y`` and predicted probabilities ``p`` clamped to ``[eta, 1 - eta]``
(``eta = 1e-12``), in bits::

    cross_entropy_sum = sum -w (y log2 p + (1 - y) log2 (1 - p))
    ne = cross_entropy_sum / (-pos log2 m - neg log2 (1 - m)),  pos = sum w y, neg = sum w (1 - y),
         m = pos / max(sum w, eta) clamped to [eta, 1 - eta]
    logloss = cross_entropy_sum / max(pos + neg, eta)

(NE is the same in bits or nats; TorchRec's log loss is in bits.)
"""

from __future__ import annotations

from typing import Any

import torch

from shardkit.metrics._computation import (
    MetricComputationReport,
    RecMetricComputation,
    RecMetricException,
)
from shardkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from shardkit.metrics.rec_metric import RecMetric

__all__ = [
    "NEMetric",
    "NEMetricComputation",
    "compute_cross_entropy",
    "compute_logloss",
    "compute_ne",
    "get_ne_states",
]

_STATES = ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels")


def compute_cross_entropy(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                          eta: float) -> torch.Tensor:  # fmt: skip
    """Per-example weighted binary cross-entropy in bits (float64)."""
    p = predictions.double().clamp(min=eta, max=1 - eta)
    return -weights * labels * torch.log2(p) - weights * (1.0 - labels) * torch.log2(1.0 - p)


def compute_ne(ce_sum: torch.Tensor, weighted_num_samples: torch.Tensor, pos_labels: torch.Tensor,
               neg_labels: torch.Tensor, eta: float,
               allow_missing_label_with_zero_weight: bool = False) -> torch.Tensor:  # fmt: skip
    """NE from the summed states (see the module's docstring); ``eta`` where a task had no
    weight and ``allow_missing_label_with_zero_weight``."""
    mean = (pos_labels / weighted_num_samples.double().clamp(min=eta)).clamp(min=eta, max=1 - eta)
    entropy = -pos_labels * torch.log2(mean) - neg_labels * torch.log2(1.0 - mean)
    ne = ce_sum / entropy
    if allow_missing_label_with_zero_weight and not weighted_num_samples.all():
        return torch.where(weighted_num_samples > 0, ne, eta)
    return ne


def compute_logloss(ce_sum: torch.Tensor, pos_labels: torch.Tensor, neg_labels: torch.Tensor,
                    eta: float) -> torch.Tensor:  # fmt: skip
    """Mean cross-entropy in bits."""
    return ce_sum / (pos_labels + neg_labels).clamp(min=eta)


def get_ne_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                  eta: float) -> dict[str, torch.Tensor]:  # fmt: skip
    """One batch's sums ``[n_tasks]`` from ``[n_tasks, B]`` inputs."""
    return {
        "cross_entropy_sum": compute_cross_entropy(labels, predictions, weights, eta).sum(-1),
        "weighted_num_samples": weights.sum(-1),
        "pos_labels": (weights * labels).sum(-1),
        "neg_labels": (weights * (1.0 - labels)).sum(-1),
    }


class NEMetricComputation(RecMetricComputation):
    """NE's states and values (``include_logloss=True`` adds log loss)."""

    def __init__(self, *args: Any, include_logloss: bool = False,
                 allow_missing_label_with_zero_weight: bool = False, **kwargs: Any) -> None:  # fmt: skip
        kwargs["allow_missing_label_with_zero_weight"] = allow_missing_label_with_zero_weight
        super().__init__(*args, **kwargs)
        self._include_logloss = include_logloss
        self.eta = 1e-12
        for name in _STATES:
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double),
                            add_window_state=True, persistent=True)  # fmt: skip

    def update(self, *, predictions: torch.Tensor | None, labels: torch.Tensor,
               weights: torch.Tensor | None, **kwargs: Any) -> None:  # fmt: skip
        if predictions is None or weights is None:
            raise RecMetricException("NEMetricComputation.update needs predictions and weights")
        for name, value in get_ne_states(labels, predictions, weights, self.eta).items():
            getattr(self, name).add_(value)
            self._aggregate_window_state(name, value, predictions.shape[-1])

    def _values(self, window: bool) -> list[torch.Tensor]:
        return [self.get_window_state(n) if window else getattr(self, n) for n in _STATES]

    def _compute(self) -> list[MetricComputationReport]:
        reports = []
        for prefix, window in ((MetricPrefix.LIFETIME, False), (MetricPrefix.WINDOW, True)):
            ce, num, pos, neg = self._values(window)
            ne = compute_ne(ce, num, pos, neg, self.eta, self._allow_missing_label_with_zero_weight)
            reports.append(MetricComputationReport(MetricName.NE, prefix, ne))
        if self._include_logloss:
            for prefix, window in ((MetricPrefix.LIFETIME, False), (MetricPrefix.WINDOW, True)):
                ce, _, pos, neg = self._values(window)
                reports.append(MetricComputationReport(
                    MetricName.LOG_LOSS, prefix, compute_logloss(ce, pos, neg, self.eta)))  # fmt: skip
        return reports


class NEMetric(RecMetric):
    """Normalized entropy per task: ``"ne-<task>|lifetime_ne"`` and ``"...|window_ne"``."""

    _namespace = MetricNamespace.NE
    _computation_class = NEMetricComputation
