"""2 MiB pages for the compiled kernel's tables and optimizer state: the switch, and what it did.

See [Note: huge pages for tables] in ``csrc/ops_cpu.cpp``: the compiled operators ask Linux to
back every table (and optimizer state) of 4 MiB or more with transparent huge pages the first
time they see it. By then a module has written (initialised) its tables, so the kernel's advice
has to collapse them (a copy, about 0.4 ms per MiB, once per table); `advise_table` asks for the
2 MiB pages when a table is allocated, before anything is written, so that its first writes fault
in huge pages and the kernel's collapse finds nothing left to copy ([Note: huge pages from the
first write]). ``SHARDKIT_HUGE_PAGES=0`` or ``set_huge_pages(False)`` turns both off; the variable
is read (and a bad value refused) wherever the switch is first consulted, before any build. One
INFO line at load says which and what the OS allows.
"""

from __future__ import annotations

import logging
import os
import re

import torch

from shardkit.compat import HUGE_PAGE_BYTES, madvise_huge_pages

__all__ = [
    "ENV_VAR",
    "MIN_BYTES",
    "advise_table",
    "apply_env",
    "huge_page_bytes",
    "huge_pages_enabled",
    "set_huge_pages",
    "thp_mode",
]

logger = logging.getLogger(__name__)

ENV_VAR = "SHARDKIT_HUGE_PAGES"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
_OFF = ("0", "off", "false", "no")
_ON = ("", "1", "on", "true", "yes")
MIN_BYTES = 2 * HUGE_PAGE_BYTES  # as the kernel's advice: smaller tables share a 2 MiB page
_switched: bool | None = None  # `set_huge_pages`'s last word (None: the environment decides)


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
    """Turn the huge page advice on or off for tables allocated (and, by the compiled kernel,
    seen) from now on; it overrides ``SHARDKIT_HUGE_PAGES``.

    Args:
        enabled: False keeps the 4 KiB pages the allocator gave (e.g. to measure the difference,
            or where memory is too fragmented for the collapse to be worth its copy).

    Returns:
        Whether the advice was on before.

    Raises:
        ValueError: the switch was still the environment's, and ``SHARDKIT_HUGE_PAGES`` is
            neither on nor off.
    """
    global _switched
    before = huge_pages_enabled()
    _switched = bool(enabled)
    if hasattr(torch.ops.shardkit, "set_huge_pages"):  # (else `apply_env` passes it on at load)
        torch.ops.shardkit.set_huge_pages(_switched)
    return before


def huge_pages_enabled() -> bool:
    """Whether tables get the advice: `set_huge_pages`'s last word, else ``SHARDKIT_HUGE_PAGES``
    (unset: on).

    Raises:
        ValueError: ``SHARDKIT_HUGE_PAGES`` is neither on (1, on, true, yes) nor off (0, off,
            false, no).
    """
    return _switched if _switched is not None else _env_enabled()


def _env_enabled() -> bool:
    raw = os.environ.get(ENV_VAR, "")
    value = raw.strip().lower()
    if value not in _OFF + _ON:
        raise ValueError(
            f"{ENV_VAR}={raw!r} is neither on nor off: it must be one of 1, on, true, yes "
            f"(the default) or 0, off, false, no; set it to 1 or 0, or unset it"
        )
    return value not in _OFF


def apply_env() -> None:
    """Pass the switch (`huge_pages_enabled`) to the library just loaded, and log one line
    saying so."""
    enabled = huge_pages_enabled()
    if not hasattr(torch.ops.shardkit, "set_huge_pages"):
        return  # (a stand-in library, as the build tests load)
    torch.ops.shardkit.set_huge_pages(enabled)
    mode = thp_mode()
    if not enabled:
        why = "set_huge_pages(False)" if _switched is not None else f"{ENV_VAR}={_env_value()}"
        state = f"off ({why})"
    elif mode in ("always", "madvise"):
        state = f"on (transparent huge pages: {mode}; {ENV_VAR}=0 turns them off)"
    else:
        state = f"asked for, but the OS will not give them (transparent huge pages: {mode})"
    logger.info("2 MiB pages for compiled tables and optimizer state: %s", state)


def _env_value() -> str:
    return os.environ.get(ENV_VAR, "").strip().lower()


# [Note: huge pages from the first write]
# A table is allocated (`shardkit.modules.stack_tables`), then initialised, then first looked
# up. Advised only at the lookup, its 4 KiB pages are already there and MADV_COLLAPSE copies
# them onto 2 MiB pages: a stall of about 0.4 ms per MiB in the first step, and only as much as
# free 2 MiB blocks allow. Advised at the allocation (MADV_HUGEPAGE on the whole 2 MiB pages
# inside the fresh mapping, which nothing has touched: glibc serves such sizes by mmap), the
# initialisation's first write to each 2 MiB page faults in a huge page, and the kernel's later
# MADV_COLLAPSE finds them mapped already and copies nothing. The same goes for the fused
# optimizer's state (`RowOptimizer`'s ``prepare`` hook) and for tables a meta-device module gets
# memory for (``to_empty``). The kernel still remembers each storage it advised (a weak
# reference), and still collapses what the early advice could not reach (a table on reused heap
# memory, or one allocated with the advice off). Unless the eager kernel was chosen, the advice
# is given before the kernel is (choosing would build it). Measured (loaded machine,
# benchmarks/results/ebc_huge_pages.md): the first step of a 1M x 64 table 10 ms instead of
# 337; where free 2 MiB blocks are scarce the initialisation pays for compaction instead.
def advise_table(tensor: torch.Tensor) -> bool:
    """Ask Linux to back ``tensor``'s storage with 2 MiB pages from its first write: call it on
    a table just allocated, before it is initialised ([Note: huge pages from the first write]).

    Args:
        tensor: a CPU tensor, e.g. a ``[rows, dim]`` table, not yet written.

    Returns:
        Whether the advice was given: not off Linux, for other devices, storages under
        `MIN_BYTES`, with the switch off, or where the OS refuses.

    Raises:
        ValueError: ``SHARDKIT_HUGE_PAGES`` is neither on nor off (see `huge_pages_enabled`).
    """
    if tensor.device.type != "cpu" or not huge_pages_enabled():
        return False
    storage = tensor.untyped_storage()
    if storage.nbytes() < MIN_BYTES:
        return False
    return madvise_huge_pages(storage.data_ptr(), storage.nbytes())


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
