"""The programs tier's harness: which runs' figures it takes (a default-run test: no program
runs here)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.programs.harness import run_figures

_ABORT = (
    "terminate called without an active exception\n"
    "  traceback : Signal 6 (SIGABRT) received by PID 17709\n"
)


def _done(returncode: int, stderr: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(args=["torchrun"], returncode=returncode, stderr=stderr)


def test_a_peer_rank_aborting_at_exit_after_the_figures_keeps_them(tmp_path):
    out = tmp_path / "figures.json"
    out.write_text(json.dumps({"loss": [0.69]}))
    with pytest.warns(UserWarning, match="aborted at exit"):
        assert run_figures(_done(1, _ABORT), out, "torchrun p.py", peer=True) == {"loss": [0.69]}


@pytest.mark.parametrize(
    "case", ["shardkit's run", "no figures", "another failure", "abort without its message"]
)
def test_every_other_failed_run_fails(tmp_path, case):
    out = tmp_path / "figures.json"
    if case != "no figures":
        out.write_text(json.dumps({"loss": [0.69]}))
    stderr = {
        "another failure": "RuntimeError: shapes differ\n",
        "abort without its message": "  traceback : Signal 6 (SIGABRT) received by PID 1\n",
    }.get(case, _ABORT)
    with pytest.raises(AssertionError, match="exit 1"):
        run_figures(_done(1, stderr), out, "run p.py", peer=case != "shardkit's run")
