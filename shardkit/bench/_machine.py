"""What a benchmark report says about the machine and the software it ran on.

[Note: a result names its machine]
A ratio against FBGEMM or TorchRec holds for one CPU, not for all: FBGEMM's CPU kernels are
generated for the instruction set they find (AVX-512 or AVX2), and the same step was 0.31x
FBGEMM's on a Zen 3 EPYC with AVX2 and 0.99x on a Zen 4 EPYC with AVX-512 (issue 25). So every
report under ``benchmarks/results`` records the CPU's model name, family and model, the ISA
flags that decide which kernels run, the transparent huge page mode, the cores and threads, and
FBGEMM's instruction set where FBGEMM is importable (`machine_info`); `machine_line` is the
same in one line, for the top of a report, and the README quotes ratios per machine.
"""

from __future__ import annotations

import contextlib
import os
import platform
from datetime import datetime, timezone
from typing import Any

import torch

__all__ = [
    "cache_bytes",
    "cores",
    "machine_identity",
    "machine_info",
    "machine_line",
    "memory_bytes",
]

_MIB = 1 << 20
# The flags a calibration profile records (its identity: kernels fitted on one ISA, used there).
_PROFILE_ISA = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "amx_tile")

# The ISA flags (as /proc/cpuinfo spells them) that decide which kernels run: AVX2 and FMA,
# AVX-512 and its extensions, AMX.
ISA_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
_FBGEMM_AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl")


def machine_info(*, threads: int | None = None) -> dict[str, Any]:
    """Date, host, CPU (model name, family and model, the ISA flags of `ISA_FLAGS` it has,
    transparent huge pages mode, cores, torch's threads and its CPU capability), Python, torch
    (and its CUDA), shardkit, and TorchRec/FBGEMM versions when they are importable (side-by-side
    runs) with FBGEMM's instruction set, for every report under benchmarks/results. See [Note:
    a result names its machine]. ``threads``: the threads the benchmark ran on (per rank), where
    that is not this process's torch setting (a parent that spawns the ranks)."""
    import shardkit

    cpu = _cpuinfo()
    flags = set(cpu.get("flags", "").split())
    info: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": cpu.get("model name"),
        "cpu_family": _int(cpu.get("cpu family")),
        "cpu_model_id": _int(cpu.get("model")),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "thp": _thp_mode(),
        "cpu_count": os.cpu_count(),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "shardkit": shardkit.__version__,
    }
    for name in ("torchrec", "fbgemm_gpu"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if info["fbgemm_gpu"] is not None:
        info["fbgemm_isa"] = _fbgemm_isa(flags)
    return info


def machine_line(info: dict[str, Any] | None = None, *, threads: int | None = None) -> str:
    """`machine_info` in one line, e.g. "AMD EPYC (family 25 model 1): avx2 fma, no AVX-512;
    THP madvise; 2 cores, 1 thread(s); FBGEMM avx2 (inferred from the CPU flags)"; ``threads``
    as `machine_info`'s."""
    info = info if info is not None else machine_info(threads=threads)
    model = info.get("cpu_model") or info.get("cpu") or "unknown CPU"
    if info.get("cpu_family") is not None:
        model += f" (family {info['cpu_family']} model {info['cpu_model_id']})"
    isa = info.get("isa")
    if isa is None:
        flags = "ISA flags not recorded"
    else:
        flags = " ".join(isa) or "none of " + "/".join(ISA_FLAGS)
        if not any(flag.startswith("avx512") for flag in isa):
            flags += ", no AVX-512"
    parts = [
        f"{model}: {flags}",
        f"THP {info.get('thp', 'unknown')}",
        f"{info.get('cpu_count')} cores, {info.get('threads', '?')} thread(s)",
    ]
    if info.get("fbgemm_isa"):
        parts.append(f"FBGEMM {info['fbgemm_isa']}")
    return "; ".join(parts)


def machine_identity(device: str, backend: str) -> dict[str, str]:
    """A calibration profile's identity: CPU model, family/model, ISA flags and huge-page mode
    (or the GPU's name), torch and the backend's version, cores, host and date."""
    cpu = _cpuinfo()
    info = {
        "cpu_model": cpu.get("model name") or platform.processor() or platform.machine(),
        "host": platform.node(),
        "torch": torch.__version__,
        "backend": backend,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cores": str(cores()),
    }
    if "cpu family" in cpu:
        info["cpu_family_model"] = f"family {cpu['cpu family']} model {cpu.get('model', '?')}"
    flags = set(cpu.get("flags", "").split())
    if flags:
        info["isa"] = " ".join(f for f in _PROFILE_ISA if f in flags)
    if (thp := _thp_mode()) != "unknown":
        info["transparent_huge_pages"] = thp
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = str(torch.version.cuda)
        if backend == "nccl":
            info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    return info


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cache_bytes(device: str) -> int:
    """The last-level cache: the GPU's L2, or the CPU's largest cache in sysfs (else 32 MiB)."""
    if device == "cuda" and torch.cuda.is_available():
        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 40 * _MIB))
    largest = 0
    for index in range(8):
        with contextlib.suppress(OSError, ValueError):
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
                text = f.read().strip()
            units = {"K": 1 << 10, "M": 1 << 20}
            value = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
            largest = max(largest, value)
    return largest or 32 * _MIB


def memory_bytes(device: str) -> int:
    """The device's memory (the GPU's, or the machine's RAM; 0 where unknown)."""
    if device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 0


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def _thp_mode() -> str:
    """The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled, or "unknown"."""
    with contextlib.suppress(OSError):
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
        if "[" in text:
            return text.split("[", 1)[1].split("]", 1)[0]
    return "unknown"


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _fbgemm_isa(flags: set[str]) -> str:
    """FBGEMM's CPU kernels' instruction set: AVX-512 where the CPU has AVX-512 F, BW, DQ and
    VL (FBGEMM's own test), else AVX2; ``FBGEMM_ENABLE_INSTRUCTIONS`` caps it. FBGEMM does not
    say which it chose, so this is inferred, and the line says so."""
    isa = "avx512" if all(flag in flags for flag in _FBGEMM_AVX512) else "avx2"
    cap = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS")
    if cap:
        isa = f"{isa}, capped by FBGEMM_ENABLE_INSTRUCTIONS={cap}"
    return f"{isa} (inferred from the CPU flags)"
