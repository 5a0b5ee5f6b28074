"""glibc's heap thresholds fixed for a process training on the CPU: a step's memory stays mapped
for the next step instead of being trimmed and faulted in again ([Note: a steady heap]); left
alone where the environment or another allocator decides, or when switched off."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import pytest

from shardkit.compat import _libc
from shardkit.kernels import _heap, _pages, steady_heap

needs_glibc = pytest.mark.skipif(_heap._mallopt() is None, reason="the C library is not glibc")

# A fresh process (no torch, nothing of shardkit's but the heap's module and the C library
# loader: the pytest process's own heap is not touched) runs "steps" that
# each write and free 16 MiB, as a training step's temporaries: 8 blocks of 2 MiB with glibc's
# dynamic thresholds, then 2 blocks of 8 MiB after `steady_heap` (above the mmap threshold the
# dynamic one froze at: mmapped anew every step unless `steady_heap` raised it); it prints, for
# each, the main heap's size after a step and the median minor page faults per step.
_CHILD = r"""
import ctypes, importlib.util, json, resource, statistics, sys
# _heap's one import of ours, the C library loader, loaded alone (shardkit.compat imports torch)
spec = importlib.util.spec_from_file_location("shardkit.compat", sys.argv[2])
sys.modules["shardkit.compat"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["shardkit.compat"])
spec = importlib.util.spec_from_file_location("heap", sys.argv[1])
heap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(heap)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
info = getattr(libc, "mallinfo2", None) or libc.mallinfo
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t if info.__name__ == "mallinfo2" else ctypes.c_int)
                for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
info.restype = Info
MIB = 1 << 20

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def step(count, size):
    blocks = [libc.malloc(size) for _ in range(count)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)

def measure(count, size):
    per_step = []
    for _ in range(5):
        before = faults()
        step(count, size)
        per_step.append(faults() - before)
    return info().arena, statistics.median(per_step[1:])

libc.free(libc.malloc(4 * MIB))  # the dynamic thresholds from here: mmap 4 MiB, trim 8 MiB
dynamic = measure(8, 2 * MIB)
applied = heap.steady_heap()
print(json.dumps({"dynamic": dynamic, "applied": applied, "steady": measure(2, 8 * MIB)}))
"""


@needs_glibc
def test_a_steps_memory_stays_mapped_for_the_next_step():
    env = {k: v for k, v in os.environ.items() if k not in _heap._USER_MALLOC_VARS}
    env.pop(_heap.ENV_VAR, None)
    env.pop("LD_PRELOAD", None)
    env.pop("GLIBC_TUNABLES", None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, _heap.__file__, _libc.__file__],
        capture_output=True, text=True, timeout=60, env=env, check=True,
    )  # fmt: skip
    got = json.loads(done.stdout)
    (heap_before, faults_before), (heap_after, faults_after) = got["dynamic"], got["steady"]
    assert got["applied"] is True
    # glibc's own thresholds trim the 16 MiB a step freed: the next step maps them anew
    assert heap_before < 8 << 20
    if _pages.thp_mode() != "always":  # (else the heap may fault in 2 MiB at a time)
        assert faults_before >= 2048
    # fixed: the step's memory stays in the heap, and the next steps fault nothing in
    assert heap_after >= 16 << 20
    assert faults_after <= 16


@pytest.fixture
def fresh(monkeypatch):
    """`steady_heap` not asked yet in this process (it answers once per process)."""
    monkeypatch.setattr(_heap, "_state", None)
    for name in (*_heap._USER_MALLOC_VARS, _heap.ENV_VAR, "LD_PRELOAD", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        (_heap.ENV_VAR, "0", r"left as they are \(SHARDKIT_STEADY_HEAP=0\)"),
        ("LD_PRELOAD", "/usr/lib/libjemalloc.so.2", r"jemalloc in LD_PRELOAD allocates"),
        ("MALLOC_TRIM_THRESHOLD_", "1000000", r"sets them \(\['MALLOC_TRIM_THRESHOLD_'\]\)"),
        ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1", r"\['GLIBC_TUNABLES'\]"),
    ],
)
def test_left_alone_where_switched_off_or_decided_elsewhere(
    fresh, monkeypatch, caplog, name, value, said
):
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.INFO, logger=_heap.__name__):
        assert steady_heap() is False
        assert steady_heap() is False  # once per process: one line
    lines = [r.getMessage() for r in caplog.records if r.name == _heap.__name__]
    assert len(lines) == 1
    assert lines[0].startswith("heap: ")
    assert re.search(said, lines[0]), lines[0]


def test_env_var_that_is_neither_on_nor_off_is_refused(fresh, monkeypatch):
    monkeypatch.setenv(_heap.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=r"SHARDKIT_STEADY_HEAP='maybe' is neither on nor off"):
        steady_heap()
