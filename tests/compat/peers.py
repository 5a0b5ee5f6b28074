"""The optional tier that compares shardkit with TorchRec itself.

TorchRec runs in its own virtual environment (``~/.cache/shardkit-peers/venv``, built by
``../shared/peers/setup.sh``; another one with ``SHARDKIT_PEERS_PYTHON=/path/to/python``). A test
sends it a script and tensors; the script runs there with ``inputs`` (what the test sent) and
fills ``outputs``, which come back. Without that environment the tests skip with one line.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

PEERS_PYTHON = Path(
    os.environ.get("SHARDKIT_PEERS_PYTHON", "~/.cache/shardkit-peers/venv/bin/python")
).expanduser()

_PRELUDE = """
import logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
import torch
inputs = torch.load(sys.argv[1], weights_only=False)
outputs = {}
"""
_EPILOGUE = "\ntorch.save(outputs, sys.argv[2])\n"


def run_in_torchrec(script: str, inputs: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Run ``script`` with TorchRec; its ``outputs`` dict. Skips when TorchRec is absent.

    One process per call (importing TorchRec takes seconds): batch a test module's cases into
    one script, in a module-scoped fixture.
    """
    if not PEERS_PYTHON.exists():
        pytest.skip(f"TorchRec comparison: no peers venv at {PEERS_PYTHON}")
    source, sent, back = tmp_path / "peer.py", tmp_path / "in.pt", tmp_path / "out.pt"
    source.write_text(_PRELUDE + textwrap.dedent(script) + _EPILOGUE)
    torch.save(inputs, sent)
    done = subprocess.run(
        [str(PEERS_PYTHON), str(source), str(sent), str(back)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    if done.returncode != 0 and "No module named 'torchrec'" in done.stderr:
        pytest.skip(f"TorchRec comparison: {PEERS_PYTHON} has no torchrec")
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(back, weights_only=False)
