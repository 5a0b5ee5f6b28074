"""`RecMetricModule` and `generate_metric_module` (``torchrec.metrics.metric_module``): the
metrics of a training job, updated from the model's outputs each step and computed over all ranks
every ``compute_interval_steps`` steps::

    metrics = generate_metric_module(RecMetricModule, metrics_config, batch_size=B,
                                     world_size=W, my_rank=rank, state_metrics_mapping={},
                                     device=torch.device("cpu"))
    metrics.update({"prediction": probs, "label": labels, "weight": weights})  # each step
    if metrics.should_compute():
        values = metrics.compute()  # a collective: every rank calls it; rank 0 gets the values

shardkit has six of TorchRec's metrics (`REC_METRICS_MAPPING`); asking for another is an error
that names it and the six.
"""

from __future__ import annotations

import abc
import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.metrics.accuracy import AccuracyMetric
from shardkit.metrics.auc import AUCMetric
from shardkit.metrics.calibration import CalibrationMetric
from shardkit.metrics.ctr import CTRMetric
from shardkit.metrics.metrics_config import (
    BatchSizeStage,
    MetricsConfig,
    RecMetricEnum,
    RecMetricEnumBase,
    RecTaskInfo,
    StateMetricEnum,
    validate_batch_size_stages,
)
from shardkit.metrics.metrics_namespace import (
    MetricNamespace,
    compose_customized_metric_key,
    compose_metric_namespace,
)
from shardkit.metrics.mse import MSEMetric
from shardkit.metrics.ne import NEMetric
from shardkit.metrics.rec_metric import RecMetric, RecMetricException, RecMetricList
from shardkit.metrics.throughput import ThroughputMetric

__all__ = [
    "MODEL_METRIC_LABEL",
    "REC_METRICS_MAPPING",
    "STATE_METRICS_NAMESPACE_MAPPING",
    "RecMetricModule",
    "StateMetric",
    "generate_metric_module",
]

logger = logging.getLogger(__name__)

REC_METRICS_MAPPING: dict[RecMetricEnumBase, type[RecMetric]] = {
    RecMetricEnum.NE: NEMetric,
    RecMetricEnum.CTR: CTRMetric,
    RecMetricEnum.CALIBRATION: CalibrationMetric,
    RecMetricEnum.AUC: AUCMetric,
    RecMetricEnum.MSE: MSEMetric,
    RecMetricEnum.ACCURACY: AccuracyMetric,
}
MODEL_METRIC_LABEL = "model"
STATE_METRICS_NAMESPACE_MAPPING: dict[StateMetricEnum, MetricNamespace] = {
    StateMetricEnum.OPTIMIZERS: MetricNamespace.OPTIMIZERS,
    StateMetricEnum.MODEL_CONFIGURATOR: MetricNamespace.MODEL_CONFIGURATOR,
}


class StateMetric(abc.ABC):
    """A component that reports metrics of its own (e.g. an optimizer's learning rates)."""

    @abc.abstractmethod
    def get_metrics(self) -> dict[str, torch.Tensor | float]:
        """``{metric name: value}``."""


class MetricsResult(dict):
    """``compute()``'s values (a dict; ``resolve()`` for TorchRec's deferred-metrics API)."""

    def resolve(self) -> dict[str, Any]:
        return dict(self)

    def is_resolved(self) -> bool:
        return True


