"""What `Topology` reads from the machine when it is not told: the memory a rank may use.

Host memory is the smaller of the physical memory and the container's limit (cgroup v2
``memory.max`` or v1 ``memory.limit_in_bytes``): a container on a 512 GiB host may own 16 GiB.
GPU memory is the total memory of the current CUDA device. Each returns None when it cannot
tell (no GPU; an OS without ``sysconf``), and `Topology` falls back to TorchRec's constants.
Tests replace these two functions (``monkeypatch.setattr``) to plan for any machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["gpu_memory", "host_memory"]

_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)
# cgroup v1 writes "no limit" as a huge page-aligned number; anything above this is no limit.
_NO_LIMIT = 1 << 60


def host_memory() -> int | None:
    """Bytes of memory this machine (or its container) has, or None if the OS does not say."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    if physical <= 0:
        return None
    return min([physical, *_cgroup_limits()])


def _cgroup_limits() -> list[int]:
    limits = []
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < _NO_LIMIT:
            limits.append(int(text))
    return limits


def gpu_memory() -> int | None:
    """Bytes of memory of the current CUDA device, or None without one (this initialises CUDA
    in the calling process)."""
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
