"""`ThroughputMeter` with a fake clock: warm-up excluded, ranks combined."""

from __future__ import annotations

import math

import pytest

from shardkit.metrics import ThroughputMeter


class FakeClock:
    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def test_warmup_steps_are_left_out():
    meter = ThroughputMeter(warmup_steps=2, clock=FakeClock(0.5))  # construction reads the clock
    meter.step(1000)  # t = 1.0: warm-up (slow first step: not counted)
    meter.step(10)  # t = 1.5: end of warm-up, the window starts
    assert math.isnan(meter.compute()["samples_per_s"])
    for _ in range(4):
        meter.step(10)  # t = 2.0 ... 3.5
    assert meter.compute() == {
        "samples_per_s": 40 / 2.0,
        "samples_per_s_per_rank": 20.0,
        "measured_steps": 4,
        "elapsed_s": 2.0,
    }


def test_no_warmup_starts_at_construction_and_reset():
    meter = ThroughputMeter(warmup_steps=0, clock=FakeClock(1.0))  # t = 1
    meter.step(8)  # t = 2
    assert meter.compute()["samples_per_s"] == 8.0
    meter.reset()  # t = 3
    meter.step(6)  # t = 4
    meter.step(6)  # t = 5
    assert meter.compute()["samples_per_s"] == 6.0


def test_errors():
    with pytest.raises(ValueError, match=r"warmup_steps must be an int >= 0, got -1"):
        ThroughputMeter(warmup_steps=-1)
    with pytest.raises(ValueError, match=r"num_samples must be >= 0, got -3"):
        ThroughputMeter().step(-3)


def _rank_meter(rank: int, world_size: int):
    meter = ThroughputMeter(warmup_steps=1, clock=FakeClock(1.0 + rank))  # rank r is slower
    for _ in range(5):
        meter.step(100)
    return meter.compute()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_across_ranks_total_samples_over_the_slowest_window(run_ranks, world_size):
    slowest = 4 * (1.0 + world_size - 1)  # 4 measured steps of the slowest rank
    expected = 400 * world_size / slowest
    for result in run_ranks(_rank_meter, world_size):
        assert result["samples_per_s"] == pytest.approx(expected)
        assert result["samples_per_s_per_rank"] == pytest.approx(expected / world_size)
        assert result["elapsed_s"] == slowest and result["measured_steps"] == 4
