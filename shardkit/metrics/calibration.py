"""Calibration: ``sum w p / sum w y``, predicted over observed positives (0 when no positive
weight; ``torchrec.metrics.calibration``)."""

from __future__ import annotations

import torch

from shardkit.metrics._ratio import RatioComputation
from shardkit.metrics.metrics_namespace import MetricName, MetricNamespace
from shardkit.metrics.rec_metric import RecMetric

__all__ = ["CALIBRATION_DENOM", "CALIBRATION_NUM", "CalibrationMetric",
           "CalibrationMetricComputation", "compute_calibration", "get_calibration_states"]  # fmt: skip

CALIBRATION_NUM = "calibration_num"
CALIBRATION_DENOM = "calibration_denom"


def compute_calibration(calibration_num: torch.Tensor,
                        calibration_denom: torch.Tensor) -> torch.Tensor:  # fmt: skip
    return torch.where(calibration_denom <= 0.0, 0.0, calibration_num / calibration_denom).double()


def get_calibration_states(labels: torch.Tensor, predictions: torch.Tensor,
                           weights: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
    return {CALIBRATION_NUM: (predictions * weights).sum(-1),
            CALIBRATION_DENOM: (labels * weights).sum(-1)}  # fmt: skip


class CalibrationMetricComputation(RatioComputation):
    state_names = (CALIBRATION_NUM, CALIBRATION_DENOM)
    metric_name = MetricName.CALIBRATION
    states = staticmethod(get_calibration_states)
    ratio = staticmethod(compute_calibration)


class CalibrationMetric(RecMetric):
    """``"calibration-<task>|lifetime_calibration"`` and ``"...|window_calibration"``."""

    _namespace = MetricNamespace.CALIBRATION
    _computation_class = CalibrationMetricComputation
