"""What a `RecMetricModule` computes (``torchrec.metrics.metrics_config``): the tasks (which
model outputs are a task's labels, predictions and weights), the metrics per task, their windows,
throughput, and how often to compute.

`RecMetricEnum` has all of TorchRec's metrics; `generate_metric_module` builds those shardkit has
(AUC, NE, log loss through NE, calibration, CTR, accuracy, MSE) and refuses the others by name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from shardkit.metrics.metrics_namespace import StrValueMixin

__all__ = [
    "BatchSizeStage",
    "DefaultMetricsConfig",
    "DefaultTaskInfo",
    "EmptyMetricsConfig",
    "MetricsConfig",
    "RecComputeMode",
    "RecMetricDef",
    "RecMetricEnum",
    "RecMetricEnumBase",
    "RecTaskInfo",
    "SessionMetricDef",
    "StateMetricEnum",
    "ThroughputDef",
    "validate_batch_size_stages",
]


class RecMetricEnumBase(StrValueMixin, enum.Enum):
    """Base of metric enums (extend it for custom metrics)."""


class RecMetricEnum(RecMetricEnumBase):
    """TorchRec's metrics."""

    NE = "ne"
    NE_POSITIVE = "ne_positive"
    RECALIBRATED_NE = "recalibrated_ne"
    RECALIBRATED_CALIBRATION = "recalibrated_calibration"
    SEGMENTED_NE = "segmented_ne"
    LOG_LOSS = "log_loss"
    CTR = "ctr"
    AUC = "auc"
    AUPRC = "auprc"
    RAUC = "rauc"
    CALIBRATION = "calibration"
    MSE = "mse"
    MAE = "mae"
    MULTICLASS_RECALL = "multiclass_recall"
    RECALL_SESSION_LEVEL = "recall_session_level"
    PRECISION_SESSION_LEVEL = "precision_session_level"
    WEIGHTED_AVG = "weighted_avg"
    TOWER_QPS = "tower_qps"
    ACCURACY = "accuracy"
    NDCG = "ndcg"
    XAUC = "xauc"
    SCALAR = "scalar"
    PRECISION = "precision"
    RECALL = "recall"
    SERVING_NE = "serving_ne"
    SERVING_CALIBRATION = "serving_calibration"
    SERVING_AE_LOSS = "serving_ae_loss"
    OUTPUT = "output"
    TENSOR_WEIGHTED_AVG = "tensor_weighted_avg"
    CALI_FREE_NE = "cali_free_ne"
    UNWEIGHTED_NE = "unweighted_ne"
    HINDSIGHT_TARGET_PR = "hindsight_target_pr"
    NMSE = "nmse"
    AVERAGE = "average"
    MULTI_LABEL_PRECISION = "multi_label_precision"
    NUM_POSITIVE_SAMPLES = "num_positive_samples"
    SUM_WEIGHTS = "sum_weights"
    NUM_MISSING_LABELS = "num_missing_labels"
    WEIGHTED_SUM_PREDICTIONS = "weighted_sum_predictions"


@dataclass(unsafe_hash=True, eq=True)
class SessionMetricDef:
    """Session-level metrics' settings (TorchRec's; shardkit has no session metrics)."""

    session_var_name: str
    top_threshold: int | None = None
    run_ranking_of_labels: bool = False


@dataclass(unsafe_hash=True, eq=True)
class RecTaskInfo:
    """One task: the names of its labels, predictions and weights in the model's output dict."""

    name: str = "DefaultTask"
    label_name: str = "label"
    prediction_name: str = "prediction"
    weight_name: str = "weight"
    session_metric_def: SessionMetricDef | None = None
    is_negative_task: bool = False
    tensor_name: str | None = None
    weighted: bool = True


class RecComputeMode(enum.Enum):
    """One computation per task (UNFUSED) or one for all tasks together (FUSED_*: the same
    values, computed with ``[n_tasks, B]`` tensors)."""

    FUSED_TASKS_COMPUTATION = 1
    UNFUSED_TASKS_COMPUTATION = 2
    FUSED_TASKS_AND_STATES_COMPUTATION = 3


