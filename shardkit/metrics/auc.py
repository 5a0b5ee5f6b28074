"""ROC AUC over the window of examples (``torchrec.metrics.auc``).

Each rank keeps its latest ``window_size / world_size`` examples (predictions, labels, weights per
task); ``compute()`` gathers every rank's and computes the exact weighted AUC (ties count one half,
[Note: exact AUC] in `shardkit.metrics._auc`; TorchRec integrates a trapezoid over its sort order,
the same value without ties). No positive or no negative weight gives 0.5, as in TorchRec. With
``grouped_auc=True`` (and ``grouping_keys`` among the model outputs) it also reports the mean AUC
over the groups.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from shardkit.metrics._auc import auc_score
from shardkit.metrics._computation import (
    MetricComputationReport,
    RecMetricComputation,
    RecMetricException,
)
from shardkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from shardkit.metrics.rec_metric import RecMetric

__all__ = [
    "GROUPING_KEYS",
    "LABELS",
    "PREDICTIONS",
    "REQUIRED_INPUTS",
    "WEIGHTS",
    "AUCMetric",
    "AUCMetricComputation",
    "compute_auc",
    "compute_auc_per_group",
]

PREDICTIONS = "predictions"
LABELS = "labels"
WEIGHTS = "weights"
GROUPING_KEYS = "grouping_keys"
REQUIRED_INPUTS = "required_inputs"


def _one(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
         apply_bin: bool = False) -> torch.Tensor:  # fmt: skip
    if apply_bin:
        labels = (labels >= 0.039).to(labels.dtype)
    value = auc_score(predictions, labels, weights)
    return torch.tensor([0.5 if math.isnan(value) else value], dtype=torch.double)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def compute_auc(n_tasks: int, predictions: list[torch.Tensor], labels: list[torch.Tensor],
                weights: list[torch.Tensor], apply_bin: bool = False) -> torch.Tensor:  # fmt: skip
    """AUC per task ``[n_tasks]`` of the concatenated ``[n_tasks, B_i]`` pieces."""
    preds, labs, wts = _cat(predictions), _cat(labels), _cat(weights)
    return torch.cat([_one(p, y, w, apply_bin) for p, y, w in zip(preds, labs, wts)])


def compute_auc_per_group(n_tasks: int, predictions: list[torch.Tensor],
                          labels: list[torch.Tensor], weights: list[torch.Tensor],
                          grouping_keys: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The mean over groups of each group's AUC, per task ``[n_tasks]`` (0.5 without groups)."""
    preds, labs, wts = _cat(predictions), _cat(labels), _cat(weights)
    groups = torch.unique(grouping_keys)
    result = []
    for p, y, w in zip(preds, labs, wts):
        aucs = [
            _one(p[grouping_keys == g], y[grouping_keys == g], w[grouping_keys == g])
            for g in groups
        ]
        result.append(
            torch.cat(aucs).mean().view(1) if aucs else torch.tensor([0.5], dtype=torch.double)
        )
    return torch.cat(result)


class AUCMetricComputation(RecMetricComputation):
    """The kept window of examples and its AUC.

    Args: as `RecMetricComputation`, plus ``grouped_auc`` (also the mean per-group AUC) and
    ``apply_bin`` (labels >= 0.039 count as 1).
    """

    def __init__(self, *args: Any, grouped_auc: bool = False, apply_bin: bool = False,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        if grouped_auc and self._fused_update_limit > 0:
            raise RecMetricException("grouped_auc and fused_update_limit cannot be used together")
        self._grouped_auc, self._apply_bin = grouped_auc, apply_bin
        self._num_samples = 0
        for name in (PREDICTIONS, LABELS, WEIGHTS) + ((GROUPING_KEYS,) if grouped_auc else ()):
            self._add_state(name, [], add_window_state=False)

    def update(self, *, predictions: torch.Tensor | None, labels: torch.Tensor,
               weights: torch.Tensor | None, **kwargs: Any) -> None:  # fmt: skip
        if predictions is None or weights is None:
            raise RecMetricException("AUCMetricComputation.update needs predictions and weights")
        for name, value in ((PREDICTIONS, predictions), (LABELS, labels), (WEIGHTS, weights)):
            getattr(self, name).append(value.float())
        if self._grouped_auc:
            keys = kwargs.get(REQUIRED_INPUTS, {}).get(GROUPING_KEYS)
            if keys is None:
                raise RecMetricException(
                    f"grouped AUC needs '{GROUPING_KEYS}' in the model's outputs for every update"
                )
            getattr(self, GROUPING_KEYS).append(keys.reshape(1, -1).float())
        self._num_samples += predictions.shape[-1]
        self._trim()

    def _trim(self) -> None:
        """Keep the latest ``window_size`` examples."""
        names = [PREDICTIONS, LABELS, WEIGHTS] + ([GROUPING_KEYS] if self._grouped_auc else [])
        while self._num_samples > self._window_size:
            excess = self._num_samples - self._window_size
            oldest = getattr(self, PREDICTIONS)[0].shape[-1]
            for name in names:
                parts = getattr(self, name)
                if excess >= oldest:
                    parts.pop(0)
                else:
                    parts[0] = parts[0][..., excess:]
            self._num_samples -= min(excess, oldest)

    def _compute(self) -> list[MetricComputationReport]:
        parts = [
            getattr(self, n) or [torch.zeros(self._n_tasks, 0)]
            for n in (PREDICTIONS, LABELS, WEIGHTS)
        ]
        preds, labels, weights = parts
        reports = [MetricComputationReport(
            MetricName.AUC, MetricPrefix.WINDOW,
            compute_auc(self._n_tasks, preds, labels, weights, self._apply_bin))]  # fmt: skip
        if self._grouped_auc:
            keys = _cat(getattr(self, GROUPING_KEYS) or [torch.zeros(1, 0)])[0]
            reports.append(MetricComputationReport(
                MetricName.GROUPED_AUC, MetricPrefix.WINDOW,
                compute_auc_per_group(self._n_tasks, preds, labels, weights, keys)))  # fmt: skip
        return reports

    def reset(self) -> None:
        super().reset()
        self._num_samples = 0


class AUCMetric(RecMetric):
    """``"auc-<task>|window_auc"`` (AUC over the window of examples on all ranks)."""

    _namespace = MetricNamespace.AUC
    _computation_class = AUCMetricComputation

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("grouped_auc"):
            self._required_inputs.add(GROUPING_KEYS)
