"""The examples run: seed 004's own program with torch.distributed.fsdp rewritten to shardkit.fsdp,
and examples/fsdp_mnist.py, on a small slice of the vendored Fashion-MNIST
(``SHARDKIT_FMNIST_LIMIT``), 2 ranks, CPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.scripts import free_port, run_script, run_scripts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str, cwd: Path, limit: int) -> str:
    env = {"SHARDKIT_FMNIST_LIMIT": str(limit), "MASTER_PORT": str(free_port())}
    return run_script(EXAMPLES / script, *args, cwd=cwd, env=env, timeout=240)


def test_seed_program_runs_on_shardkit(tmp_path):
    out = _run("seed_004_fsdp_mnist.py", "--epochs", "1", "--save-model", cwd=tmp_path, limit=256)
    assert re.search(r"Train Epoch: 1 \tLoss: \d+\.\d+", out), out
    assert re.search(r"Test set: Average loss: \d+\.\d+, Accuracy: \d+/256", out), out
    assert "FullyShardedDataParallel(\n  (_fsdp_wrapped_module): Net(" in out
    states = torch.load(tmp_path / "mnist_cnn.pt")
    assert {k: tuple(v.shape) for k, v in states.items()} == {
        "conv1.weight": (32, 1, 3, 3),
        "conv1.bias": (32,),
        "conv2.weight": (64, 32, 3, 3),
        "conv2.bias": (64,),
        "fc1.weight": (128, 9216),
        "fc1.bias": (128,),
        "fc2.weight": (10, 128),
        "fc2.bias": (10,),
    }


def _epochs(out: str) -> list[tuple[float, float]]:
    found = re.findall(
        r"epoch \d+: train loss ([\d.]+), test loss [\d.]+, accuracy \d+/\d+ \(([\d.]+)%\)", out
    )
    return [(float(loss), float(accuracy)) for loss, accuracy in found]


@pytest.mark.slow
def test_fsdp_mnist_learns_and_matches_ddp(tmp_path):
    # both runs at once (each mostly start-up; shardkit's spawn meets in a file store, no port)
    fsdp, ddp = run_scripts(
        [EXAMPLES / "fsdp_mnist.py", "--mode", "fsdp-offload", "--epochs", "2", "--save-model",
         tmp_path / "cnn.pt"],
        [EXAMPLES / "fsdp_mnist.py", "--mode", "ddp", "--epochs", "2"],
        timeout=240, cwd=tmp_path, env={"SHARDKIT_FMNIST_LIMIT": "512"},
    )  # fmt: skip
    epochs = _epochs(fsdp)
    assert len(epochs) == 2 and epochs[1][1] > epochs[0][1], fsdp  # accuracy rises
    assert epochs[1][0] < epochs[0][0]
    assert "(fc1): FullyShardedDataParallel(" in fsdp  # auto-wrap made fc1 a unit
    for rank in (0, 1):
        assert re.search(rf"rank {rank}: [\d.]+ ms/step, peak RSS \d+ MB, model state", fsdp)
    assert set(torch.load(tmp_path / "cnn.pt")) >= {"fc1.weight", "conv1.weight"}
    # same seeds, same data order, averaged gradients: the same numbers to print precision
    assert _epochs(ddp) == epochs, (ddp, fsdp)
    state = [
        float(x)
        for x in re.findall(r"model state \(params \+ grads \+ optimizer\) ([\d.]+) MB", fsdp + ddp)
    ]
    assert state[0] < 0.55 * state[-1]  # FSDP keeps about half of DDP's model state per rank


@pytest.mark.slow
def test_fsdp2_program_trains_the_same_on_torch_and_on_shardkit():
    """examples/fsdp2_titan.py, written for torch's FSDP2, run as written and after the import
    rewrite: the same losses and gradient norms, across a DCP save and reload."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fsdp2_parity.py"
    spec = importlib.util.spec_from_file_location("fsdp2_parity", path)
    parity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    report = parity.compare(nproc=2, steps=3, ckpt_at=2)
    assert [row["step"] for row in report["rows"]] == [1, 2, 3]
    assert report["max_loss_difference"] <= 1e-6, report["rows"]
    assert report["max_grad_norm_difference"] <= 1e-6, report["rows"]
    assert report["rows"][0]["torch_grad_norm"] > 1.0  # clipping scaled the gradients
