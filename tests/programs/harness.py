"""Running the user programs of ``tests/programs/user/`` (issue 27) as their users run them: on
TorchRec/torch (the peers venv, ``torchrun``) and on shardkit (``shardkit run``, or the
README's import rewrite for FSDP programs, whose ``torch.distributed.fsdp`` stays torch's under
``shardkit run``), 2 ranks each. Every program writes its figures (losses, norms, outputs) as
JSON from rank 0 to the path it is given; the tests compare the two libraries' figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.compat.peers import PEERS_PYTHON
from tests.scripts import ROOT, free_port

USER = Path(__file__).with_name("user")
SHARDKIT = Path(sys.executable).with_name("shardkit")
# The README's rewrite for FSDP programs (torch.distributed.fsdp -> shardkit.fsdp).
_FSDP_REWRITE = ("torch.distributed.fsdp", "shardkit.fsdp")
_TIMEOUT = 420


def _environment() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    return env


# What torch's gloo leaves on stderr when a rank aborts on its way out under torchrun, after the
# program returned ("terminate called without an active exception", SIGABRT): a torch bug that
# hits TorchRec's runs now and then (and the benchmarks', see bench_dmp_as_written.py).
_EXIT_ABORT = ("terminate called without an active exception", "Signal 6 (SIGABRT)")


def run_figures(
    done: subprocess.CompletedProcess, out: Path, who: str, *, peer: bool = False
) -> dict[str, Any]:
    """The figures rank 0 wrote. A run must exit 0; only the peers' (TorchRec's) run may have
    a rank abort at exit after rank 0 wrote every figure: it is compared, with a warning."""
    if (
        done.returncode != 0
        and peer
        and out.exists()
        and all(m in done.stderr for m in _EXIT_ABORT)
    ):
        warnings.warn(
            f"{who}: a rank aborted at exit (torch's gloo) after the figures were written",
            stacklevel=2,
        )
        return json.loads(out.read_text())
    assert done.returncode == 0, f"{who}: exit {done.returncode}\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


def run_on_shardkit(name: str, tmp: Path, *args: str, rewrite_fsdp: bool = False) -> dict:
    """The program on shardkit, 2 ranks under ``shardkit run``; its figures."""
    program = USER / name
    if rewrite_fsdp:
        program = tmp / name
        program.write_text((USER / name).read_text().replace(*_FSDP_REWRITE))
    out = tmp / f"shardkit_{name}.json"
    done = subprocess.run(
        [str(SHARDKIT), "run", "--nproc-per-node", "2", str(program), str(out), *args],
        capture_output=True, text=True, timeout=_TIMEOUT, cwd=ROOT, env=_environment(),
    )  # fmt: skip
    return run_figures(done, out, f"shardkit run {name}")


def run_on_torchrec(name: str, tmp: Path, *args: str) -> dict:
    """The program as written, on TorchRec/torch in the peers venv (2 ranks, torchrun)."""
    if not PEERS_PYTHON.exists():
        pytest.skip(f"TorchRec comparison: no peers venv at {PEERS_PYTHON}")
    out = tmp / f"torchrec_{name}.json"
    command = [str(PEERS_PYTHON), "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port()), str(USER / name), str(out), *args]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=_TIMEOUT, cwd=tmp, env=_environment()
    )
    return run_figures(done, out, f"torchrun {name} (TorchRec)", peer=True)


def assert_figures_close(ours: dict, theirs: dict, *, rtol: float, atol: float) -> None:
    """Every figure (numbers, lists of numbers, strings) of both runs agrees."""
    import torch

    assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
    for key, value in theirs.items():
        mine = ours[key]
        if isinstance(value, str | bool) or value is None:
            assert mine == value, (key, mine, value)
            continue
        torch.testing.assert_close(
            torch.tensor(mine, dtype=torch.float64),
            torch.tensor(value, dtype=torch.float64),
            rtol=rtol,
            atol=atol,
            msg=lambda m, k=key: f"figure {k!r}: {m}",
        )
