"""How a train pipeline schedules its work: the GPU side streams, and whether the next batch's
input dist overlaps the step at all.

[Note: when the pipeline overlaps]
Overlap only pays when the ids can travel while the step computes: on a GPU (NCCL runs beside
the kernels), or on CPU when each rank has a core its compute threads leave free for gloo's
transfer. Two single-threaded ranks on two cores have none: gloo's work lands on the core the
other rank computes on, and starting the next batch's input dist early only adds a second
synchronisation point per step (measured slower than the plain loop, `bench_dmp.py`). There the
pipeline runs synchronously: each batch's input dist starts in its own step, just before its
forward (the collectives of a plain loop, measured at its cost). `choose_overlap` decides
once, at construction, with one INFO line; ``overlap=`` forces it. The ranks then agree (one
all-reduce): if any rank runs synchronously (hosts with other core counts or CPU quotas, or
another ``overlap=``), every rank does, since the two schedules call collectives in another
order.

[Note: pipeline streams]
On a GPU the fetch runs on two side streams, as TorchRec's pipeline does: the host-to-device
copy of batch i+1 on a copy stream, then its input dist (and the agreement on data) on a
data-dist stream that waits only for that copy. So the input dist's host reads (see
[Note: host-side sizes]) wait for the copy and the ids' exchange, not for batch i's forward and
backward queued on the main stream, and the host runs ahead. Before batch i+1's forward, the
main stream waits for the data-dist stream, and every tensor made on a side stream is marked
as used by the main stream (``record_stream``) so that the caching allocator does not reuse its
memory early. A synchronous pipeline starts each input dist on the main stream, just before
the forward, after the main stream waits for the copy stream. Copies overlap compute only
from pinned host memory (``batch.pin_memory()``, or a DataLoader with ``pin_memory=True``).
On the CPU, or any other device, everything runs in order on the one stream and none of this
applies.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from shardkit import launch
from shardkit.sharding._pipeline._agreement import any_rank

__all__ = ["SideStreams", "agreed_overlap", "choose_overlap", "host_cores", "local_ranks"]

logger = logging.getLogger(__name__)


class SideStreams:
    """The copy and data-dist streams of a GPU pipeline. See [Note: pipeline streams]."""

    def __init__(self, device: torch.device) -> None:
        self.copy = torch.cuda.Stream(device=device)
        self.dist = torch.cuda.Stream(device=device)
        self.device = device
        self._ready: list[torch.cuda.Event] = []  # per fetched batch: its input dist is queued

    @classmethod
    def on(cls, device: torch.device | None) -> SideStreams | None:
        return cls(device) if device is not None and device.type == "cuda" else None

    @contextlib.contextmanager
    def copying(self) -> Iterator[None]:
        with torch.cuda.stream(self.copy):  # new memory only: no need to wait for the main
            yield

    @contextlib.contextmanager
    def distributing(self) -> Iterator[None]:
        self.dist.wait_stream(self.copy)
        with torch.cuda.stream(self.dist):
            yield
        ready = torch.cuda.Event()
        ready.record(self.dist)
        self._ready.append(ready)

    def wait_for_copy(self) -> None:
        """The current stream waits for the batches' copies: where a synchronous pipeline
        starts a batch's input dist on the main stream, before `hand_over`."""
        torch.cuda.current_stream(self.device).wait_stream(self.copy)

    def hand_over(self, batch: Any) -> None:
        """The main stream takes the oldest fetched batch: it waits for that batch's input dist
        (not for the newer one just started) and keeps the batch's memory alive; the
        prefetched ids are marked by `PendingInput.wait`, which runs on the main stream."""
        main = torch.cuda.current_stream(self.device)
        main.wait_event(self._ready.pop(0))
        if hasattr(batch, "record_stream"):
            batch.record_stream(main)


def choose_overlap(
    device: torch.device, *, cores: int, local_ranks: int, threads: int
) -> tuple[bool, str]:
    """Whether overlapping the input dist can help, and why (see [Note: when the pipeline
    overlaps]): on an accelerator always; on CPU when this rank's share of the host's ``cores``
    leaves at least one core beside its ``threads`` compute threads."""
    if device.type != "cpu":
        return True, f"{device.type}: collectives run beside the computation"
    share = cores // max(local_ranks, 1)
    spare = share - threads
    why = (
        f"{cores} core(s) for {local_ranks} rank(s) of {threads} thread(s): {max(spare, 0)} "
        "spare core(s) per rank for the transfer"
    )
    return spare >= 1, why


def agreed_overlap(
    overlap: bool | None, *, device: torch.device, group: dist.ProcessGroup | None
) -> bool:
    """Whether a pipeline computing on ``device`` overlaps: ``overlap``, or `choose_overlap`'s
    answer where None, then agreed by every rank of ``group`` (one all-reduce): synchronous
    where any rank would be. One INFO line (see [Note: when the pipeline overlaps])."""
    if overlap is None:
        overlap, why = choose_overlap(
            device,
            cores=host_cores(),
            local_ranks=local_ranks(group),
            threads=torch.get_num_threads(),
        )
    else:
        why = "as asked (overlap=)"
    if any_rank(not overlap, group) and overlap:  # the ranks' collectives must match
        logger.warning(
            "train pipeline: another rank runs synchronously, so this one does too "
            "(it would overlap: %s)",
            why,
        )
        overlap, why = False, "as another rank (hosts or overlap= differ)"
    logger.info(
        "train pipeline: %s (%s)",
        "next batch's input dist overlaps this step" if overlap else "synchronous",
        why,
    )
    return overlap


def host_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup CPU quota."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def local_ranks(group: dist.ProcessGroup | None) -> int:
    """Ranks on this host: the launcher's count, else the group's size (one host)."""
    if launch.is_initialized():
        return launch.current().local_world_size
    return dist.get_world_size(group) if dist.is_initialized() else 1
