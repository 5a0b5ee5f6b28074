"""``shardkit train``, ``export`` and ``import`` as a user types them: through the console entry
point in a fresh process, with the flags the README and ``--help`` show."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardkit.cli import build_parser
from shardkit.cli._train import train_flags
from shardkit.planner import ShardingType
from shardkit.train import DataSource, TrainConfig
from shardkit.train._build import build_data, build_model
from tests.scripts import run_script

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "criteo"
QUICK = ["--epochs", "1", "--max-steps-per-epoch", "4", "--no-progress", "--batch-size", "64"]


def _shardkit(*args: str, cwd: Path) -> str:
    return run_script("-m", "shardkit", *args, cwd=cwd)


def test_help_lists_every_train_option(shardkit_here):
    code, out, _ = shardkit_here("train", "--help")  # argparse's own: the same in this process
    assert code == 0
    for flag in ("--data", "--criteo-format", "--id-mapping", "--nproc", "--sharding-type",
                 "--plan-only", "--resume", "--checkpoint-dir", "--metrics", "--model",
                 "--memory-cap", "--timeout"):  # fmt: skip
        assert flag in out
    assert "(default: None)" not in out


@pytest.mark.slow
def test_plan_only_prints_the_plan_and_stops(tmp_path):
    out = _shardkit(
        "train", "--plan-only", "--nproc", "2", "--sharding-type", "row_wise",
        "--memory-cap", "1G", cwd=tmp_path,
    )  # fmt: skip
    lines = out.splitlines()
    assert "sharding plan: 8 tables in 1 module(s) on 2 ranks" in out
    assert "memory per rank: 1 GiB ddr (given)" in lines  # --memory-cap, not the machine's
    assert "module model.sparse_arch.embedding_bag_collection" in lines
    tables = [line.split() for line in lines if line.startswith("  t_")]
    assert len(tables) == 8 and all(row[4] == "row_wise" for row in tables), tables
    assert "ParameterSharding(" not in out and "{" not in out  # never the raw repr
    assert "AUC" not in out
    assert not (tmp_path / "runs").exists()


def test_train_export_import_and_resume(adult_run, shardkit_here, tmp_path):
    """Train on Adult (the shared run: 2 ranks, 2 epochs of 4 steps), export the checkpoint to
    one file a plain model loads, import that file as a checkpoint, and resume from it."""
    run, out = adult_run.checkpoint_dir, adult_run.out
    auc = float(re.findall(r"AUC (\d\.\d+)", out)[-1])
    assert 0.5 < auc <= 1.0
    assert "checkpoint" in out and (run / "latest").exists()
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "train"] == [2, 4, 6, 8]  # --log-every 2
    assert [x["kind"] for x in lines][-1] == "validation" and abs(lines[-1]["auc"] - auc) < 1e-4

    exported = tmp_path / "model.pt"
    code, out, _ = shardkit_here("export", run, exported)  # the train went through the entry point
    assert code == 0 and "wrote" in out
    state = torch.load(exported, weights_only=True)
    config = TrainConfig(nproc=1, checkpoint_dir=run)
    plain = build_model(config, build_data(config, 0, 1)).to_empty(device="cpu")
    plain.load_state_dict(state)  # strict: every key and shape of the unsharded DLRM
    tables = [k for k in state if ".embedding_bags." in k]
    assert len(tables) == 8 and all(state[k].abs().sum() > 0 for k in tables)

    imported = tmp_path / "imported"
    assert shardkit_here("import", exported, imported)[0] == 0
    # learning rates so small that 4 more steps change nothing: the AUC is the exported model's
    resumed = _shardkit(
        "train", *QUICK, "--nproc", "1", "--checkpoint-dir", str(imported), "--resume",
        "--lr", "1e-12", "--table-lr", "1e-12", cwd=tmp_path,
    )  # fmt: skip
    assert "resumed from" in resumed
    assert abs(float(re.search(r"AUC (\d\.\d+)", resumed).group(1)) - auc) <= 2e-4


@pytest.mark.slow
def test_criteo_sample_in_its_own_layout(tmp_path):
    out = _shardkit(
        "train", "--data", "criteo", "--criteo-format", "paddlerec", "--id-mapping", "hash",
        "--data-path", str(FIXTURES / "paddlerec_dnn_criteo_sample_train.txt"),
        "--num-embeddings", "1000", "--batch-size", "8", "--epochs", "1", "--nproc", "2",
        "--no-progress", "--checkpoint-dir", str(tmp_path / "criteo"), cwd=tmp_path,
    )  # fmt: skip
    assert "AUC" in out


def test_refused_input_is_one_line_not_a_traceback(shardkit_here, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "latest").write_text("step-00000009\n")  # names a checkpoint that is gone
    for args, words in (
        (["train", "--embedding-dim", "8", "--plan-only"], "must end with the embedding dim 8"),
        (
            ["export", str(tmp_path / "missing"), str(tmp_path / "m.pt")],
            f"no checkpoint at {tmp_path / 'missing'}",
        ),
        (  # raised inside a spawned rank
            ["train", "--nproc", "1", "--resume", "--checkpoint-dir", str(broken)],
            "which is not a directory",
        ),
    ):
        # in this process: all three are refused before ranks start;
        # test_flags_are_not_abbreviated_and_a_typo_shows_the_subcommand goes through the entry
        # point
        code, _, error = shardkit_here(*args)
        assert code == 2, error
        assert words in error and "Traceback" not in error


@pytest.mark.slow
def test_the_demo_defaults(tmp_path):
    """What `make demo` runs (`shardkit train`, every default), minus the progress bar."""
    out = _shardkit("train", "--no-progress", cwd=tmp_path)
    aucs = [float(x) for x in re.findall(r"validation AUC (\d\.\d+)", out)]
    assert len(aucs) == 3 and min(aucs) > 0.88, aucs
    assert "runs/adult/step-00000228" in out and (tmp_path / "runs/adult/latest").exists()


def test_flags_are_the_config_fields():
    """Every TrainConfig field is a flag with its docstring's help; parsing the flags gives the
    config (issue 17: the flags were a hand copy of the fields)."""
    fields = dataclasses.fields(TrainConfig)
    flags = train_flags()
    assert [kw["dest"] for kw in flags.values()] == [f.name for f in fields]
    assert all(len(kw["help"]) > 10 for kw in flags.values())
    assert {"--metrics", "--no-progress", "--data-path", "--resume-from"} <= set(flags)

    def config(*argv):
        args = build_parser().parse_args(["train", *argv])
        return TrainConfig(**{f.name: getattr(args, f.name) for f in fields})

    assert config() == TrainConfig()
    assert config("--data", "table", "--data-path", "a.csv", "b", "--schema", "s.toml",
                  "--dense-arch", "32,16", "--no-progress", "--metrics", "m.jsonl",
                  "--resume-from", "12", "--sharding-type", "row_wise") == TrainConfig(
        data=DataSource.TABLE, data_path=(Path("a.csv"), Path("b")), schema=Path("s.toml"),
        dense_arch=(32, 16), progress=False, metrics_path=Path("m.jsonl"), resume_from="12",
        sharding_type=ShardingType.ROW_WISE)  # fmt: skip


def _fails(*args: str, cwd: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "shardkit", *args], cwd=cwd,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "(rank" not in result.stderr, result.stderr
    return result.stderr


def _fails_here(shardkit_here, *args: str | Path) -> str:
    """`_fails` in this process, for a test's refusals after its first (`shardkit_here`)."""
    code, out, error = shardkit_here(*args)
    assert code == 2, out + error
    assert "Traceback" not in error and "(rank" not in error, error
    return error


