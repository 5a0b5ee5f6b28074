"""examples/fsdp_charlm.py: the loss goes down, the model writes, and a run stopped and resumed
from its checkpoint (under torchrun) ends with the same weights as one run straight through."""

from __future__ import annotations

import math
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.scripts import run_script, run_scripts

pytestmark = pytest.mark.slow  # make test-slow (see tests/conftest.py OPT_IN)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdp_charlm.py"
TINY = [
    "--layers", "2", "--heads", "2", "--dim", "48", "--block", "32", "--batch", "8",
    "--lr", "1e-2", "--warmup", "4", "--log-every", "4", "--eval-every", "8", "--ckpt-every", "8",
    "--val-batches", "2", "--sample-chars", "60", "--threads", "1",
]  # fmt: skip


def _run(*args: str) -> str:
    return run_script(EXAMPLE, *TINY, *args)


def _final(out: str) -> tuple[float, str]:
    loss = float(re.search(r"final validation loss (\S+)", out).group(1))
    sample = out.split("---\n")[1].rsplit("\n---", 1)[0]
    return loss, sample


def test_charlm_learns_and_resumes_bit_identically(tmp_path):
    straight = _run("--steps", "16", "--ckpt-dir", str(tmp_path / "a"))
    vocab = int(re.search(r"vocabulary of (\d+)", straight).group(1))
    losses = [float(x) for x in re.findall(r"train loss (\d+\.\d+)", straight)]
    loss, sample = _final(straight)
    assert losses[0] > losses[-1] + 0.5, losses  # from about ln(vocab) towards the unigram level
    assert loss < math.log(vocab) - 0.8, (loss, math.log(vocab))
    assert sample.startswith("It is a truth universally acknowledged") and len(sample) > 60
    assert "checkpoint written to" in straight
    assert (tmp_path / "a" / "step-00000008").is_dir()
    assert (tmp_path / "a" / "step-00000016").is_dir()

    # stopped after step 8: the straight run's step-8 checkpoint is what a run of 8 steps of the
    # same 16-step schedule writes (--ckpt-every 8), so the resumed run starts from a copy of it
    stopped = tmp_path / "b"
    shutil.copytree(tmp_path / "a" / "step-00000008", stopped / "step-00000008")
    (stopped / "latest").write_text("step-00000008\n")
    # resumed under torchrun (ranks it starts, init_from_env) rather than the example's spawn:
    # the same 2 ranks on gloo, so the same numbers; beside it, the 2-rank checkpoint on 1 rank
    torchrun = Path(sys.executable).with_name("torchrun")
    resumed, one = run_scripts(
        [torchrun, "--standalone", "--nproc-per-node=2", EXAMPLE, *TINY,
         "--steps", "8", "--total-steps", "16", "--ckpt-dir", stopped, "--resume"],
        [EXAMPLE, *TINY, "--world-size", "1", "--steps", "0", "--ckpt-dir", tmp_path / "a",
         "--resume"],
    )  # fmt: skip
    assert "at step 8" in resumed and "2 ranks" in resumed
    assert _final(resumed) == (loss, sample)  # same loss to the last bit, same text
    assert (stopped / "step-00000016").is_dir()

    # the 2-rank checkpoint on 1 rank: the same model, so the same validation loss
    assert "at step 16" in one
    assert math.isclose(_final(one)[0], loss, rel_tol=1e-5)
