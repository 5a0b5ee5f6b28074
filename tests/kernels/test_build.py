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


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
def test_the_grouped_update_loops_prefetch():
    """GCC deleted every call to a prefetch helper it did not inline (a function whose only
    effect is a prefetch has none, to GCC), and the grouped update ran with no prefetch at all:
    see [Note: prefetches are inlined] in csrc/common.h. Each update loop in the built library
    must hold prefetch instructions."""
    with use_kernel("compiled"):
        pass  # loaded now, if it was not yet
    assert _build._loaded_from is not None
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", str(_build._loaded_from / _build.LIBRARY)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    loops = {}  # function name -> its disassembly
    for body in listing.split("\n\n"):
        name = re.match(r"[0-9a-f]+ <(.*)>:", body)
        if name and re.search(r"update_rows(_lanes)?<", name.group(1)):
            loops[name.group(1)] = body
    for kind in ("update_rows<", "update_rows_lanes<"):  # blocks of rows; rows in registers
        assert any(kind in name for name in loops), (
            f"no {kind[:-1]} function in the library: was it renamed? update this test"
        )
    without = sorted(name for name, body in loops.items() if "prefetch" not in body)
    assert not without, (
        f"{len(without)} of {len(loops)} update loops have no prefetch: {without[:3]}"
    )
