"""Click-through rate: ``sum w y / sum w`` (0 without weight; ``torchrec.metrics.ctr``)."""

from __future__ import annotations

import torch

from shardkit.metrics._ratio import RatioComputation
from shardkit.metrics.metrics_namespace import MetricName, MetricNamespace
from shardkit.metrics.rec_metric import RecMetric

__all__ = [
    "CTR_DENOM",
    "CTR_NUM",
    "CTRMetric",
    "CTRMetricComputation",
    "compute_ctr",
    "get_ctr_states",
]  # fmt: skip

CTR_NUM = "ctr_num"
CTR_DENOM = "ctr_denom"


def compute_ctr(ctr_num: torch.Tensor, ctr_denom: torch.Tensor) -> torch.Tensor:
    return torch.where(ctr_denom == 0.0, 0.0, ctr_num / ctr_denom).double()


def get_ctr_states(labels: torch.Tensor, predictions: torch.Tensor,
                   weights: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
    return {CTR_NUM: (labels * weights).sum(-1), CTR_DENOM: weights.sum(-1)}


class CTRMetricComputation(RatioComputation):
    state_names = (CTR_NUM, CTR_DENOM)
    metric_name = MetricName.CTR
    states = staticmethod(get_ctr_states)
    ratio = staticmethod(compute_ctr)


class CTRMetric(RecMetric):
    """``"ctr-<task>|lifetime_ctr"`` and ``"...|window_ctr"``."""

    _namespace = MetricNamespace.CTR
    _computation_class = CTRMetricComputation
