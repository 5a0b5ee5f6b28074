"""`RecMetric`: one metric over several tasks, its results keyed by namespace, task and prefix
(``torchrec.metrics.rec_metric``). The arithmetic lives in its `RecMetricComputation`s (one per
task, or one for all tasks when fused); see [Note: metric states across ranks] in
`shardkit.metrics._computation`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import torch
import torch.distributed as dist
from torch import nn

from shardkit.metrics._computation import (
    MAX_BUFFER_COUNT,
    MetricComputationReport,
    RecMetricComputation,
    RecMetricException,
    WindowBuffer,
)
from shardkit.metrics.metrics_config import RecComputeMode, RecTaskInfo
from shardkit.metrics.metrics_namespace import MetricNamespaceBase, compose_metric_key

__all__ = [
    "MAX_BUFFER_COUNT",
    "MetricComputationReport",
    "RecMetric",
    "RecMetricComputation",
    "RecMetricException",
    "RecMetricList",
    "WindowBuffer",
]

RecModelOutput = torch.Tensor | dict[str, torch.Tensor]
_FUSED = (RecComputeMode.FUSED_TASKS_COMPUTATION, RecComputeMode.FUSED_TASKS_AND_STATES_COMPUTATION)


class RecMetric(nn.Module):
    """A metric over ``tasks``: ``update`` with each batch's predictions, labels and weights
    (dicts by task name, ``[B]`` each), ``compute()`` for ``{"<ns>-<task>|<prefix><name>":
    value}`` over all ranks (a collective).

    Args:
        world_size: ranks that update this metric.
        my_rank: this rank.
        batch_size: examples per update and rank.
        tasks: the tasks.
        compute_mode: one computation per task, or fused.
        window_size: the window over all ranks, in examples (each rank keeps
            ``ceil(window_size / world_size)``, at least ``batch_size``).
        fused_update_limit: buffer this many updates and apply them together.
        compute_on_all_ranks: every rank gets the values (else only rank 0).
        should_validate_update: report 0 for a task whose weights were always 0.
        process_group: the ranks to combine (default: the world).
        kwargs: the computation's own arguments (e.g. NE's ``include_logloss``).
    """

    _computation_class: ClassVar[type[RecMetricComputation]]
    _namespace: ClassVar[MetricNamespaceBase]
    PREDICTIONS = "predictions"
    LABELS = "labels"
    WEIGHTS = "weights"

    def __init__(self, world_size: int, my_rank: int, batch_size: int, tasks: list[RecTaskInfo],
                 compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION,
                 window_size: int = 100, fused_update_limit: int = 0,
                 compute_on_all_ranks: bool = False, should_validate_update: bool = False,
                 process_group: dist.ProcessGroup | None = None, **kwargs: Any) -> None:  # fmt: skip
        super().__init__()
        if compute_mode in _FUSED and fused_update_limit > 0:
            raise ValueError(
                f"{type(self).__name__}: fused tasks (compute_mode={compute_mode.name}) and "
                f"fused updates (fused_update_limit={fused_update_limit}) cannot be combined"
            )
        kwargs.pop("batch_size_stages", None)
        self._world_size, self._my_rank, self._batch_size = world_size, my_rank, batch_size
        self._window_size = math.ceil(window_size / world_size)
        if self._window_size < batch_size:
            raise ValueError(
                f"{type(self).__name__}: the window per rank (ceil({window_size} / {world_size}) "
                f"= {self._window_size}) must be at least the batch size {batch_size}; raise "
                "window_size"
            )
        self._tasks, self._compute_mode = list(tasks), compute_mode
        self._fused_update_limit = fused_update_limit
        self._should_validate_update = should_validate_update
        self._update_buffers: dict[str, list[RecModelOutput]] = {
            self.PREDICTIONS: [], self.LABELS: [], self.WEIGHTS: []
        }  # fmt: skip
        self._required_inputs: set[str] = set()
        fused = compute_mode in _FUSED
        self._metrics_computations = nn.ModuleList(
            self._computation_class(
                my_rank=my_rank, batch_size=batch_size, n_tasks=len(tasks) if fused else 1,
                window_size=self._window_size, compute_on_all_ranks=compute_on_all_ranks,
                should_validate_update=should_validate_update, compute_mode=compute_mode,
                process_group=process_group, fused_update_limit=fused_update_limit,
                **{**kwargs, **self._get_task_kwargs(config)},
            )
            for config in ([self._tasks] if fused else self._tasks)
        )  # fmt: skip

    @property
    def _computations(self) -> list[RecMetricComputation]:
        """``_metrics_computations`` (TorchRec's attribute), typed: torch's stubs type a
        ``ModuleList``'s items as ``nn.Module``."""
        return cast("list[RecMetricComputation]", list(self._metrics_computations))

    def _get_task_kwargs(self, task_config: RecTaskInfo | list[RecTaskInfo]) -> dict[str, Any]:
        """Per-task arguments for the computation (a hook for subclasses)."""
        return {}

    # -- update --------------------------------------------------------------------------

    def update(self, *, predictions: RecModelOutput, labels: RecModelOutput,
               weights: RecModelOutput | None, **kwargs: Any) -> None:  # fmt: skip
        """Add a batch (``{task name: [B]}``, or ``[n_tasks, B]`` tensors when fused)."""
        kwargs.pop("_log_tensors", None)
        if self._fused_update_limit <= 0:
            self._update(predictions, labels, weights, **kwargs)
            return
        for key, value in ((self.PREDICTIONS, predictions), (self.LABELS, labels),
                           (self.WEIGHTS, weights)):  # fmt: skip
            if value is not None:
                self._update_buffers[key].append(value)
        self._flush(force=False)

    def _flush(self, force: bool) -> None:
        pending = self._update_buffers[self.PREDICTIONS]
        if not pending or (not force and len(pending) < self._fused_update_limit):
            return
        fused = {k: _concat(v) for k, v in self._update_buffers.items() if v}
        for buffer in self._update_buffers.values():
            buffer.clear()
        self._update(fused[self.PREDICTIONS], fused[self.LABELS], fused.get(self.WEIGHTS))

    @torch.no_grad()
    def _update(self, predictions: RecModelOutput, labels: RecModelOutput,
                weights: RecModelOutput | None, **kwargs: Any) -> None:  # fmt: skip
        if self._compute_mode in _FUSED:
            self._update_fused(predictions, labels, weights, **kwargs)
        else:
            self._update_unfused(predictions, labels, weights, **kwargs)

    def _update_fused(self, predictions, labels, weights, **kwargs: Any) -> None:
        names = [t.name for t in self._tasks]
        stack = lambda x: x if isinstance(x, torch.Tensor) else torch.stack([x[n] for n in names])  # noqa: E731
        preds, labs = stack(predictions).view(len(names), -1), stack(labels).view(len(names), -1)
        weights = torch.ones_like(preds) if weights is None else stack(weights).view(len(names), -1)
        self._feed(self._computations[0], preds, labs, weights, **kwargs)

    def _update_unfused(self, predictions, labels, weights, **kwargs: Any) -> None:
        for task, computation in zip(self._tasks, self._computations):
            if task.name not in predictions or predictions[task.name].numel() == 0:
                continue
            preds = predictions[task.name].reshape(1, -1)
            labs = labels[task.name].reshape(1, -1)
            task_weights = (
                torch.ones_like(preds) if weights is None else weights[task.name].reshape(1, -1)
            )
            self._feed(computation, preds, labs, task_weights, **kwargs)

    def _feed(self, computation: RecMetricComputation, predictions: torch.Tensor,
              labels: torch.Tensor, weights: torch.Tensor, **kwargs: Any) -> None:  # fmt: skip
        if predictions.shape != labels.shape or predictions.shape != weights.shape:
            raise RecMetricException(
                f"{type(self).__name__}: predictions {tuple(predictions.shape)}, labels "
                f"{tuple(labels.shape)} and weights {tuple(weights.shape)} must have one shape"
            )
        if self._should_validate_update:
            valid = torch.count_nonzero(weights, dim=-1) > 0  # [n_tasks]
            if not valid.any():
                return
            computation.has_valid_update.logical_or_(valid)
        computation.update(predictions=predictions, labels=labels, weights=weights, **kwargs)

    # -- compute -------------------------------------------------------------------------

    def _reports(self, scope: str) -> Iterator[tuple[RecTaskInfo, MetricComputationReport, Any]]:
        """(task, report, value) of every computation; ``scope`` "" or "local_"."""
        fused = self._compute_mode in _FUSED
        for index, computation in enumerate(self._computations):
            computation.pre_compute()
            for report in getattr(computation, scope + "compute")():
                if fused:
                    valid = (
                        computation.has_valid_update
                        if self._should_validate_update
                        else itertools.repeat(1)
                    )
                    for task, value, ok in zip(self._tasks, report.value, valid):
                        yield task, report, value if ok > 0 else torch.zeros_like(value)
                else:
                    ok = not self._should_validate_update or computation.has_valid_update[0] > 0
                    value = report.value if ok else torch.zeros_like(report.value)
                    yield self._tasks[index], report, value

    def _keyed(self, scope: str) -> dict[str, torch.Tensor]:
        self._flush(force=True)
        return {
            compose_metric_key(self._namespace, task.name, report.name,
                               f"{scope}{report.metric_prefix.value}", report.description): value  # type: ignore[arg-type]
            for task, report, value in self._reports(scope)
        }  # fmt: skip

    def compute(self) -> dict[str, torch.Tensor]:
        """The values over all ranks (a collective; empty on ranks other than 0 unless
        ``compute_on_all_ranks``)."""
        return self._keyed("")

    def local_compute(self) -> dict[str, torch.Tensor]:
        """The values of this rank's updates alone (keys prefixed ``local_``)."""
        return self._keyed("local_")

    def sync(self) -> None:
        for computation in self._computations:
            computation.sync()

    def unsync(self) -> None:
        for computation in self._computations:
            if computation._is_synced:
                computation.unsync()

    def reset(self) -> None:
        for computation in self._computations:
            computation.reset()

    def get_required_inputs(self) -> set[str]:
        return self._required_inputs


def _concat(outputs: list[RecModelOutput]) -> RecModelOutput:
    if isinstance(outputs[0], torch.Tensor):
        return torch.cat(outputs, dim=-1)  # type: ignore[arg-type]
    return {name: torch.cat([o[name] for o in outputs]) for name in outputs[0]}  # type: ignore[index]


class RecMetricList(nn.Module):
    """Several `RecMetric` updated and computed together."""

    def __init__(self, rec_metrics: list[RecMetric]) -> None:
        super().__init__()
        self.rec_metrics = nn.ModuleList(rec_metrics)
        required = set().union(*(m.get_required_inputs() for m in rec_metrics))
        self.required_inputs: list[str] | None = sorted(required) or None

    def __len__(self) -> int:
        return len(self.rec_metrics)

    def __getitem__(self, index: int) -> nn.Module:
        return self._metrics[index]

    @property
    def _metrics(self) -> list[RecMetric]:
        """``rec_metrics``, typed (as `RecMetric._computations`)."""
        return cast("list[RecMetric]", list(self.rec_metrics))

    def get_required_inputs(self) -> list[str] | None:
        return self.required_inputs

    def update(self, *, predictions: RecModelOutput, labels: RecModelOutput,
               weights: RecModelOutput | None, **kwargs: Any) -> None:  # fmt: skip
        for metric in self._metrics:
            metric.update(predictions=predictions, labels=labels, weights=weights, **kwargs)

    def compute(self) -> dict[str, torch.Tensor]:
        return {k: v for metric in self._metrics for k, v in metric.compute().items()}

    def local_compute(self) -> dict[str, torch.Tensor]:
        return {k: v for metric in self._metrics for k, v in metric.local_compute().items()}

    def sync(self) -> None:
        for metric in self._metrics:
            metric.sync()

    def unsync(self) -> None:
        for metric in self._metrics:
            metric.unsync()

    def reset(self) -> None:
        for metric in self._metrics:
            metric.reset()
