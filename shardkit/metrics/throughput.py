"""Examples per second over all ranks (``torchrec.metrics.throughput``), TorchRec's way: each
``update()`` is one step of ``batch_size * world_size`` examples; the first ``warmup_steps`` steps
are not timed; ``lifetime`` throughput counts every timed step, ``window`` those of the last
``window_seconds``. Nothing is communicated (every rank assumes the same batch size). shardkit's own
meter, which measures examples each rank really saw, is `shardkit.metrics.ThroughputMeter`.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque

import torch
from torch import nn

from shardkit.metrics.metrics_config import BatchSizeStage
from shardkit.metrics.metrics_namespace import (
    MetricName,
    MetricNamespace,
    MetricPrefix,
    compose_metric_key,
)

__all__ = ["MAX_WINDOW_TS", "ThroughputMetric"]

logger = logging.getLogger(__name__)

MAX_WINDOW_TS = 2 * 60 * 60  # 2 hours


def _key(name: MetricName, prefix: MetricPrefix = MetricPrefix.DEFAULT) -> str:
    ns = MetricNamespace.THROUGHPUT
    return compose_metric_key(ns, str(ns), name, prefix)


class ThroughputMetric(nn.Module):
    """Training throughput; keys ``"throughput-throughput|total_examples"``,
    ``"...|lifetime_throughput"``, ``"...|window_throughput"`` (after warm-up) and their
    ``attempt_`` twins (since this process started, not restored from a checkpoint).

    Args:
        batch_size: examples per step and rank.
        world_size: ranks.
        window_seconds: the window (1 to `MAX_WINDOW_TS`).
        warmup_steps: untimed steps at the start (>= 1).
        batch_size_stages: batch sizes that change with the step (the last with
            ``max_iters=None``).
    """

    _namespace = MetricNamespace.THROUGHPUT
    _metric_name = MetricName.THROUGHPUT
    # buffers, registered in __init__ (annotated so that mypy sees tensors, not Module attributes)
    total_examples: torch.Tensor
    warmup_examples: torch.Tensor
    time_lapse_after_warmup: torch.Tensor
    attempt_examples: torch.Tensor
    attempt_warmup_examples: torch.Tensor
    attempt_time_lapse_after_warmup: torch.Tensor

    def __init__(self, *, batch_size: int, world_size: int, window_seconds: int,
                 warmup_steps: int = 100,
                 batch_size_stages: list[BatchSizeStage] | None = None) -> None:  # fmt: skip
        super().__init__()
        if window_seconds < 1:
            raise ValueError(f"ThroughputMetric: window_seconds must be >= 1, got {window_seconds}")
        if warmup_steps < 1:
            raise ValueError(f"ThroughputMetric: warmup_steps must be >= 1, got {warmup_steps}")
        if window_seconds > MAX_WINDOW_TS:
            logger.warning("window_seconds %d capped to %d", window_seconds, MAX_WINDOW_TS)
            window_seconds = MAX_WINDOW_TS
        self._batch_size, self._world_size = batch_size, world_size
        self._window_seconds, self._warmup_steps = window_seconds, warmup_steps
        self._stages = list(batch_size_stages) if batch_size_stages else None
        self._steps = 0
        self._window: deque[float] = deque(maxlen=MAX_WINDOW_TS)
        self._window_time, self._previous_ts = 0.0, 0.0
        for name, dtype, persistent in (
            ("total_examples", torch.long, True), ("warmup_examples", torch.long, True),
            ("time_lapse_after_warmup", torch.double, True), ("attempt_examples", torch.long, False),
            ("attempt_warmup_examples", torch.long, False),
            ("attempt_time_lapse_after_warmup", torch.double, False),
        ):  # fmt: skip
            self.register_buffer(name, torch.tensor(0, dtype=dtype), persistent=persistent)

    def _batch_examples(self) -> int:
        size = self._batch_size
        if self._stages:
            for stage in self._stages:
                if stage.max_iters is None or self._steps <= stage.max_iters:
                    size = stage.batch_size
                    break
        return size * self._world_size

    def update(self) -> None:
        """One training step done."""
        now = time.monotonic()
        self._steps += 1
        examples = self._batch_examples()
        self.total_examples += examples
        self.attempt_examples += examples
        if self._steps <= self._warmup_steps:
            self.warmup_examples += examples
            self.attempt_warmup_examples += examples
            if self._steps == self._warmup_steps:
                self._previous_ts = now
            return
        lapse = now - self._previous_ts
        self.time_lapse_after_warmup += lapse
        self.attempt_time_lapse_after_warmup += lapse
        self._window.append(lapse)
        self._window_time += lapse
        while self._window_time > self._window_seconds:
            self._window_time -= self._window.popleft()
        self._previous_ts = now

    def compute(self) -> dict[str, torch.Tensor]:
        """The counts, and the throughputs once past warm-up."""
        result = {
            _key(MetricName.TOTAL_EXAMPLES): self.total_examples,
            _key(MetricName.ATTEMPT_EXAMPLES): self.attempt_examples,
        }
        lapse = float(self.time_lapse_after_warmup)
        if self._steps > self._warmup_steps and not math.isclose(lapse, 0):
            lifetime = (self.total_examples - self.warmup_examples) / self.time_lapse_after_warmup
            window = (len(self._window) * self._batch_examples() / self._window_time
                      if not math.isclose(self._window_time, 0) else 0.0)  # fmt: skip
            if not math.isclose(float(lifetime), 0):
                result[_key(self._metric_name, MetricPrefix.LIFETIME)] = lifetime.detach().clone()
                result[_key(self._metric_name, MetricPrefix.WINDOW)] = torch.tensor(
                    window, dtype=torch.double
                )
            attempt_lapse = self.attempt_time_lapse_after_warmup
            if not math.isclose(float(attempt_lapse), 0):
                attempt = (self.attempt_examples - self.attempt_warmup_examples) / attempt_lapse
                result[_key(self._metric_name, MetricPrefix.ATTEMPT)] = attempt.detach().clone()
        if self._stages:
            result[_key(MetricName.BATCH_SIZE)] = torch.tensor(
                self._batch_examples() // self._world_size, dtype=torch.int32
            )
        return result
