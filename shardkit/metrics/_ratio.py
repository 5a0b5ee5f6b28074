"""The shape shared by the metrics that are ratios of two weighted sums (CTR, calibration,
accuracy): two states, a lifetime and a window value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shardkit.metrics._computation import (
    MetricComputationReport,
    RecMetricComputation,
    RecMetricException,
)
from shardkit.metrics.metrics_namespace import MetricName, MetricPrefix

__all__ = ["RatioComputation"]


class RatioComputation(RecMetricComputation):
    """Subclasses set the two state names, the metric name, ``states(labels, predictions,
    weights)`` and ``ratio(num, denom)``."""

    state_names: tuple[str, str]
    metric_name: MetricName
    states: Callable[..., dict[str, torch.Tensor]]
    ratio: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in self.state_names:
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double),
                            add_window_state=True, persistent=True)  # fmt: skip

    def _batch_states(self, labels: torch.Tensor, predictions: torch.Tensor,
                      weights: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
        return type(self).states(labels, predictions, weights)

    def update(self, *, predictions: torch.Tensor | None, labels: torch.Tensor,
               weights: torch.Tensor | None, **kwargs: Any) -> None:  # fmt: skip
        if predictions is None or weights is None:
            raise RecMetricException(f"{type(self).__name__}.update needs predictions and weights")
        for name, value in self._batch_states(labels, predictions, weights).items():
            getattr(self, name).add_(value)
            self._aggregate_window_state(name, value, predictions.shape[-1])

    def _compute(self) -> list[MetricComputationReport]:
        num, denom = self.state_names
        ratio = type(self).ratio
        return [
            MetricComputationReport(self.metric_name, MetricPrefix.LIFETIME,
                                    ratio(getattr(self, num), getattr(self, denom))),
            MetricComputationReport(self.metric_name, MetricPrefix.WINDOW,
                                    ratio(self.get_window_state(num), self.get_window_state(denom))),
        ]  # fmt: skip
