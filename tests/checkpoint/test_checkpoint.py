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
from shardkit.sharding import EmbeddingBagCollectionSharder, fused_state
from shardkit.types import ShardingPlan
from tests.devices import ALL, DEVICE_TIER
from tests.fake_gpu import to_cpu
from tests.sharding.common import configs, global_batch, local_fused_state, local_part, make_plan

FUSED = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}
ADAM = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.1}
PARTIAL_ADAM = {"optimizer": EmbOptimType.PARTIAL_ROWWISE_ADAM, "learning_rate": 0.1}
SHAPES = {c.name: (c.num_embeddings, c.embedding_dim) for c in configs()}
STEPS = 3


def _dmp(world_size: int, kind: str, tables=None, fused=None, device=None):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=tables or configs())
    plan = ShardingPlan({"": make_plan(ebc, kind, world_size, world_size)})
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused or FUSED)]
    return DistributedModelParallel(ebc, device=device, plan=plan, sharders=sharders)


class _CountingAdam(torch.optim.Adam):
    """Adam that also keeps a Python int per parameter, as optimizers such as LBFGS do: state
    that is not a tensor (the checkpoint pickles it beside the tensors)."""

    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["updates"] = self.state[p].get("updates", 0) + 1
        return loss


def _dense_optimizer(dmp) -> torch.optim.Optimizer | None:
    """Adam over the data-parallel tables (the others step fused, inside backward)."""
    params = [p for name, p in dmp.named_parameters() if ".shards." not in name]
    return _CountingAdam(params, lr=0.05) if params else None


def _live(dmp, dense) -> dict[str, list[tuple[int, int, torch.Tensor]]]:
    """Everything a checkpoint must keep, as this rank holds it (copied to the CPU), read from
    the live objects (not through the checkpoint's own code): ``{key: [(row, col, block)]}`` for each table's
    weights and each optimizer state (fused or dense), and ``<table>.step`` counters."""
    out: dict[str, list] = {}
    ebc = dmp.module
    fused = ebc.fused_optimizer.state_dict()["state"] if ebc.fused_optimizer else {}
    for name, table in ebc.embedding_bags.items():
        if not hasattr(table, "shard_slices"):  # data-parallel: a replica and Adam's state
            out.setdefault(f"{name}.weight", []).append((0, 0, table.weight.detach().cpu().clone()))
            for key, value in dense.state[table.weight].items():
                value = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
                block = value.reshape(1, 1) if value.dim() == 0 else value
                out.setdefault(f"{name}.dense.{key}", []).append((0, 0, block.cpu().clone()))
            continue
        entry = fused.get(f"embedding_bags.{name}.weight")
        states = iter(local_fused_state(entry, table) if entry is not None else [])
        for k, slice_ in enumerate(table.shard_slices):
            out.setdefault(f"{name}.weight", []).append(
                (slice_.row_start, slice_.col_start, table.shards[k].detach().cpu().clone())
            )
            if entry is None or not (slice_.rows and slice_.cols):
                continue
            shard_state = next(states)
            if f"{name}.step" not in shard_state:  # TorchRec's layout of a step-free rule
                shard_state[f"{name}.step"] = fused_state(ebc)[f"{name}.step"]
            for key, value in shard_state.items():
                state = key.removeprefix(f"{name}.")
                if value.dim() == 0:  # the step counter
                    block, col = value.reshape(1, 1), 0
                elif value.dim() == 1:  # one value per row (row-wise Adagrad, partial row-wise)
                    block, col = value.unsqueeze(1), 0
                else:
                    block, col = value, slice_.col_start
                row = 0 if value.dim() == 0 else slice_.row_start
                out.setdefault(f"{name}.{state}", []).append((row, col, block.cpu().clone()))
    return out


def _assemble(views: list[dict]) -> dict[str, torch.Tensor]:
    """Stitch every rank's blocks into whole tensors; every element must be covered, and
    blocks held twice (replicas, step counters) must agree."""
    whole: dict[str, torch.Tensor] = {}
    for key in sorted({key for view in views for key in view}):
        table, state = key.split(".", 1)
        rows, cols = SHAPES[table]
        blocks = [block for view in views for _, _, block in view.get(key, [])]
        per_row = state != "weight" and all(block.shape[1] == 1 for block in blocks)
        shape = (rows, 1) if per_row else (rows, cols)  # per row: row-wise Adagrad's, ...
        if state == "step" or state.endswith((".step", ".updates")):
            shape = (1, 1)
        tensor, covered = torch.zeros(shape), torch.zeros(shape, dtype=torch.bool)
        for view in views:
            for row, col, block in view.get(key, []):
                where = (slice(row, row + block.shape[0]), slice(col, col + block.shape[1]))
                seen = covered[where]
                assert torch.equal(tensor[where][seen], block.float()[seen]), f"{key} differs"
                tensor[where], covered[where] = block.float(), True
        assert bool(covered.all()), f"{key}: no rank holds {(~covered).nonzero().tolist()}"
        whole[key] = tensor
    return whole


