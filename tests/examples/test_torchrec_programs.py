"""The programs in examples/torchrec/ import only TorchRec names; each runs unchanged on 2 CPU
ranks under ``shardkit run`` and learns what it should. After the README's import rewrite every
program's imports resolve, and one program (the DLRM, which uses the most of the API) also runs
rewritten under torchrun and prints the same numbers as unchanged (the same program on the same
seeds). Running every program both ways would cost a minute of the suite and check nothing the
import check and the one program do not."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from tests.examples.torchrec_programs import (
    results,
    rewrite,
    rewritten_command,
    run_unchanged,
    unchanged_command,
    unresolved_imports,
)
from tests.scripts import ROOT, run_scripts

pytestmark = pytest.mark.slow  # make test-slow (see tests/conftest.py OPT_IN)

PROGRAMS = ROOT / "examples" / "torchrec"


def _torchrec_only(program: str) -> Path:
    path = PROGRAMS / program
    imports = re.findall(r"^\s*(?:from|import)\s+(\w+)", path.read_text(), flags=re.MULTILINE)
    assert "shardkit" not in imports, "the program imports only TorchRec names"
    return path


def _unchanged(program: str, *args: str) -> dict[str, str]:
    return results(run_unchanged(_torchrec_only(program), *args))


def _both_ways(program: str, tmp_path: Path, *args: str) -> dict[str, str]:
    path = _torchrec_only(program)
    # both runs at once: each is mostly start-up, and a test uses one core of two
    outputs = run_scripts(
        unchanged_command(path, *args), rewritten_command(path, tmp_path, *args), cwd=ROOT
    )
    unchanged, rewritten = (results(out) for out in outputs)
    assert unchanged == rewritten, (unchanged, rewritten)
    return unchanged


@pytest.mark.parametrize("program", sorted(p.name for p in PROGRAMS.glob("*.py")))
def test_every_rewritten_import_resolves(program):
    assert unresolved_imports(rewrite((PROGRAMS / program).read_text())) == []


def test_the_import_check_finds_a_missing_name():
    source = "from torchrec.distributed import NoSuchPipeline\nimport torchrec.no_such_module\n"
    assert unresolved_imports(rewrite(source)) == [
        "shardkit.distributed.NoSuchPipeline",
        "shardkit.no_such_module",
    ]


def test_the_rewrite_maps_every_torchrec_import():
    source = (PROGRAMS / "deepfm_criteo.py").read_text()
    rewritten = rewrite(source)
    assert "torchrec" not in rewritten and "import fbgemm_gpu" not in rewritten
    assert "from shardkit.fbgemm_gpu.split_embedding_configs import EmbOptimType" in rewritten
    assert "from shardkit.distributed.model_parallel import DistributedModelParallel" in rewritten


def test_dlrm_on_random_data_trains_with_the_pipeline_and_evaluates(tmp_path):
    found = _both_ways(
        "dlrm_random_data.py", tmp_path, "--train_batches", "12", "--eval_batches", "3"
    )
    losses = [float(x) for x in found["train_losses"].split()]
    assert len(losses) == 12 and all(0 < x < 2 for x in losses)
    assert found["eval_batches"].startswith("3 eval_loss")


def _criteo_tsv(path: Path, rows: int, seed: int) -> None:
    """Kaggle-format rows whose click depends on one categorical and one dense value."""
    rng = random.Random(seed)
    lines = []
    for _ in range(rows):
        cats = [format(rng.randrange(1 << 20), "x") for _ in range(26)]
        cats[0] = format(rng.randrange(16), "x")
        ints = [str(rng.randrange(50)) if rng.random() > 0.1 else "" for _ in range(13)]
        p = 0.1 + 0.7 * (int(cats[0], 16) < 8) + 0.15 * (int(ints[0] or 0) > 25)
        lines.append("\t".join([str(int(rng.random() < p)), *ints, *cats]))
    path.write_text("\n".join(lines) + "\n")


def test_deepfm_on_local_criteo_files_learns_the_clicks(tmp_path):
    train, val = tmp_path / "train.tsv", tmp_path / "val.tsv"
    _criteo_tsv(train, 1024, seed=0)
    _criteo_tsv(val, 512, seed=1)
    found = _unchanged("deepfm_criteo.py", "--train_tsv", str(train), "--val_tsv",
                       str(val), "--epochs", "3")  # fmt: skip
    steps, auc = found["steps"].split(" val_auc ")
    assert int(steps) == 3 * 1024 // (2 * 64)
    assert float(auc) > 0.7, found


def test_two_tower_retrieval_learns_the_clusters(tmp_path):
    found = _unchanged("two_tower_retrieval.py", "--steps", "40")
    assert found["plan"] == "item_table=table_wise user_table=row_wise"
    before, after = (float(x) for x in found["recall_at_10"].split()[1::2])
    assert before < 0.5 < after, found


def test_sequence_model_over_an_embedding_collection_learns_the_clicks(tmp_path):
    found = _unchanged("sequence_model.py", "--steps", "40")
    first, last = (float(x) for x in found["steps"].split()[2::2])
    assert last < first
    assert float(found["accuracy"]) > 0.75, found


@pytest.mark.parametrize("program", sorted(p.name for p in PROGRAMS.glob("*.py")))
def test_each_program_says_how_to_run_it(program):
    text = (PROGRAMS / program).read_text()
    assert f"shardkit run --nproc-per-node 2 examples/torchrec/{program}" in text
