"""NumPy is a runtime dependency (issue 14, item 9): torch's own checkpointing needs it.

Each check runs in a fresh interpreter with warnings turned into errors, so that torch's
"Failed to initialize NumPy" warning, or a `RuntimeError: Numpy is not available` from DCP,
fails the test instead of scrolling past.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

_DCP_ROUND_TRIP = """
import sys, warnings, torch
import torch.distributed.checkpoint as dcp

# DCP's own note that it saves in one process is expected here; every other warning stays an error
warnings.filterwarnings("ignore", message="torch.distributed is disabled")
import shardkit  # noqa: F401  (imported first, as a user's program does)

model = torch.nn.Linear(3, 2)
state = {"model": model.state_dict()}
dcp.save(state, checkpoint_id=sys.argv[1])
loaded = {"model": torch.nn.Linear(3, 2).state_dict()}
dcp.load(loaded, checkpoint_id=sys.argv[1])
for name, value in model.state_dict().items():
    torch.testing.assert_close(loaded["model"][name], value, rtol=0, atol=0)
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """Both checks' fresh interpreters, started at once (each is mostly the import of torch and
    shardkit); by name, with the checkpoint folder of the DCP one in ``args``."""
    checkpoint = str(tmp_path_factory.mktemp("dcp") / "ckpt")
    commands = {
        "quiet": ["import shardkit, torch; torch.zeros(2).numpy()"],
        "dcp": [_DCP_ROUND_TRIP, checkpoint],
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-W", "error", "-c", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, command in commands.items()
    }
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            results[name] = subprocess.CompletedProcess(commands[name], proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def test_numpy_is_importable_and_declared() -> None:
    import numpy

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"numpy>=' in pyproject, "numpy must be in the runtime dependencies"
    assert int(numpy.__version__.split(".")[0]) >= 1


def test_import_shardkit_is_quiet_with_warnings_as_errors(ran) -> None:
    result = ran["quiet"]
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_plain_dcp_save_and_load_work_beside_shardkit(ran) -> None:
    """The program issue 14 quotes: torch's DCP called directly, outside shardkit's own calls."""
    result = ran["dcp"]
    assert result.returncode == 0, result.stderr
    assert "numpy" not in result.stderr.lower(), result.stderr
    assert (Path(result.args[1]) / ".metadata").exists()
