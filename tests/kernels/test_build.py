"""The build cache: ranks that start at once on an empty cache build once, the others wait for
the lock and load that build."""

from __future__ import annotations

import os
import subprocess
import sys

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