def _save(rank: int, world_size: int, root: str, kind: str, fused: dict, *, device=None):
    """Three steps of training on ``device`` (default CPU), then a checkpoint."""
    dmp = _dmp(world_size, kind, fused=fused, device=device)
    dense = _dense_optimizer(dmp)
    for step in range(STEPS):
        kjt = global_batch(step, 2 * world_size, False)
        dmp(local_part(kjt, rank, world_size).to(dmp.device)).values().sum().backward()
        if dense is not None:
            dense.step()
            dense.zero_grad()
    ckpt.save(root, step=STEPS, model=dmp, optimizer=dense, extra={"epoch": 1})
    return _live(dmp, dense), torch.rand(4)  # what a run that goes on draws next


def _load(rank: int, world_size: int, root: str, kind: str, fused: dict, *, device=None):
    dmp = _dmp(world_size, kind, fused=fused, device=device)
    dense = _dense_optimizer(dmp)
    torch.manual_seed(1 + rank)  # the checkpoint must bring back the saved generator state
    extra = ckpt.load(root, model=dmp, optimizer=dense, extra={"epoch": 0})
    return extra, _live(dmp, dense), torch.rand(4)


@pytest.mark.parametrize(
    ("saved_kind", "world_size", "loaded_kind", "fused"),
    [
        ("table_wise", 2, "table_wise", FUSED),  # same plan: row-wise Adagrad, bit for bit
        ("table_wise", 3, "row_wise", ADAM),
        ("row_wise", 1, "table_wise", FUSED),
        ("row_wise", 3, "column_wise", ADAM),
        ("column_wise", 3, "row_wise", ADAM),
        ("table_row_wise", 2, "column_wise", ADAM),
        ("table_column_wise", 3, "table_row_wise", ADAM),
        ("grid_shard", 2, "table_column_wise", ADAM),
        ("data_parallel", 3, "data_parallel", ADAM),
        ("mixed", 3, "mixed", ADAM),
        ("row_wise", 3, "table_wise", PARTIAL_ADAM),  # per-row momentum2 and full momentum1
    ],
)
def test_checkpoints_keep_every_weight_and_optimizer_state_across_plans(
    run_ranks, tmp_path, saved_kind, world_size, loaded_kind, fused
):
    """Saved from ``saved_kind`` on 2 ranks after 3 steps, loaded into ``loaded_kind`` on
    ``world_size`` ranks: every table's weights, every optimizer state (Adam's moments or
    row-wise Adagrad's accumulator, the dense Adam of data-parallel tables) and every step
    counter come back exactly, and so does each saved rank's random generator."""
    saves = run_ranks(_save, 2, str(tmp_path), saved_kind, fused)
    saved = _assemble([view for view, _ in saves])
    loaded = run_ranks(_load, world_size, str(tmp_path), loaded_kind, fused)
    assert all(extra == {"epoch": 1} for extra, _, _ in loaded)
    for (_, draw), (_, _, resumed) in zip(saves, loaded):  # ranks beyond the saved keep theirs
        torch.testing.assert_close(resumed, draw, rtol=0, atol=0)
    restored = _assemble([view for _, view, _ in loaded])
    assert sorted(restored) == sorted(saved)
    steps = [key for key in saved if key.endswith("step")]
    assert len(steps) == 4 and all(saved[key].item() == STEPS for key in steps), steps
    assert any(key.endswith(("momentum1", "exp_avg_sq")) for key in saved)
    for key in saved:
        assert saved[key].abs().sum() > 0, f"{key} is all zeros: the test would prove nothing"
        torch.testing.assert_close(restored[key], saved[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("device", DEVICE_TIER)
def test_checkpoint_round_trip_on_a_device(run_ranks, tmp_path, device):
    """Tables and fused optimizer state trained on a device that is not the CPU (see
    tests/devices.py) are saved from it and load bit for bit into another plan on that device
    and into another plan and world size (3 ranks) on the CPU; the tables equal the unsharded
    module trained on the CPU. (3 ranks of the device would start a pool of 3 processes for
    this test alone: the world-size change itself is the CPU tests' and the second load's.)"""
    saves = run_ranks(_save, 2, str(tmp_path), "row_wise", FUSED, device=device)
    saved = _assemble([view for view, _ in saves])
    for where, world_size in ((device, 2), ("cpu", 3)):
        loaded = run_ranks(_load, world_size, str(tmp_path), "column_wise", FUSED, device=where)
        assert all(extra == {"epoch": 1} for extra, _, _ in loaded)
        restored = _assemble([view for _, view, _ in loaded])
        assert sorted(restored) == sorted(saved)
        for key in saved:
            torch.testing.assert_close(restored[key], saved[key], rtol=0, atol=0, msg=key)
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=configs(), fused_params=FUSED)
    for step in range(STEPS):
        # the sharded tables' gradients are divided by the world size (2)
        (reference(global_batch(step, 4, False)).values().sum() / 2).backward()
    for name, table in reference.embedding_bags.items():
        torch.testing.assert_close(saved[f"{name}.weight"], table.weight.detach(), msg=name)


def _crash_in_commit(rank: int, world_size: int, root: str):
    dmp = _dmp(world_size, "row_wise")
    ckpt.save(root, step=1, model=dmp)
    import shardkit.checkpoint._api as api

    original = api.commit
    api.commit = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    try:
        with pytest.raises(CheckpointError) as info:
            ckpt.save(root, step=2, model=dmp)
        return str(info.value)
    finally:
        api.commit = original


def test_a_crash_mid_save_raises_on_every_rank_and_keeps_the_previous_checkpoint(
    tmp_path, run_ranks
):
    """Rank 0's commit fails; every rank raises why (without the broadcast the other rank
    would wait in a collective until the 60 s timeout and fail the run otherwise)."""
    for message in run_ranks(_crash_in_commit, 2, str(tmp_path)):
        assert message.startswith(
            "checkpoint of step 2 was not committed: rank 0 failed with OSError: disk full. "
            "'latest' is unchanged; the unfinished files are in "
        ), message
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


def _fsdp(face: str, seed: int, device=None):
    from tests.fsdp.sharded import model_and_optimizer

    return model_and_optimizer(face, seed=seed, device=device)


def _fsdp_save(rank: int, world_size: int, root: str, face: str, *, device=None):
    from tests.fsdp.models import batches, train
    from tests.fsdp.sharded import full_state

    model, optimizer = _fsdp(face, seed=0, device=device)
    train(model, optimizer, batches(world_size), rank, world_size, device)
    ckpt.save(root, step=1, model=model, optimizer=optimizer, extra={"epoch": 1})
    return to_cpu(full_state(model))


def _fsdp_resume(rank: int, world_size: int, root: str, face: str, *, device=None):
    from tests.fsdp.models import batches, train
    from tests.fsdp.sharded import full_state

    model, optimizer = _fsdp(face, seed=7, device=device)
    extra = ckpt.load(root, model=model, optimizer=optimizer, extra={"epoch": 0})
    loaded = to_cpu(full_state(model))
    train(model, optimizer, batches(world_size, steps=2, seed=5), rank, world_size, device)
    return extra, loaded, to_cpu(full_state(model))


@pytest.mark.parametrize("device", ALL)
@pytest.mark.parametrize(("face", "load_ws"), [("wrapper", 3), ("fully_shard", 1)])
def test_fsdp_checkpoint_resumes_on_another_world_size(run_ranks, tmp_path, face, load_ws, device):
    """Parameters and Adam's moments of an FSDP model saved on 2 ranks come back on ``load_ws``
    ranks: training on continues exactly as an unsharded model trained straight through (on
    the CPU, whatever ``device`` the FSDP model computes on)."""
    from tests.fsdp.models import OPTIMIZERS, assert_state_equal, batches, make_model, train

    saved = run_ranks(_fsdp_save, 2, str(tmp_path), face, device=device)[0]
    reference = make_model()
    optimizer = OPTIMIZERS["adam"](reference.parameters())
    train(reference, optimizer, batches(2))
    assert_state_equal(saved, reference.state_dict())
    train(reference, optimizer, batches(load_ws, steps=2, seed=5))
    resumed = run_ranks(_fsdp_resume, load_ws, str(tmp_path), face, device=device)
    for extra, loaded, trained in resumed:
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
