"""Checkpoints: resharded loads put every row and its optimizer state where it belongs; a crash
mid-save leaves the previous checkpoint; bad files and other models are refused on every rank;
export/import round-trip through one unsharded file."""

from __future__ import annotations

import re

import pytest
import torch

from shardkit import EmbeddingBagCollection
from shardkit import checkpoint as ckpt
from shardkit.checkpoint import CheckpointError
from shardkit.distributed import DistributedModelParallel
from shardkit.modules import EmbeddingBagConfig
from shardkit.optim import EmbOptimType
from shardkit.planner import ShardingPlan
from shardkit.sharding import EmbeddingBagCollectionSharder
from tests.sharding.common import configs, global_batch, local_part, make_plan

FUSED = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}


def _dmp(world_size: int, kind: str, tables=None):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=tables or configs())
    plan = ShardingPlan({"": make_plan(ebc, kind, world_size, world_size)})
    sharders = [EmbeddingBagCollectionSharder(fused_params=FUSED)]
    return DistributedModelParallel(ebc, plan=plan, sharders=sharders)


def _full_view(dmp) -> dict[str, torch.Tensor]:
    """Every table and its row-wise accumulator as this rank sees them: {key: [(offsets, t)]}."""
    out = {}
    for key, value in dmp.state_dict().items():
        shards = value.local_shards() if hasattr(value, "local_shards") else None
        out[key] = (
            [(s.metadata.shard_offsets, s.tensor.clone()) for s in shards]
            if shards is not None
            else [([0, 0], value.clone())]
        )
    sharded = dmp.module
    for group in sharded._shard_groups:
        opt = group.tables.optimizer
        for k, slice_ in enumerate(group.spec.shards):
            start, end = group.tables.row_starts[k], group.tables.row_starts[k + 1]
            acc = opt.state["momentum1"][start:end].clone()
            out.setdefault(f"acc.{slice_.table}", []).append(
                ([slice_.row_start, slice_.col_start], acc)
            )
    return out


def _save(rank: int, world_size: int, root: str):
    dmp = _dmp(world_size, "row_wise")
    for step in range(3):
        kjt = global_batch(step, 2 * world_size, False)
        dmp(local_part(kjt, rank, world_size)).values().sum().backward()
    ckpt.save(root, step=3, model=dmp, extra={"epoch": 1})
    return _full_view(dmp)


def _load(rank: int, world_size: int, root: str, kind: str):
    dmp = _dmp(world_size, kind)
    extra = ckpt.load(root, model=dmp, extra={"epoch": 0})
    return extra, _full_view(dmp)


def _assemble(views: list[dict]) -> dict[str, torch.Tensor]:
    """Stitch per-rank blocks into whole tables (row-wise accumulators as [rows])."""
    whole: dict[str, torch.Tensor] = {}
    for view in views:
        for key, blocks in view.items():
            for (row, col), t in blocks:
                if key.startswith("acc."):
                    rows = whole.setdefault(key, torch.full((64,), float("nan")))
                    rows[row : row + t.shape[0]] = t
                else:
                    table = whole.setdefault(key, torch.full((64, 64), float("nan")))
                    table[row : row + t.shape[0], col : col + t.shape[1]] = t
    return whole


@pytest.mark.parametrize(
    ("world_size", "kind"), [(1, "table_wise"), (3, "table_wise"), (3, "column_wise")]
)
def test_row_wise_checkpoint_loads_resharded(run_ranks, tmp_path, world_size, kind):
    saved = _assemble(run_ranks(_save, 2, str(tmp_path)))
    loaded = run_ranks(_load, world_size, str(tmp_path), kind)
    assert all(extra == {"epoch": 1} for extra, _ in loaded)
    restored = _assemble([view for _, view in loaded])
    for key in saved:  # bit-exact; NaN marks the padding beyond each table
        torch.testing.assert_close(
            restored[key], saved[key], equal_nan=True, rtol=0, atol=0, msg=key
        )


