"""Peers tier (issue 27): user programs written from TorchRec's and torch's docs run unchanged
on TorchRec/torch and on shardkit (``shardkit run``; FSDP ones after the README's rewrite), 2
ranks each, and give the same figures: losses, norms, outputs, what they print about plans and
state dicts. The programs are in ``user/``; each says where it comes from."""

from __future__ import annotations

import json

import pytest

from tests.compat.peers import PEERS_PYTHON
from tests.programs.harness import assert_figures_close, run_on_shardkit, run_on_torchrec

# each test runs two 2-rank programs of up to _TIMEOUT (420 s) each: more than the default
# 300 s pytest timeout on a loaded machine
pytestmark = [pytest.mark.programs, pytest.mark.timeout(900)]


def _both(name: str, tmp_path, *, rewrite_fsdp: bool = False) -> tuple[dict, dict]:
    theirs = run_on_torchrec(name, tmp_path)  # skips without the peers venv
    ours = run_on_shardkit(name, tmp_path, rewrite_fsdp=rewrite_fsdp)
    return ours, theirs


def test_plan_editing(tmp_path):
    ours, theirs = _both("plan_editing.py", tmp_path)
    assert theirs["kernels"] == json.dumps(
        {"t0": "dense", "t1": "fused", "t2": "fused", "t3": "dense"}, sort_keys=True
    )
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_int8_serving_from_a_fresh_python(tmp_path):
    ours, theirs = _both("int8_serving.py", tmp_path)
    assert theirs["served_equals_in_process"] and ours["served_equals_in_process"]
    # The one difference: shardkit's state_dict keeps its own row layout (16 codes, float32
    # scale and bias: 24 bytes); TorchRec's is FBGEMM's padded row (32 bytes). The numbers are
    # the same (served outputs equal), and shardkit loads TorchRec's (docs/serving.md).
    shapes = {"theirs": [64, 32], "ours": [64, 24]}
    for who, figures in (("theirs", theirs), ("ours", ours)):
        got = json.loads(figures.pop("state_dict_shapes"))
        assert got == {f"0.embedding_bags.t{i}.weight": shapes[who] for i in range(2)}, got
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_fsdp1_transformer_with_the_documented_sharded_reload(tmp_path):
    ours, theirs = _both("fsdp1_transformer.py", tmp_path, rewrite_fsdp=True)
    assert theirs["resumed_losses"] == theirs["continued_losses"]  # torch's reload is exact
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_fsdp2_transformer_with_torchs_state_dict_api(tmp_path):
    ours, theirs = _both("fsdp2_transformer.py", tmp_path, rewrite_fsdp=True)
    assert theirs["resumed_losses"] == theirs["continued_losses"]
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_two_tower_retrieval(tmp_path):
    ours, theirs = _both("two_tower.py", tmp_path)
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_dlrm_variants_through_the_train_pipeline(tmp_path):
    ours, theirs = _both("dlrm_variants.py", tmp_path)
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_bert4rec_like_sequence_model(tmp_path):
    ours, theirs = _both("bert4rec_like.py", tmp_path)
    assert len(json.loads(theirs["state_dict_keys"])) == 16
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_plan_saved_by_the_planner_and_loaded_by_every_rank(tmp_path):
    ours, theirs = _both("plan_loading.py", tmp_path)
    # Where each table goes is the planner's choice (TorchRec's puts t0 on rank 0, shardkit's
    # on rank 1); types, kernels and shards are the same and every table has its ranks.
    for figures in (ours, theirs):
        ranks = json.loads(figures.pop("ranks"))
        assert sorted(ranks) == ["t0", "t1", "t2", "t3"] and ranks["t2"] == [0, 1], ranks
    assert json.loads(theirs["layout"])["t1"][0] == "column_wise"
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_managed_collision_row_wise_with_one_bucket_and_a_reload(tmp_path):
    ours, theirs = _both("managed_collision.py", tmp_path)
    # TorchRec's reload is not exact between evictions (the ids seen since the last eviction are
    # not in its checkpoint, and the eviction count restarts at the loaded iteration):
    # shardkit's reload does the same, figure for figure.
    assert theirs["resumed_losses"] != theirs["continued_losses"]
    assert json.loads(theirs["resident_raw_ids"])["user_table"]  # ids far beyond 16 rows
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_pipeline_detach_evaluate_checkpoint_attach_and_a_second_epoch(tmp_path):
    ours, theirs = _both("pipeline_control.py", tmp_path)
    assert len(theirs["epoch_1_losses"]) == 8 and len(theirs["epoch_2_losses"]) == 6
    assert len(ours["epoch_2_losses"]) == 6  # a new iterator after StopIteration: a new epoch
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_dcp_model_state_resharded_on_load(tmp_path):
    """The model's sharded state dict through torch.distributed.checkpoint, loaded into another
    plan (table-wise <-> row-wise); the fused optimizer starts afresh."""
    theirs = run_on_torchrec("dcp_reshard.py", tmp_path, "--model-only")
    ours = run_on_shardkit("dcp_reshard.py", tmp_path, "--model-only")
    assert theirs["saved_checksums"] == theirs["loaded_checksums"]  # DCP reshards exactly
    assert json.loads(theirs["shardings_loaded"])["t0"] == "row_wise"
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_dcp_model_and_fused_optimizer_state_resharded_on_load(tmp_path):
    ours, theirs = _both("dcp_reshard.py", tmp_path)
    assert theirs["resumed_losses"] == theirs["continued_losses"]  # model and optimizer exact
    assert_figures_close(ours, theirs, rtol=1e-5, atol=1e-6)


def _resumed_against_continued(loaded: dict, saved: dict) -> None:
    """The loading run's losses are the saving run's own continued losses, and both
    libraries saved and loaded the same keys with the same global shapes."""
    assert json.loads(saved["layout"])["optim/ebc.embedding_bags.t2.weight/t2.momentum1"] == [30]
    assert_figures_close(
        {"losses": loaded["resumed_losses"], "layout": loaded["layout"]},
        {"losses": saved["continued_losses"], "layout": saved["layout"]},
        rtol=1e-5,
        atol=1e-6,
    )


def test_dcp_checkpoint_written_by_torchrec_loads_into_shardkit(tmp_path):
    """TorchRec saves model + fused row-wise Adagrad (table-wise/row-wise plan); shardkit
    loads it under another plan and trains on as TorchRec did."""
    checkpoint = str(tmp_path / "torchrec.checkpoint")
    theirs = run_on_torchrec("dcp_across_libraries.py", tmp_path, "--save", checkpoint)
    ours = run_on_shardkit("dcp_across_libraries.py", tmp_path, "--load", checkpoint)
    _resumed_against_continued(ours, theirs)


def test_dcp_checkpoint_written_by_shardkit_loads_into_torchrec(tmp_path):
    if not PEERS_PYTHON.exists():  # before shardkit's run, which would be wasted
        pytest.skip(f"TorchRec comparison: no peers venv at {PEERS_PYTHON}")
    checkpoint = str(tmp_path / "shardkit.checkpoint")
    ours = run_on_shardkit("dcp_across_libraries.py", tmp_path, "--save", checkpoint)
    theirs = run_on_torchrec("dcp_across_libraries.py", tmp_path, "--load", checkpoint)
    _resumed_against_continued(theirs, ours)
