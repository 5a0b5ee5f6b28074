"""`ThroughputMeter`: samples per second over all ranks, after a warm-up."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from shardkit.metrics._ranks import Group, gather_rows

__all__ = ["ThroughputMeter"]


class ThroughputMeter:
    """Samples per second, not counting the first ``warmup_steps`` steps (compilation, caches,
    allocator growth make them slow and unrepresentative).

    Call ``step(n)`` after every training step with the samples this rank processed in it. The
    measured window starts when the ``warmup_steps``-th step ends (at construction or ``reset()``
    when ``warmup_steps`` is 0) and ends at the latest ``step``. Timing is host wall-clock: on a
    GPU, call it after something that waits for the step (e.g. ``loss.item()``)::

        meter = ThroughputMeter(warmup_steps=5)
        for batch in it:
            loss = train_step(batch)
            meter.step(batch.batch_size)
        meter.compute()  # {"samples_per_s": ..., "samples_per_s_per_rank": ..., ...}

    Args:
        warmup_steps: steps left out of the measurement, >= 0.
        group: the ranks to combine in ``compute()`` (default: the world, when a process group
            is up).
        clock: seconds as a float (default ``time.perf_counter``; tests pass a fake one).
    """

    def __init__(
        self,
        *,
        warmup_steps: int = 10,
        group: Group = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(
                f"ThroughputMeter: warmup_steps must be an int >= 0, got {warmup_steps!r}"
            )
        self.warmup_steps = warmup_steps
        self.group = group
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Start over, warm-up included."""
        self._steps = 0
        self._samples = 0
        self._start: float | None = self._clock() if self.warmup_steps == 0 else None
        self._end: float | None = None

    def step(self, num_samples: int) -> None:
        """One step ended, in which this rank processed ``num_samples`` samples."""
        if num_samples < 0:
            raise ValueError(f"ThroughputMeter.step: num_samples must be >= 0, got {num_samples}")
        now = self._clock()
        self._steps += 1
        if self._steps <= self.warmup_steps:
            if self._steps == self.warmup_steps:
                self._start = now
            return
        self._samples += num_samples
        self._end = now

    def compute(self) -> dict[str, float]:
        """``samples_per_s`` (all ranks' samples over the longest rank's window),
        ``samples_per_s_per_rank`` (that divided by the number of ranks), ``measured_steps``
        and ``elapsed_s`` (the longest window); rates are ``nan`` before a step past the
        warm-up. A collective when a process group is up: every rank must call it."""
        measured = max(self._steps - self.warmup_steps, 0)
        elapsed = (
            (self._end - self._start) if self._end is not None and self._start is not None else 0.0
        )
        local = torch.tensor(
            [[float(self._samples), elapsed, float(measured)]], dtype=torch.float64
        )
        rows = gather_rows(local, self.group)  # [ranks, 3]
        samples, longest = rows[:, 0].sum().item(), rows[:, 1].max().item()
        rate = samples / longest if longest > 0 else math.nan
        return {
            "samples_per_s": rate,
            "samples_per_s_per_rank": rate / rows.size(0),
            "measured_steps": int(rows[:, 2].min().item()),
            "elapsed_s": longest,
        }
