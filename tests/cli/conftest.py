"""One short ``shardkit train`` run on Adult that the CLI tests share (export, import, resume,
quantized export, a corrupted checkpoint), instead of each test training its own; and the
command line run in this process, for the second and later refusals of a test whose first
goes through a fresh process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardkit.cli import main
from tests.scripts import run_script

# 2 ranks, 2 epochs of 4 steps: checkpoints at steps 4 and 8, training-loss lines at 2, 4, 6, 8
ADULT_RUN = ["--nproc", "2", "--epochs", "2", "--max-steps-per-epoch", "4", "--batch-size", "64",
             "--log-every", "2", "--no-progress"]  # fmt: skip


@dataclass(frozen=True)
class TrainedRun:
    """``checkpoint_dir`` holds the run's checkpoints; ``out`` is what ``shardkit train`` printed.
    Tests read it only: one that changes a checkpoint copies the directory first."""

    checkpoint_dir: Path
    out: str


@pytest.fixture(scope="session")
def adult_run(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    cwd = tmp_path_factory.mktemp("adult")
    run = cwd / "run"
    out = run_script("-m", "shardkit", "train", *ADULT_RUN, "--checkpoint-dir", run, cwd=cwd)
    return TrainedRun(run, out)


@pytest.fixture
def shardkit_here(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Callable[..., tuple[int, str, str]]:
    """``shardkit_here(*args)`` -> (exit status, stdout, stderr) of ``shardkit *args`` run by
    `shardkit.cli.main` in this process, in the test's ``tmp_path`` (no rank processes: export,
    import, refusals before ranks start)."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str | Path) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse's refusals
            code = exit_.code if isinstance(exit_.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run