class RecMetricModule(nn.Module):
    """The metrics of a job: rec metrics per task, throughput and state metrics.

    Args:
        batch_size: examples per step and rank.
        world_size: ranks.
        rec_tasks: the tasks (whose outputs ``update`` reads).
        rec_metrics: the metrics.
        throughput_metric: the throughput metric, if any.
        state_metrics: ``{namespace: StateMetric}``.
        compute_interval_steps: `should_compute` is true every this many steps.
        min_compute_interval, max_compute_interval: alternatively, seconds between computes
            (the step interval is adjusted after the first compute, as in TorchRec).
    """

    def __init__(self, batch_size: int, world_size: int, rec_tasks: list[RecTaskInfo] | None = None,
                 rec_metrics: RecMetricList | None = None,
                 throughput_metric: ThroughputMetric | None = None,
                 state_metrics: dict[str, StateMetric] | None = None,
                 compute_interval_steps: int = 100, min_compute_interval: float = 0.0,
                 max_compute_interval: float = float("inf")) -> None:  # fmt: skip
        super().__init__()
        self.rec_tasks = list(rec_tasks or [])
        self.rec_metrics = rec_metrics if rec_metrics is not None else RecMetricList([])
        self.throughput_metric = throughput_metric
        self.state_metrics = dict(state_metrics or {})
        self.batch_size, self.world_size = batch_size, world_size
        self.trained_batches = 0
        self.oom_count = self.compute_count = 0
        if compute_interval_steps < 1:
            raise ValueError(f"compute_interval_steps must be >= 1, got {compute_interval_steps}")
        self.compute_interval_steps = compute_interval_steps
        self.min_compute_interval, self.max_compute_interval = (
            min_compute_interval,
            max_compute_interval,
        )
        if min_compute_interval == 0.0 and max_compute_interval == float("inf"):
            self.min_compute_interval = self.max_compute_interval = -1.0  # steps decide
        elif max_compute_interval <= 0.0 or min_compute_interval < 0.0:
            raise ValueError(
                f"compute intervals must satisfy 0 <= min ({min_compute_interval}) and max "
                f"({max_compute_interval}) > 0 seconds"
            )
        self.last_compute_time = -1.0

    def update(self, model_out: dict[str, torch.Tensor], **kwargs: Any) -> None:
        """Add one step's model outputs: per task, ``model_out[task.label_name]``,
        ``[task.prediction_name]`` and ``[task.weight_name]`` (``[B]`` or ``[B, 1]``)."""
        if self.rec_metrics and self.rec_tasks:
            labels, predictions, weights = _parse(self.rec_tasks, model_out)
            required = self.get_required_inputs()
            if required:
                kwargs["required_inputs"] = {k: model_out[k] for k in required if k in model_out}
            self.rec_metrics.update(predictions=predictions, labels=labels, weights=weights,
                                    **kwargs)  # fmt: skip
        if self.throughput_metric is not None:
            self.throughput_metric.update()
        self.trained_batches += 1

    def should_compute(self) -> bool:
        return self.trained_batches % self.compute_interval_steps == 0

    def compute(self) -> MetricsResult:
        """Every metric's values over all ranks: a collective (every rank of the metrics'
        process group calls it); ranks other than 0 get no rec-metric values unless
        ``compute_on_all_ranks``."""
        self.compute_count += 1
        result = MetricsResult()
        if self.rec_metrics:
            self._adjust_compute_interval()
            result.update(self.rec_metrics.compute())
        if self.throughput_metric is not None:
            result.update(self.throughput_metric.compute())
        for namespace, component in self.state_metrics.items():
            for name, value in component.get_metrics().items():
                result[compose_customized_metric_key(namespace, name)] = value
        return result

    def _adjust_compute_interval(self) -> None:
        """After the first compute, turn the seconds interval into steps (the largest over
        ranks, so that every rank computes at the same step)."""
        now = time.time()
        if self.last_compute_time > 0 and self.min_compute_interval >= 0:
            per_step = (now - self.last_compute_time) / self.compute_interval_steps
            low, high = self.min_compute_interval, self.max_compute_interval
            target = (
                low + 1.0
                if high == float("inf")
                else (high + low) / 2
                if low
                else high - (high > 1.0)
            )
            steps = torch.tensor([max(1, int(target / max(per_step, 1e-9)))], dtype=torch.int32)
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(steps, op=dist.ReduceOp.MAX)
            self.compute_interval_steps = int(steps.item())
            self.min_compute_interval = self.max_compute_interval = -1.0
        self.last_compute_time = now

    def local_compute(self) -> MetricsResult:
        """This rank's values alone (no collective)."""
        return MetricsResult(self.rec_metrics.local_compute() if self.rec_metrics else {})

    def sync(self) -> None:
        self.rec_metrics.sync()

    def unsync(self) -> None:
        self.rec_metrics.unsync()

    def reset(self) -> None:
        self.rec_metrics.reset()

    def get_required_inputs(self) -> list[str] | None:
        return self.rec_metrics.get_required_inputs()

    def shutdown(self) -> None:
        logger.info("RecMetricModule: shutdown (nothing runs in the background)")

    def async_compute(self) -> MetricsResult:
        raise RecMetricException("async_compute is not supported by RecMetricModule")


