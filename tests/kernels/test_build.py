"""The build cache: ranks that start at once on an empty cache build once, the others wait for
the lock and load that build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from shardkit.kernels import KernelPath, _build, use_kernel

# load_library() with the compiler replaced by a slow fake that counts its runs.
FAKE_BUILD = """
import sys, time
import torch
from shardkit.kernels import _build

def fake_build(entry, sources, flags):
    with open(sys.argv[1], "a") as count:
        count.write("built\\n")
    time.sleep(1.0)
    entry.mkdir()
    (entry / _build.LIBRARY).write_text("not a library")
    return 1.0

_build._build = fake_build
torch.ops.load_library = lambda path: None
print(_build.load_library())
"""


def test_ranks_starting_at_once_build_once(tmp_path):
    counter = tmp_path / "builds.txt"
    env = {"SHARDKIT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FAKE_BUILD, str(counter)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for _ in range(3)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out.strip())
    assert counter.read_text() == "built\n"
    assert sorted(o.split(" ")[0] for o in outputs) == ["built", "loaded", "loaded"], outputs


def test_a_process_keeps_its_library_when_the_cache_has_another(monkeypatch, tmp_path):
    """Loading a second library would register the ``shardkit`` ops twice, and torch aborts the
    process for that (seen when a long-lived rank asked for the kernel again after the sources
    had changed): a process that has its library never builds or loads another."""
    with use_kernel("compiled"):
        pass  # loaded now, if it was not yet
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path))  # a cache without this build

    def no_build(*args):
        raise AssertionError("built a second library in a process that has one")

    monkeypatch.setattr(_build, "_build", no_build)
    with use_kernel("compiled") as path:
        assert path is KernelPath.COMPILED
    assert _build.load_library().startswith("already loaded in this process from ")


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs torch's CPU build")
def test_cuda_build_check_refuses_a_cpu_torch(capsys):
    # `make check-cuda-build` runs `python -m shardkit.kernels --cuda` in a venv with torch's
    # CUDA build; with the CPU build it fails at once and says why (no fallback to the CPU kernel).
    from shardkit.kernels.__main__ import main

    assert main(["--cuda"]) == 1
    err = capsys.readouterr().err
    assert re.search(
        r"check-cuda-build: FAILED: torch 2\.\d+\.\d+\+cpu is a CPU build: install a CUDA build",
        err,
    ), err


def _functions(obj):
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", str(obj)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    found = {}
    for body in listing.split("\n\n"):
        name = re.match(r"[0-9a-f]+ <(.*)>:", body)
        if name:
            found[name.group(1)] = body
    return found


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
def test_the_grouped_update_loops_prefetch():
    """GCC deleted every call to a prefetch helper it did not inline (a function whose only
    effect is a prefetch has none, to GCC), and the grouped update ran with no prefetch at all:
    see [Note: prefetches are inlined] in csrc/common.h. Each update loop in the built library
    must hold prefetch instructions."""
    with use_kernel("compiled"):
        pass  # loaded now, if it was not yet
    assert _build._loaded_from is not None
    loops = {  # function name -> its disassembly
        name: body
        for name, body in _functions(_build._loaded_from / _build.LIBRARY).items()
        if re.search(r"update_rows(_lanes)?<", name)
    }
    for kind in ("update_rows<", "update_rows_lanes<"):  # blocks of rows; rows in registers
        assert any(kind in name for name in loops), (
            f"no {kind[:-1]} function in the library: was it renamed? update this test"
        )
    without = sorted(name for name, body in loops.items() if "prefetch" not in body)
    assert not without, (
        f"{len(without)} of {len(loops)} update loops have no prefetch: {without[:3]}"
    )


# /proc/cpuinfo's flags lines (abridged) of a Zen 3 EPYC (this project's CI) and of a Zen 4 one.
ZEN3_FLAGS = "flags : fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 vaes vpclmulqdq"
ZEN4_FLAGS = ZEN3_FLAGS + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vnni"


def test_the_build_flags_follow_the_cpu(monkeypatch):
    """GCC tunes its Intel AVX-512 targets to 256-bit vectors and GCC 12 builds a Zen 4 as a
    Zen 3 with AVX-512 on, so -march=native alone leaves some loops at ymm on AVX-512 machines:
    a CPU with avx512f gets -mprefer-vector-width=512 as well, one without it does not. See
    [Note: AVX-512 lanes] in csrc/backward.cpp."""
    monkeypatch.setattr(_build.platform, "machine", lambda: "x86_64")
    avx2 = _build._cflags(ZEN3_FLAGS)
    avx512 = _build._cflags(ZEN4_FLAGS)
    assert "-march=native" in avx2 and "-march=native" in avx512
    assert not any(flag.startswith("-mprefer-vector-width") for flag in avx2), avx2
    assert avx512 == [*avx2, "-mprefer-vector-width=512"]
    monkeypatch.setattr(_build.platform, "machine", lambda: "aarch64")
    assert not any(flag.startswith(("-march", "-mprefer")) for flag in _build._cflags(ZEN4_FLAGS))


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("objdump") is None or shutil.which(os.environ.get("CXX", "c++")) is None,
    reason="needs a C++ compiler and binutils' objdump",
)
@pytest.mark.parametrize("march", ["skylake-avx512", "znver4"])
def test_an_avx512_build_uses_zmm_in_the_hot_loops(tmp_path, march):
    """Compile only (no AVX-512 hardware needed): the sources built with the flags `_build`
    gives an AVX-512 CPU, -march=native standing for that CPU's target, put zmm registers in the
    fp32 forward, the grouped row-wise Adagrad and SGD updates and the SGD scatter. They stayed
    at ymm on skylake-avx512 (GCC's 256-bit tuning) and in the update on every target (eight
    fp32 lanes fixed in the source): benchmarks/results/avx512_codegen_zen3_gcc12.md."""
    compiler = os.environ.get("CXX", "c++")
    probe = subprocess.run(
        [compiler, f"-march={march}", "-x", "c++", "-fsyntax-only", "-"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"{compiler} does not know -march={march}")
    flags = [f"-march={march}" if f == "-march=native" else f for f in _flags_for(ZEN4_FLAGS)]
    wanted = {
        "forward.cpp": ["forward_bags<float, long, false, 128>"],
        "backward.cpp": [
            "update_rows_lanes<(shardkit::Rule)3, false, 64>",  # row-wise Adagrad
            "update_rows_lanes<(shardkit::Rule)1, false, 64>",  # SGD, grouped
            "sgd_scatter<long, 128>",  # SGD without grouping
        ],
    }
    procs = {
        source: subprocess.Popen(
            [
                compiler,
                *flags,
                "-fPIC",
                "-c",
                str(_build.CSRC / source),
                "-o",
                str(tmp_path / f"{source}.o"),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for source in wanted
    }
    for proc in procs.values():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    without = []
    for source, names in wanted.items():
        functions = _functions(tmp_path / f"{source}.o")
        for name in names:
            bodies = [body for full, body in functions.items() if name in full]
            assert bodies, f"no {name} in {source}: was it renamed or inlined? update this test"
            if not any("%zmm" in body for body in bodies):
                without.append(name)
    assert not without, f"-march={march} {flags}: no zmm register in {without}"


def _flags_for(cpu_flags):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_build.platform, "machine", lambda: "x86_64")
        return _build._cflags(cpu_flags)
