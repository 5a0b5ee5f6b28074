"""``shardkit export --quantize``: a trained checkpoint written with its tables quantized, served
by a plain process (examples/serve_quantized.py) at the float model's AUC; refusals."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from shardkit.checkpoint import import_checkpoint
from tests.scripts import ROOT, run_script

SERVE = ROOT / "examples" / "serve_quantized.py"


def _shardkit(*args: str, cwd: Path) -> str:
    return run_script("-m", "shardkit", *args, cwd=cwd)


SERVING = ["--batch-size", "512", "--max-batches", "4"]


def _example():
    spec = importlib.util.spec_from_file_location("serve_quantized", SERVE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _served_auc(path: Path, quantize: str) -> float:
    """What examples/serve_quantized.py measures; in a fresh process for INT8, else here."""
    if quantize == "int8":
        out = run_script(SERVE, str(path), "--quantize", quantize, *SERVING)
        return float(re.search(r"validation AUC (\d\.\d+)", out).group(1))
    example = _example()
    return example.serve(example.parse([str(path), "--quantize", quantize, *SERVING]))["auc"]


@pytest.mark.slow
def test_quantized_export_serves_at_the_float_auc(adult_run, shardkit_here, tmp_path):
    run = adult_run.checkpoint_dir  # 2 ranks, 2 epochs of 4 steps (tests/cli/conftest.py)
    _shardkit("export", str(run), str(tmp_path / "float.pt"), cwd=tmp_path)
    float_auc = _served_auc(tmp_path / "float.pt", "none")
    assert 0.6 < float_auc < 1.0
    sizes = {}
    for quantize, dtype, tolerance in (
        ("int8", torch.uint8, 0.002), ("int4", torch.uint8, 0.01), ("fp16", torch.float16, 0.001)
    ):  # fmt: skip
        path = tmp_path / f"{quantize}.pt"
        # in this process: the float export above went through the console entry point
        code, said, _ = shardkit_here("export", run, path, "--quantize", quantize)
        assert code == 0
        assert re.search(rf"wrote 18 tensors to .*: tables {quantize} [\d.]+ MB \(float", said)
        state = torch.load(path, weights_only=True)
        tables = {k: v for k, v in state.items() if ".embedding_bags." in k}
        assert len(tables) == 8 and all(v.dtype == dtype for v in tables.values())
        assert all(v.dtype == torch.float32 for k, v in state.items() if k not in tables)
        sizes[quantize] = sum(v.numel() * v.element_size() for v in tables.values())
        assert abs(_served_auc(path, quantize) - float_auc) <= tolerance
    assert sizes["int4"] < sizes["int8"] < sizes["fp16"]


def test_int4_with_an_odd_dim_is_refused_naming_the_table(shardkit_here, tmp_path):
    state = {"model.sparse_arch.embedding_bag_collection.embedding_bags.t_age.weight": torch.randn(5, 7)}  # fmt: skip
    torch.save(state, tmp_path / "odd.pt")
    checkpoint = import_checkpoint(tmp_path / "odd.pt", tmp_path / "ck")
    out = tmp_path / "odd-int4.pt"
    code, _, error = shardkit_here("export", checkpoint, out, "--quantize", "int4")
    assert code == 2, error
    assert "table 't_age': INT4 packs 2 values a byte, so embedding_dim must be a multiple of 2 (got 7); use INT8 or FP16" in error  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "odd.pt"]  # nothing left behind
    int8 = tmp_path / "odd-int8.pt"
    assert shardkit_here("export", checkpoint, int8, "--quantize", "int8")[0] == 0
    assert torch.load(int8)[next(iter(state))].shape == (5, 7 + 8)