_DEFAULT_WINDOW_SIZE = 10_000_000
_DEFAULT_THROUGHPUT_WINDOW_SECONDS = 100
_DEFAULT_THROUGHPUT_WARMUP_STEPS = 100


@dataclass
class RecMetricDef:
    """One metric: its tasks (given, or as indices into `MetricsConfig.rec_tasks`), the window
    (in examples over all ranks) and extra arguments for the metric's class."""

    rec_tasks: list[RecTaskInfo] = field(default_factory=list)
    rec_task_indices: list[int] = field(default_factory=list)
    window_size: int = _DEFAULT_WINDOW_SIZE
    arguments: dict[str, Any] | None = None


class StateMetricEnum(StrValueMixin, enum.Enum):
    """Components whose own metrics a module reports (`StateMetric`)."""

    OPTIMIZERS = "optimizers"
    MODEL_CONFIGURATOR = "model_configurator"


@dataclass
class ThroughputDef:
    """The throughput metric: its window in seconds and the steps it ignores at the start."""

    window_size: int = _DEFAULT_THROUGHPUT_WINDOW_SECONDS
    warmup_steps: int = _DEFAULT_THROUGHPUT_WARMUP_STEPS


@dataclass
class MetricsConfig:
    """Everything `generate_metric_module` needs (TorchRec's fields and defaults)."""

    rec_tasks: list[RecTaskInfo] = field(default_factory=list)
    rec_metrics: dict[RecMetricEnum, RecMetricDef] = field(default_factory=dict)
    throughput_metric: ThroughputDef | None = None
    rec_compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION
    fused_update_limit: int = 0
    state_metrics: list[StateMetricEnum] = field(default_factory=list)
    compute_interval_steps: int = 100
    min_compute_interval: float = 0.0
    max_compute_interval: float = float("inf")
    compute_on_all_ranks: bool = False
    should_validate_update: bool = False
    enable_pt2_compile: bool = False
    should_clone_update_inputs: bool = False
    use_cpu_offloaded_rec_metric_module: bool | None = None

    def __post_init__(self) -> None:
        for metric, definition in self.rec_metrics.items():
            for index in definition.rec_task_indices:
                if not 0 <= index < len(self.rec_tasks):
                    raise ValueError(
                        f"MetricsConfig: {metric} names rec_task_indices {index}, but there are "
                        f"{len(self.rec_tasks)} rec_tasks"
                    )
        if self.use_cpu_offloaded_rec_metric_module:
            raise ValueError(
                "MetricsConfig(use_cpu_offloaded_rec_metric_module=True): TorchRec's CPU-offloaded "
                "metric module is not in shardkit; metrics already run beside training here"
            )


DefaultTaskInfo = RecTaskInfo(name="DefaultTask", label_name="label",
                              prediction_name="prediction", weight_name="weight")  # fmt: skip
DefaultMetricsConfig = MetricsConfig(
    rec_tasks=[DefaultTaskInfo],
    rec_metrics={
        RecMetricEnum.NE: RecMetricDef(
            rec_tasks=[DefaultTaskInfo], window_size=_DEFAULT_WINDOW_SIZE
        )
    },
    throughput_metric=ThroughputDef(),
    state_metrics=[],
)
EmptyMetricsConfig = MetricsConfig(rec_tasks=[], rec_metrics={}, throughput_metric=None,
                                   state_metrics=[])  # fmt: skip


@dataclass
class BatchSizeStage:
    """A batch size used until iteration ``max_iters`` (None: to the end)."""

    batch_size: int = 0
    max_iters: int | None = 0


def validate_batch_size_stages(batch_size_stages: list[BatchSizeStage] | None) -> None:
    """The last stage must run to the end (``max_iters=None``)."""
    if not batch_size_stages:
        return
    if batch_size_stages[-1].max_iters is not None:
        raise ValueError(
            "batch size stages: the last stage must have max_iters=None, got "
            f"{batch_size_stages[-1].max_iters}"
        )
