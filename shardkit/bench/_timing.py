"""How calibrate times one rank's work: the fastest of a few repeats, in the calling thread's CPU
time where one thread runs on a CPU (`best_ms`, `best_pair`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from shardkit.bench._links import sync

__all__ = ["best_ms", "best_pair", "clock"]


def clock(device: torch.device) -> Callable[[], float]:
    """What times one rank's work: on a CPU running one intra-op thread, the calling thread's
    CPU time (the time other processes hold the core does not count, while the memory
    traffic they cause still does); else wall time."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def best_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """The fastest of ``repeats`` timed calls after a warm-up: other processes on the machine
    only ever add time, so the minimum is the machine's own speed."""
    now = clock(device)
    fn()  # warm up
    samples = []
    for _ in range(repeats):
        sync(device)
        start = now()
        fn()
        sync(device)
        samples.append((now() - start) * 1e3)
    return min(samples)


def best_pair(
    first: Callable[[], object], second: Callable[[], object], repeats: int, device: torch.device
) -> tuple[float, float]:
    """`best_ms` of two calls timed in turns, so that a busy spell of the machine falls on both
    alike rather than on one of the pair whose difference is wanted."""
    now = clock(device)
    first()
    second()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, samples[0]), (second, samples[1])):
            sync(device)
            start = now()
            fn()
            sync(device)
            out.append((now() - start) * 1e3)
    return min(samples[0]), min(samples[1])
