"""Accuracy: the weight share of examples with ``(p >= threshold) == y`` (0 without weight;
``torchrec.metrics.accuracy``)."""

from __future__ import annotations

from typing import Any

import torch

from shardkit.metrics._ratio import RatioComputation
from shardkit.metrics.metrics_namespace import MetricName, MetricNamespace
from shardkit.metrics.rec_metric import RecMetric

__all__ = ["THRESHOLD", "AccuracyMetric", "AccuracyMetricComputation", "compute_accuracy",
           "compute_accuracy_sum", "get_accuracy_states"]  # fmt: skip

THRESHOLD = "threshold"


def compute_accuracy(
    accuracy_sum: torch.Tensor, weighted_num_samples: torch.Tensor
) -> torch.Tensor:
    return torch.where(
        weighted_num_samples == 0.0, 0.0, accuracy_sum / weighted_num_samples
    ).double()


def compute_accuracy_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                         threshold: float = 0.5) -> torch.Tensor:  # fmt: skip
    return (weights * ((predictions.double() >= threshold) == labels)).sum(-1)


def get_accuracy_states(labels: torch.Tensor, predictions: torch.Tensor,
                        weights: torch.Tensor | None,
                        threshold: float = 0.5) -> dict[str, torch.Tensor]:  # fmt: skip
    weights = torch.ones_like(predictions) if weights is None else weights
    return {"accuracy_sum": compute_accuracy_sum(labels, predictions, weights, threshold),
            "weighted_num_samples": weights.sum(-1)}  # fmt: skip


class AccuracyMetricComputation(RatioComputation):
    """Accuracy's states; ``threshold`` (default 0.5) on the predicted probability."""

    state_names = ("accuracy_sum", "weighted_num_samples")
    metric_name = MetricName.ACCURACY
    ratio = staticmethod(compute_accuracy)

    def __init__(self, *args: Any, threshold: float = 0.5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._threshold = threshold

    def _batch_states(self, labels: torch.Tensor, predictions: torch.Tensor,
                      weights: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
        return get_accuracy_states(labels, predictions, weights, self._threshold)


class AccuracyMetric(RecMetric):
    """``"accuracy-<task>|lifetime_accuracy"`` and ``"...|window_accuracy"``."""

    _namespace = MetricNamespace.ACCURACY
    _computation_class = AccuracyMetricComputation