def _crash_in_commit(rank: int, world_size: int, root: str):
    dmp = _dmp(world_size, "row_wise")
    ckpt.save(root, step=1, model=dmp)
    import shardkit.checkpoint._api as api

    original = api.commit
    api.commit = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk full"))
    try:
        if rank == 0:
            with pytest.raises(RuntimeError, match="disk full"):
                ckpt.save(root, step=2, model=dmp)
        else:
            # the other ranks wait in the final barrier until rank 0 fails and is stopped
            return "skipped"
    finally:
        api.commit = original
    return "raised"


def test_a_crash_mid_save_leaves_the_previous_checkpoint(tmp_path):
    from shardkit.launch import RankFailedError, spawn

    with pytest.raises(RankFailedError):
        spawn(_crash_in_commit, world_size=2, args=(str(tmp_path),), timeout=10)
    assert (tmp_path / "latest").read_text().strip() == "step-00000001"
    assert (tmp_path / ".tmp-step-00000002").is_dir(), "the unfinished save is left aside"
    ckpt.verify(tmp_path / "step-00000001")


def _load_expecting(rank: int, world_size: int, root: str, tables_kind: str):
    tables = configs()
    if tables_kind == "wider":
        tables = [
            EmbeddingBagConfig(
                name="t0", embedding_dim=8, num_embeddings=11, feature_names=["a", "b"]
            ),
            *tables[1:],
        ]
    dmp = _dmp(world_size, "row_wise", tables)
    with pytest.raises(CheckpointError) as info:
        ckpt.load(root, model=dmp)
    return str(info.value)


def _save_plain(rank: int, world_size: int, root: str):
    ckpt.save(root, step=5, model=_dmp(world_size, "row_wise"))


