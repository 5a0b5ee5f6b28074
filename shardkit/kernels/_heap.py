"""glibc's heap thresholds for a process that trains step by step on the CPU.

[Note: a steady heap]
Every training step on the CPU allocates and frees the same temporaries: the ids' buffers, the
looked-up rows, activations, gradients (about 10 MiB per step and rank in
``benchmarks/dmp_as_written.py``). glibc serves blocks under its mmap threshold from the top of
its heap and, when a free leaves more than its trim threshold free at the top, hands that memory
back to the OS (``brk``); the next step then faults every page of it in again (4 KiB at a time,
0.6-0.9 ms per MiB on a Zen 3 EPYC VM). Both thresholds are dynamic: 128 KiB at first, then the
mmap threshold follows the largest mmapped block freed so far (at most 32 MiB) and the trim
threshold twice that. Whether a step's temporaries are trimmed then depends on whether some
longer-lived block happens to sit above them in the heap: an accident of allocation order. The
same program (dmp_as_written, row-wise SGD, 2 ranks) trimmed 8-12 MiB per step on one rank and
nothing on the other, and more often under `TrainPipelineSparseDist` than in a plain loop:
1,500-2,400 minor page faults per step against 2, about a tenth of the step's CPU time, and the
reason the pipeline ran slower than the plain loop doing the same work.

So a sharded model computing on the CPU (`DistributedModelParallel`, the train pipelines) fixes
both thresholds once per process (`steady_heap`): blocks under 32 MiB (glibc's largest mmap
threshold, where the dynamic one ends up once such a block was freed) come from the heap, and
the heap keeps up to 128 MiB free at its top instead of trimming it: the step's memory stays
mapped from one step to the next, as a caching allocator keeps it on a GPU. Any setting disables
glibc's dynamic thresholds, so both are set together (the trim threshold alone would leave the
mmap threshold at 128 KiB: every block above that mmapped and faulted in anew each step).
Explicit trims (``malloc_trim``, `shardkit.fsdp`'s [Note: returning memory]) still hand back
everything. A table of 4-32 MiB allocated afterwards comes from the heap rather than a fresh
mapping: where it reuses memory a step wrote already, the early advice ([Note: huge pages from
the first write] in ``_pages``) finds 4 KiB pages there and the compiled kernel's collapse does
the rest, so `DistributedModelParallel` calls `steady_heap` once its tables exist (a train
pipeline when it is built). It does nothing (and says why in its one INFO line) where the process's
allocator is not glibc's, where the environment configures glibc's malloc already
(``MALLOC_*_`` variables, ``glibc.malloc`` tunables, an allocator in ``LD_PRELOAD``), or with
``SHARDKIT_STEADY_HEAP=0``.
"""

from __future__ import annotations

import ctypes
import logging
import os

from shardkit.compat import glibc_function, load_glibc

__all__ = ["ENV_VAR", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "steady_heap"]

logger = logging.getLogger(__name__)

ENV_VAR = "SHARDKIT_STEADY_HEAP"
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
_OFF = ("0", "off", "false", "no")
_ON = ("", "1", "on", "true", "yes")
_USER_MALLOC_VARS = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_state: bool | None = None  # whether `steady_heap` set the thresholds (None: not asked yet)


def steady_heap() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (once; see [Note: a steady heap]),
    so that a training step's temporaries stay mapped from one step to the next.

    Returns:
        Whether the thresholds are set (by this call or an earlier one).

    Raises:
        ValueError: ``SHARDKIT_STEADY_HEAP`` is neither on (1, on, true, yes) nor off (0, off,
            false, no).
    """
    global _state
    if _state is None:
        _state, why = _apply()
        logger.info("heap: %s", why)
    return _state


def _apply() -> tuple[bool, str]:
    raw = os.environ.get(ENV_VAR, "")
    if raw.strip().lower() not in _OFF + _ON:
        raise ValueError(
            f"{ENV_VAR}={raw!r} is neither on nor off: it must be one of 1, on, true, yes "
            f"(the default) or 0, off, false, no; set it to 1 or 0, or unset it"
        )
    if raw.strip().lower() in _OFF:
        return False, f"glibc's thresholds left as they are ({ENV_VAR}={raw})"
    preload = os.environ.get("LD_PRELOAD", "")
    other = next((name for name in _OTHER_ALLOCATORS if name in preload), None)
    if other is not None:
        return False, f"glibc's thresholds left as they are ({other} in LD_PRELOAD allocates)"
    configured = [name for name in _USER_MALLOC_VARS if name in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        configured.append("GLIBC_TUNABLES")
    if configured:
        return False, f"glibc's thresholds left as the environment sets them ({configured})"
    mallopt = _mallopt()
    if mallopt is None:
        return False, f"not glibc's allocator ({load_glibc()[1]}): thresholds left as they are"
    if not (
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ):
        return False, "glibc refused the thresholds (mallopt returned 0): left as they are"
    return True, (
        f"glibc's mmap threshold {MMAP_THRESHOLD >> 20} MiB and trim threshold "
        f"{TRIM_THRESHOLD >> 20} MiB: a step's memory stays mapped for the next "
        f"([Note: a steady heap]; {ENV_VAR}=0 leaves them dynamic)"
    )


def _mallopt():
    """glibc's ``mallopt``, or None where the C library is not glibc (musl and others: another
    allocator with other knobs)."""
    return glibc_function("mallopt", (ctypes.c_int, ctypes.c_int))