def test_flags_are_not_abbreviated_and_a_typo_shows_the_subcommand(shardkit_here, tmp_path):
    error = _fails("train", "--epoch", "3", cwd=tmp_path)
    assert error.startswith("usage: shardkit train ")
    assert "shardkit train: error: unrecognized arguments: --epoch 3" in error
    error = _fails_here(shardkit_here, "plan", "model.json", "--world-size", "2", "--png-file", "x")
    assert error.startswith("usage: shardkit plan ") and "--png-file x" in error


def test_missing_data_is_reported_before_ranks_start(shardkit_here, tmp_path):
    error = _fails_here(shardkit_here, "train", "--data", "criteo", "--data-path", "nowhere.txt")
    assert "shardkit train: error: nowhere.txt does not exist" in error
    assert not (tmp_path / "runs").exists()


def test_import_of_a_file_that_is_not_a_state_dict(shardkit_here, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    for name, words in (("notes.txt", "is not a state dict written by torch.save"),
                        ("list.pt", "holds a list, not a state dict (parameter names -> tensors)"),
                        ("absent.pt", "no such file")):  # fmt: skip
        error = _fails_here(shardkit_here, "import", tmp_path / name, tmp_path / "ckpt")
        assert words in error and len(error.strip().splitlines()) == 2, (
            error
        )  # + the --verbose hint
        assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_a_corrupted_latest_checkpoint_names_the_intact_one_and_resume_from_takes_it(
    adult_run, tmp_path
):
    run = tmp_path / "run"
    shutil.copytree(adult_run.checkpoint_dir, run)  # the shared run's checkpoints at 4 and 8
    quick = ["--max-steps-per-epoch", "4", "--no-progress", "--batch-size", "64", "--nproc", "2",
             "--checkpoint-dir", str(run)]  # fmt: skip
    assert sorted(p.name for p in run.glob("step-*")) == ["step-00000004", "step-00000008"]
    shard = next((run / "step-00000008").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)
    error = _fails("train", "--epochs", "3", "--resume", *quick, cwd=tmp_path)
    assert "step-00000008: file" in error and "is corrupted" in error
    assert (
        f"the newest intact checkpoint is {run / 'step-00000004'}: resume from it with --resume-from 4"
        in error
    )
    out = _shardkit("train", "--epochs", "3", "--resume-from", "4", *quick, cwd=tmp_path)
    assert f"resumed from {run / 'step-00000004'}: epoch 1, step 4" in out
    error = _fails("train", "--resume-from", "7", *quick, cwd=tmp_path)
    assert "--resume-from 7: no checkpoint at" in error and "step-00000012" in error