@pytest.mark.parametrize(
    ("damage", "pattern"),
    [
        ("truncate", r"file __1_0.distcp has \d+ bytes, the manifest says \d+: it is truncated"),
        ("flip", r"file __0_0.distcp is corrupted \(SHA-256 differs from the manifest\)"),
        ("manifest", r"has no shardkit.json: it is not a shardkit checkpoint"),
        (
            "wider",
            r"'model.embedding_bags.t0.weight' has shape \[11, 4\] in the checkpoint but \[11, 8\] in the model",
        ),
    ],
)
def test_bad_checkpoints_are_refused_on_every_rank(run_ranks, tmp_path, damage, pattern):
    run_ranks(_save_plain, 2, str(tmp_path))
    directory = tmp_path / "step-00000005"
    if damage == "truncate":
        data = (directory / "__1_0.distcp").read_bytes()
        (directory / "__1_0.distcp").write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data = bytearray((directory / "__0_0.distcp").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (directory / "__0_0.distcp").write_bytes(bytes(data))
    elif damage == "manifest":
        (directory / "shardkit.json").unlink()
    messages = run_ranks(_load_expecting, 2, str(tmp_path), damage)
    for message in messages:
        assert re.search(pattern, message), message


def _train_and_export(rank: int, world_size: int, root: str):
    dmp = _dmp(world_size, "column_wise")
    kjt = global_batch(0, 2 * world_size, False)
    dmp(local_part(kjt, rank, world_size)).values().sum().backward()
    ckpt.save(root, step=1, model=dmp)
    return dmp(local_part(kjt, rank, world_size)).values().detach()


def test_export_gives_a_plain_model_and_import_gives_a_checkpoint(run_ranks, tmp_path):
    outputs = run_ranks(_train_and_export, 2, str(tmp_path / "run"))
    state = ckpt.export_checkpoint(tmp_path / "run", tmp_path / "model.pt")
    plain = EmbeddingBagCollection(tables=configs())
    plain.load_state_dict(torch.load(tmp_path / "model.pt"))
    kjt = global_batch(0, 4, False)
    torch.testing.assert_close(plain(kjt).values(), torch.cat(outputs))
    assert set(state) == {f"embedding_bags.t{i}.weight" for i in range(4)}
    ckpt.import_checkpoint(tmp_path / "model.pt", tmp_path / "imported")
    loaded = run_ranks(_load_imported, 3, str(tmp_path / "imported"))
    torch.testing.assert_close(torch.cat(loaded), plain(global_batch(0, 6, False)).values())


def _load_imported(rank: int, world_size: int, root: str):
    dmp = _dmp(world_size, "table_wise")
    ckpt.load(root, model=dmp)
    return (
        dmp(local_part(global_batch(0, 2 * world_size, False), rank, world_size)).values().detach()
    )


# ---- FSDP models ------------------------------------------------------------------------------


def _fsdp(face: str, seed: int):
    from tests.fsdp.sharded import model_and_optimizer

    return model_and_optimizer(face, seed=seed)


def _fsdp_save(rank: int, world_size: int, root: str, face: str):
    from tests.fsdp.models import batches, train
    from tests.fsdp.sharded import full_state

    model, optimizer = _fsdp(face, seed=0)
    train(model, optimizer, batches(world_size), rank, world_size)
    ckpt.save(root, step=1, model=model, optimizer=optimizer, extra={"epoch": 1})
    return full_state(model)


def _fsdp_resume(rank: int, world_size: int, root: str, face: str):
    from tests.fsdp.models import batches, train
    from tests.fsdp.sharded import full_state

    model, optimizer = _fsdp(face, seed=7)
    extra = ckpt.load(root, model=model, optimizer=optimizer, extra={"epoch": 0})
    loaded = full_state(model)
    train(model, optimizer, batches(world_size, steps=2, seed=5), rank, world_size)
    return extra, loaded, full_state(model)


@pytest.mark.parametrize(("face", "load_ws"), [("wrapper", 3), ("fully_shard", 1)])
def test_fsdp_checkpoint_resumes_on_another_world_size(run_ranks, tmp_path, face, load_ws):
    """Parameters and Adam's moments of an FSDP model saved on 2 ranks come back on ``load_ws``
    ranks: training on continues exactly as an unsharded model trained straight through."""
    from tests.fsdp.models import OPTIMIZERS, assert_state_equal, batches, make_model, train

    saved = run_ranks(_fsdp_save, 2, str(tmp_path), face)[0]
    reference = make_model()
    optimizer = OPTIMIZERS["adam"](reference.parameters())
    train(reference, optimizer, batches(2))
    assert_state_equal(saved, reference.state_dict())
    train(reference, optimizer, batches(load_ws, steps=2, seed=5))
    for extra, loaded, trained in run_ranks(_fsdp_resume, load_ws, str(tmp_path), face):
        assert extra == {"epoch": 1}
        assert_state_equal(loaded, saved)
        assert_state_equal(trained, reference.state_dict())


def _fsdp_sgd_groups(rank: int, world_size: int, root: str):
    """An optimizer with no tensor state (plain SGD) still has its groups saved and loaded; a
    load without an optimizer takes the model alone."""
    from tests.fsdp.sharded import model_and_optimizer

    model, _ = model_and_optimizer("fully_shard", seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    ckpt.save(root, step=1, model=model, optimizer=optimizer)
    again, _ = model_and_optimizer("fully_shard", seed=7)
    fresh = torch.optim.SGD(again.parameters(), lr=0.1)
    ckpt.load(root, model=again, optimizer=fresh)
    model_only, _ = model_and_optimizer("fully_shard", seed=7)
    ckpt.load(root, model=model_only)
    return fresh.param_groups[0]["lr"]


def test_fsdp_optimizer_without_tensor_state_keeps_its_groups(run_ranks, tmp_path):
    assert run_ranks(_fsdp_sgd_groups, 2, str(tmp_path)) == [0.001, 0.001]