def _parse(tasks: list[RecTaskInfo], model_out: dict[str, torch.Tensor]) -> tuple[dict, dict, dict]:
    """Labels, predictions and weights by task name (tasks with empty outputs left out)."""
    labels, predictions, weights = {}, {}, {}
    for task in tasks:
        for name in (task.label_name, task.prediction_name, task.weight_name):
            if name not in model_out:
                raise ValueError(
                    f"RecMetricModule.update: task {task.name!r} reads {name!r}, which the model "
                    f"output does not have (it has {sorted(model_out)})"
                )
        label = model_out[task.label_name].squeeze()
        prediction = model_out[task.prediction_name].squeeze()
        weight = model_out[task.weight_name].squeeze()
        if label.numel() or prediction.numel() or weight.numel():
            labels[task.name], predictions[task.name], weights[task.name] = (
                label,
                prediction,
                weight,
            )
    return labels, predictions, weights


def _rec_metrics(config: MetricsConfig, world_size: int, my_rank: int, batch_size: int,
                 process_group: dist.ProcessGroup | None) -> RecMetricList:  # fmt: skip
    metrics = []
    for kind, definition in config.rec_metrics.items():
        if kind not in REC_METRICS_MAPPING:
            names = sorted(str(k.name) for k in REC_METRICS_MAPPING)
            raise ValueError(f"RecMetricEnum.{kind.name} is not in shardkit; it has {names}")
        if bool(definition.rec_tasks) == bool(definition.rec_task_indices):
            raise ValueError(
                f"{kind}: give exactly one of RecMetricDef.rec_tasks and rec_task_indices"
            )
        tasks = definition.rec_tasks or [config.rec_tasks[i] for i in definition.rec_task_indices]
        metrics.append(REC_METRICS_MAPPING[kind](
            world_size=world_size, my_rank=my_rank, batch_size=batch_size, tasks=tasks,
            compute_mode=config.rec_compute_mode, window_size=definition.window_size,
            fused_update_limit=config.fused_update_limit,
            compute_on_all_ranks=config.compute_on_all_ranks,
            should_validate_update=config.should_validate_update, process_group=process_group,
            **(definition.arguments or {}),
        ))  # fmt: skip
    return RecMetricList(metrics)


def generate_metric_module(
    metric_class: type[RecMetricModule],
    metrics_config: MetricsConfig,
    batch_size: int,
    world_size: int,
    my_rank: int,
    state_metrics_mapping: dict[StateMetricEnum, StateMetric],
    device: torch.device,
    process_group: dist.ProcessGroup | None = None,
    batch_size_stages: list[BatchSizeStage] | None = None,
    module_kwargs: dict[str, Any] | None = None,
) -> RecMetricModule:
    """``metric_class`` built from ``metrics_config`` and moved to ``device`` (TorchRec's
    function and arguments)."""
    validate_batch_size_stages(batch_size_stages)
    rec_metrics = _rec_metrics(metrics_config, world_size, my_rank, batch_size, process_group)
    throughput = None
    if metrics_config.throughput_metric is not None:
        throughput = ThroughputMetric(
            batch_size=batch_size, world_size=world_size,
            window_seconds=metrics_config.throughput_metric.window_size,
            warmup_steps=metrics_config.throughput_metric.warmup_steps,
            batch_size_stages=batch_size_stages,
        )  # fmt: skip
    state_metrics = {}
    for kind in metrics_config.state_metrics:
        namespace = STATE_METRICS_NAMESPACE_MAPPING[kind]
        state_metrics[compose_metric_namespace(namespace, str(namespace))] = state_metrics_mapping[
            kind
        ]
    module = metric_class(
        batch_size=batch_size, world_size=world_size, rec_tasks=metrics_config.rec_tasks,
        rec_metrics=rec_metrics, throughput_metric=throughput, state_metrics=state_metrics,
        compute_interval_steps=metrics_config.compute_interval_steps,
        min_compute_interval=metrics_config.min_compute_interval,
        max_compute_interval=metrics_config.max_compute_interval, **(module_kwargs or {}),
    )  # fmt: skip
    return module.to(device)
