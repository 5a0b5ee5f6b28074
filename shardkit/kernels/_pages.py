"""2 MiB pages for the compiled kernel's tables and optimizer state: the switch, and what it did.

See [Note: huge pages for tables] in ``csrc/ops_cpu.cpp``: the compiled operators ask Linux to
back every table (and optimizer state) of 4 MiB or more with transparent huge pages the first
time they see it. ``SHARDKIT_HUGE_PAGES=0`` (read when the library loads) or
``set_huge_pages(False)`` turns that off; one INFO line at load says which and what the OS allows.
"""

from __future__ import annotations

import logging
import os
import re

import torch

__all__ = ["ENV_VAR", "apply_env", "huge_page_bytes", "set_huge_pages", "thp_mode"]

logger = logging.getLogger(__name__)

ENV_VAR = "SHARDKIT_HUGE_PAGES"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
_OFF = ("0", "off", "false", "no")
_ON = ("", "1", "on", "true", "yes")


def thp_mode() -> str:
    """The OS's transparent huge page mode (``always``, ``madvise``, ``never``), or
    ``unavailable`` where the OS has none (not Linux, or a kernel built without THP)."""
    try:
        with open(THP_ENABLED) as f:
            found = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return "unavailable"
    return found.group(1) if found else "unavailable"


def set_huge_pages(enabled: bool) -> bool:
    """Turn the huge page advice on or off for tables the compiled kernel has not seen yet.

    Args:
        enabled: False keeps the 4 KiB pages the allocator gave (e.g. to measure the difference,
            or where memory is too fragmented for the collapse to be worth its copy).

    Returns:
        Whether the advice was on before.

    Raises:
        RuntimeError: the compiled kernel is not loaded (``shardkit.kernels.kernel_path()``
            loads it where it can be built).
    """
    _require_library()
    return bool(torch.ops.shardkit.set_huge_pages(bool(enabled)))


def apply_env() -> None:
    """Apply ``SHARDKIT_HUGE_PAGES`` to the library just loaded, and log one line saying so."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value not in _OFF + _ON:
        raise ValueError(
            f"{ENV_VAR}={value!r} is neither on nor off; set it to 1 (the default) or 0"
        )
    enabled = value not in _OFF
    if not hasattr(torch.ops.shardkit, "set_huge_pages"):
        return  # (a stand-in library, as the build tests load)
    torch.ops.shardkit.set_huge_pages(enabled)
    mode = thp_mode()
    if not enabled:
        state = f"off ({ENV_VAR}={value})"
    elif mode in ("always", "madvise"):
        state = f"on (transparent huge pages: {mode}; {ENV_VAR}=0 turns them off)"
    else:
        state = f"asked for, but the OS will not give them (transparent huge pages: {mode})"
    logger.info("2 MiB pages for compiled tables and optimizer state: %s", state)


def huge_page_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s storage (all of it, for a view) that sit on huge pages now (Linux's
    ``/proc/self/smaps``; 0 elsewhere), at most the storage's size. smaps counts whole mappings, so for a tensor that
    shares a mapping (small ones, from the heap) this is an upper bound; a large table has its
    own. A diagnostic for tests and benchmarks, not a hot path."""
    storage = tensor.untyped_storage()
    start = storage.data_ptr()
    end = start + storage.nbytes()
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                mapping = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
                if mapping:
                    inside = int(mapping[1], 16) < end and int(mapping[2], 16) > start
                elif inside and line.startswith("AnonHugePages:"):
                    total += int(line.split()[1]) << 10
    except OSError:
        return 0
    return min(total, end - start)


def _require_library() -> None:
    if not hasattr(torch.ops.shardkit, "set_huge_pages"):
        raise RuntimeError(
            "the compiled kernel is not loaded, so there is no huge page advice to switch; "
            "call shardkit.kernels.kernel_path() first (it loads the kernel where it builds)"
        )
