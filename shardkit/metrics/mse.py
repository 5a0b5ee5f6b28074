"""Mean squared error, its root and R^2 (``torchrec.metrics.mse``)::

mse = sum w (y - p)^2 / sum w        rmse = sqrt(mse)        (0 without weight)
r_squared = 1 - error_sum / (sum w y^2 - (sum w y)^2 / sum w)   (1 when the labels are constant)
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

__all__ = ["ERROR_SUM", "LABEL_SQUARED_SUM", "LABEL_SUM", "WEIGHTED_NUM_SAMPLES", "MSEMetric",
           "MSEMetricComputation", "compute_error_sum", "compute_mse", "compute_r_squared",
           "compute_rmse", "get_mse_states"]  # fmt: skip

ERROR_SUM = "error_sum"
WEIGHTED_NUM_SAMPLES = "weighted_num_samples"
LABEL_SUM = "label_sum"
LABEL_SQUARED_SUM = "label_squared_sum"


def compute_mse(error_sum: torch.Tensor, weighted_num_samples: torch.Tensor) -> torch.Tensor:
    return torch.where(weighted_num_samples == 0.0, 0.0, error_sum / weighted_num_samples).double()


def compute_rmse(error_sum: torch.Tensor, weighted_num_samples: torch.Tensor) -> torch.Tensor:
    return torch.where(weighted_num_samples == 0.0, 0.0,
                       torch.sqrt(error_sum / weighted_num_samples)).double()  # fmt: skip


def compute_r_squared(error_sum: torch.Tensor, weighted_num_samples: torch.Tensor,
                      label_sum: torch.Tensor, label_squared_sum: torch.Tensor) -> torch.Tensor:  # fmt: skip
    total = label_squared_sum.double() - label_sum.double().square() / weighted_num_samples.double()
    return torch.where(total == 0.0, 1.0, 1.0 - error_sum / total).double()


def compute_error_sum(labels: torch.Tensor, predictions: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:  # fmt: skip
    return (weights * (labels - predictions.double()).square()).sum(-1)


def get_mse_states(labels: torch.Tensor, predictions: torch.Tensor,
                   weights: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
    return {
        ERROR_SUM: compute_error_sum(labels, predictions, weights),
        WEIGHTED_NUM_SAMPLES: weights.sum(-1),
        LABEL_SUM: (weights * labels).sum(-1),
        LABEL_SQUARED_SUM: (weights * labels.square()).sum(-1),
    }


class MSEMetricComputation(RecMetricComputation):
    """MSE's states; ``include_r_squared=True`` adds R^2."""

    def __init__(self, *args: Any, include_r_squared: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._include_r_squared = include_r_squared
        for name in (ERROR_SUM, WEIGHTED_NUM_SAMPLES, LABEL_SUM, LABEL_SQUARED_SUM):
            persistent = name in (ERROR_SUM, WEIGHTED_NUM_SAMPLES) or include_r_squared
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double),
                            add_window_state=True, persistent=persistent)  # fmt: skip

    def update(self, *, predictions: torch.Tensor | None, labels: torch.Tensor,
               weights: torch.Tensor | None, **kwargs: Any) -> None:  # fmt: skip
        if predictions is None or weights is None:
            raise RecMetricException("MSEMetricComputation.update needs predictions and weights")
        for name, value in get_mse_states(labels, predictions, weights).items():
            getattr(self, name).add_(value)
            self._aggregate_window_state(name, value, predictions.shape[-1])

    def _compute(self) -> list[MetricComputationReport]:
        reports = []
        for prefix, get in ((MetricPrefix.LIFETIME, lambda n: getattr(self, n)),
                            (MetricPrefix.WINDOW, self.get_window_state)):  # fmt: skip
            error, num = get(ERROR_SUM), get(WEIGHTED_NUM_SAMPLES)
            reports.append(MetricComputationReport(MetricName.MSE, prefix, compute_mse(error, num)))
            reports.append(
                MetricComputationReport(MetricName.RMSE, prefix, compute_rmse(error, num))
            )
            if self._include_r_squared:
                r2 = compute_r_squared(error, num, get(LABEL_SUM), get(LABEL_SQUARED_SUM))
                reports.append(MetricComputationReport(MetricName.R_SQUARED, prefix, r2))
        return reports


class MSEMetric(RecMetric):
    """``"mse-<task>|lifetime_mse"``, ``"...|lifetime_rmse"`` and their window values."""

    _namespace = MetricNamespace.MSE
    _computation_class = MSEMetricComputation
