"""``shardkit export --format pt2``: the trained Adult DLRM as a `torch.export` program (and an
AOTInductor package) that examples/serve_pt2.py serves in a process where shardkit cannot be
imported, with the eager model's logits; INT8 tables too."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from shardkit.checkpoint import export_checkpoint
from shardkit.train import model_from_state_dict
from tests.modules import pt2_models
from tests.scripts import ROOT, run_script

SERVE = ROOT / "examples" / "serve_pt2.py"
# runs the example with every shardkit import refused: the program must need torch alone
WITHOUT_SHARDKIT = (
    "import runpy, sys; sys.modules['shardkit'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _batch(keys: list[str], rows: list[int], num_dense: int, path: Path) -> dict:
    g = torch.Generator().manual_seed(3)
    batch = 5
    lengths = torch.randint(0, 3, (len(keys) * batch,), generator=g)
    per_key = lengths.view(len(keys), batch).sum(1).tolist()
    values = torch.cat([torch.randint(0, r, (n,), generator=g) for r, n in zip(rows, per_key)])
    inputs = {"dense": torch.randn(batch, num_dense, generator=g), "values": values,
              "lengths": lengths}  # fmt: skip
    torch.save(inputs, path)
    return inputs


def _eager_logits(run: Path, tmp_path: Path, inputs: dict, quantize: bool) -> torch.Tensor:
    from shardkit import KeyedJaggedTensor
    from shardkit.inference import quantize_embeddings

    model, keys = model_from_state_dict(export_checkpoint(run, tmp_path / "float.pt"))
    dlrm = model.model.eval()
    if quantize:
        dlrm = quantize_embeddings(dlrm, dtype=torch.qint8, inplace=True)
    kjt = KeyedJaggedTensor(keys, inputs["values"], lengths=inputs["lengths"])
    with torch.no_grad():
        return dlrm(inputs["dense"], kjt)


def _serve_args(path: Path, batch: Path, out: Path, *extra: str) -> list:
    return [sys.executable, "-c", WITHOUT_SHARDKIT, SERVE, str(path), "--batch", str(batch),
            "--out", str(out), "--repeat", "2", *extra]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("quantize", [None, pytest.param("int8", marks=pytest.mark.pt2_grid)])
def test_pt2_export_serves_without_shardkit(adult_run, shardkit_here, tmp_path, quantize):
    """Float tables (INT8 in the pt2_grid tier), the program served in a fresh process."""
    run = adult_run.checkpoint_dir
    extra = ["--quantize", quantize] if quantize else []
    path = tmp_path / "model.pt2"
    code, said, err = shardkit_here("export", run, path, "--format", "pt2", *extra)
    assert code == 0, err
    match = re.search(r"inputs dense \[B, (\d+)\], values \[n\], lengths \[(\d+) \* B\] "
                      r"\(keys (\[.*\])\), output logits \[B, 1\]", said)  # fmt: skip
    assert match, said
    model, keys = model_from_state_dict(export_checkpoint(run, tmp_path / "f.pt"))
    rows = [c.num_embeddings for c in model.model.sparse_arch.embedding_bag_collection.embedding_bag_configs()]  # fmt: skip
    inputs = _batch(keys, rows, int(match.group(1)), tmp_path / "batch.pt")
    out = run_script(*_serve_args(path, tmp_path / "batch.pt", tmp_path / "logits.pt"))
    assert "shardkit imported: no" in out
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"),
                               _eager_logits(run, tmp_path, inputs, quantize is not None))  # fmt: skip


@pytest.mark.aoti
def test_aoti_package_serves_without_shardkit(adult_run, shardkit_here, tmp_path):
    run = adult_run.checkpoint_dir
    code, said, err = shardkit_here("export", run, tmp_path / "model.pt2", "--format", "pt2",
                                    "--aoti")  # fmt: skip
    assert code == 0, err
    package = tmp_path / "model-aoti.pt2"
    assert package.exists(), said
    model, keys = model_from_state_dict(export_checkpoint(run, tmp_path / "f.pt"))
    rows = [c.num_embeddings for c in model.model.sparse_arch.embedding_bag_collection.embedding_bag_configs()]  # fmt: skip
    num_dense = model.model.dense_arch.model._mlp[0]._linear.in_features
    inputs = _batch(keys, rows, num_dense, tmp_path / "batch.pt")
    said = run_script(*_serve_args(package, tmp_path / "batch.pt", tmp_path / "logits.pt",
                                   "--aoti"))  # fmt: skip
    assert "shardkit imported: no" in said
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"),
                               _eager_logits(run, tmp_path, inputs, False), rtol=1e-4, atol=1e-5)  # fmt: skip


def test_aoti_needs_the_pt2_format(shardkit_here, tmp_path):
    code, _, err = shardkit_here("export", tmp_path, tmp_path / "m.pt", "--aoti")
    assert code == 2
    assert "--aoti needs --format pt2" in err


def test_a_state_dict_of_another_model_is_refused():
    with pytest.raises(ValueError, match=r"the state dict has no tables under .*; it is not the "
                       r"model of shardkit train"):  # fmt: skip
        model_from_state_dict({"layer.weight": torch.zeros(2, 2)})


def _mc_ebc() -> torch.nn.Module:
    return pt2_models.trained(pt2_models.mc_ebc(remapped=True))


def _quantized_ec() -> torch.nn.Module:
    from shardkit.inference import quantize_embeddings
    from shardkit.modules import EmbeddingCollection

    return quantize_embeddings(pt2_models.ec(), dtype=torch.quint4x2, inplace=True,
                               additional_qconfig_spec_keys=[EmbeddingCollection]).eval()  # fmt: skip


@pytest.mark.parametrize(
    ("build", "aoti"),
    [pytest.param(_mc_ebc, False, marks=pytest.mark.pt2_grid, id="mc_ebc"),
     pytest.param(_quantized_ec, False, marks=pytest.mark.pt2_grid, id="quantized_ec_int4"),
     pytest.param(_mc_ebc, True, marks=pytest.mark.aoti, id="mc_ebc_aoti")],
)  # fmt: skip
def test_a_program_of_the_ids_alone_serves_without_shardkit(tmp_path, build, aoti):
    """A managed-collision EBC (eval mode, its remapped KJT returned too; as an AOTInductor
    package in the aoti tier) and an INT4 quantized EC as programs of ``values`` and
    ``lengths`` (`export_program(..., None)`): served by the example in a process where
    shardkit cannot be imported, equal to eager."""
    from shardkit import KeyedJaggedTensor
    from shardkit.inference import aoti_package, export_program
    from shardkit.inference._pt2 import plain

    module = build()
    program = export_program(module, pt2_models.KEYS, None)
    path = tmp_path / "m.pt2"
    if aoti:
        aoti_package(program, path)
    else:
        torch.export.save(program, path)
    kjt = pt2_models.kjt(7, batch=5, rows=40 if "mc" in build.__name__ else 6)
    torch.save({"values": kjt.values(), "lengths": kjt.lengths()}, tmp_path / "batch.pt")
    extra = ["--aoti"] if aoti else []
    said = run_script(*_serve_args(path, tmp_path / "batch.pt", tmp_path / "out.pt", *extra))
    assert "shardkit imported: no" in said
    want = plain(module(KeyedJaggedTensor(pt2_models.KEYS, kjt.values(), lengths=kjt.lengths())))
    got = torch.load(tmp_path / "out.pt")
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
