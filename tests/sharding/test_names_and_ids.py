"""Sharded collections with table and feature names that are nn.ModuleDict's own attribute names
(issue 14, item 3), fed int32 or int64 ids (issue 14, item 2), against the unsharded spec:
outputs, every table and Adam's state (step counters included) after training, through a
checkpoint saved in one sharding and loaded into another. Unsharded: tests/modules."""

from __future__ import annotations

import pytest
import torch

from shardkit import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from shardkit import checkpoint as ckpt
from shardkit.distributed import DistributedModelParallel
from shardkit.optim import EmbOptimType
from shardkit.sharding import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
    construct_module_sharding_plan,
)
from shardkit.types import ShardingPlan
from tests.sharding.common import generators, local_part

# (table, dim, rows, features): names add_module refuses, a feature with "." and an empty one
SPEC = [
    ("items", 4, 7, ["items", "keys"]),
    ("to", 4, 5, ["values", "a.b"]),
    ("training", 3, 6, ["forward"]),
    ("type", 4, 9, ["type", ""]),
]
FEATURES = [feature for *_, features in SPEC for feature in features]
ROWS = {feature: rows for _, _, rows, features in SPEC for feature in features}
FUSED = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.05}
B = 2  # examples per rank
WORLD = 2
STEPS = 2  # before the checkpoint; one more after it


def _module(kind: str):
    torch.manual_seed(0)
    if kind == "bag":
        tables = [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=f)
                  for n, d, r, f in SPEC]  # fmt: skip
        return EmbeddingBagCollection(tables=tables, fused_params=FUSED)
    tables = [EmbeddingConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=f)
              for n, d, r, f in SPEC]  # fmt: skip
    return EmbeddingCollection(tables=tables, fused_params=FUSED)


def _global_batch(step: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(step)
    lengths = [torch.randint(0, 3, (B * WORLD,), generator=g) for _ in FEATURES]
    values = [torch.randint(0, ROWS[f], (int(n.sum()),), generator=g) for f, n in zip(FEATURES, lengths)]  # fmt: skip
    return KeyedJaggedTensor(FEATURES, torch.cat(values), lengths=torch.cat(lengths))


def _rows(module, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
    """Feature -> its output rows: pooled ``[B, D]`` (bags) or one per id ``[N, D]``."""
    out = module(kjt)
    if isinstance(out, dict):
        return {key: jt.values() for key, jt in out.items()}
    return out.to_dict()


def _coefficients(step: int, feature: str, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + len(feature) + 7 * FEATURES.index(feature))
    return torch.rand(shape, generator=g)


def _mine(kind: str, kjt: KeyedJaggedTensor, feature: str, rank: int) -> slice:
    """This rank's part of a feature's global output rows."""
    if kind == "bag":
        return slice(rank * B, (rank + 1) * B)
    offsets = kjt[feature].offsets()
    return slice(int(offsets[rank * B]), int(offsets[(rank + 1) * B]))


def _reference(kind: str, steps: int) -> tuple[torch.nn.Module, list[dict]]:
    """The unsharded spec trained on the global batches: loss = mean over ranks of theirs."""
    module, outputs = _module(kind), []
    for step in range(steps):
        rows = _rows(module, _global_batch(step))
        outputs.append({k: v.detach().clone() for k, v in rows.items()})
        loss = sum((v * _coefficients(step, k, v.shape)).sum() for k, v in rows.items())
        (loss / WORLD).backward()
    return module, outputs


def _dmp(kind: str, sharding: str):
    module = _module(kind)
    gens = generators(sharding, WORLD, WORLD)
    plan = construct_module_sharding_plan(
        module, {name: gens[i] for i, (name, *_) in enumerate(SPEC)}, world_size=WORLD,
        local_size=WORLD, device_type="cpu",
    )  # fmt: skip
    sharder = EmbeddingBagCollectionSharder if kind == "bag" else EmbeddingCollectionSharder
    dmp = DistributedModelParallel(module, plan=ShardingPlan({"": plan}), sharders=[sharder()])
    return dmp


def _step(dmp, kind: str, step: int, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    kjt = _global_batch(step)
    local = local_part(kjt, rank, WORLD)
    local = KeyedJaggedTensor(local.keys(), local.values().to(dtype), lengths=local.lengths())
    rows = _rows(dmp, local)
    loss = 0.0
    for key, value in rows.items():
        full_shape = (kjt[key].values().numel() if kind == "seq" else B * WORLD, value.shape[1])
        mine = _mine(kind, kjt, key, rank)
        loss = loss + (value * _coefficients(step, key, full_shape)[mine]).sum()
    loss.backward()  # the tables' gradients are divided by the world size, as TorchRec's
    return {k: v.detach().clone() for k, v in rows.items()}


def _train_and_save(rank: int, world_size: int, kind, sharding, dtype, root):
    dmp = _dmp(kind, sharding)
    names = [name for name, _ in dmp.named_parameters()]
    outputs = [_step(dmp, kind, step, rank, dtype) for step in range(STEPS)]
    ckpt.save(root, step=STEPS, model=dmp)
    return names, list(dmp.state_dict()), outputs


def _load_and_step(rank: int, world_size: int, kind, sharding, dtype, root, again):
    dmp = _dmp(kind, sharding)
    ckpt.load(root, model=dmp)
    output = _step(dmp, kind, STEPS, rank, dtype)
    ckpt.save(again, step=STEPS + 1, model=dmp)
    return output


def _assert_outputs(kind, per_rank: list[dict], expected: dict, step: int) -> None:
    kjt = _global_batch(step)
    for rank, outputs in enumerate(per_rank):
        assert list(outputs) == FEATURES
        for key, value in outputs.items():
            want = expected[key][_mine(kind, kjt, key, rank)]
            torch.testing.assert_close(value, want, msg=f"step {step}, rank {rank}, {key!r}")


def _assert_tables(path, reference) -> None:
    """The exported checkpoint is the unsharded model, in TorchRec's layout, bit for bit close."""
    state = ckpt.export_checkpoint(path, path / "model.pt")
    expected = reference.state_dict()
    assert sorted(state) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(state[key], value, msg=key)


@pytest.mark.parametrize(
    ("kind", "saved_as", "loaded_as", "dtype"),
    [
        ("bag", "table_wise", "row_wise", torch.int32),
        ("bag", "row_wise", "column_wise", torch.int64),
        ("seq", "table_wise", "row_wise", torch.int64),
        ("seq", "row_wise", "table_wise", torch.int32),
    ],
)
def test_awkward_names_through_sharding_and_a_checkpoint(
    run_ranks, tmp_path, kind, saved_as, loaded_as, dtype
):
    prefix = _prefix(kind)
    saved = run_ranks(_train_and_save, WORLD, kind, saved_as, dtype, tmp_path / "a")
    reference, expected = _reference(kind, STEPS)
    for names, keys, _ in saved:
        assert sorted(keys) == sorted(f"{prefix}.{name}.weight" for name, *_ in SPEC)
        assert all(name.startswith(tuple(f"{prefix}.{t}." for t, *_ in SPEC)) for name in names)
    for step in range(STEPS):
        _assert_outputs(kind, [outputs[step] for *_, outputs in saved], expected[step], step)
    _assert_tables(tmp_path / "a", reference)

    # load into another sharding: the next step needs Adam's moments and step counters too
    resumed = run_ranks(
        _load_and_step, WORLD, kind, loaded_as, dtype, tmp_path / "a", tmp_path / "b"
    )
    reference, expected = _reference(kind, STEPS + 1)
    _assert_outputs(kind, resumed, expected[STEPS], STEPS)
    _assert_tables(tmp_path / "b", reference)


def _replicated(rank: int, world_size: int, kind: str, state: dict):
    """Every table data-parallel (a replica module inside the sharded one) and one row-wise."""
    dmp = _dmp(kind, "mixed")  # row-wise, table-wise, column-wise, data-parallel ('type')
    dmp.load_state_dict(state)
    return list(dmp.state_dict()), _rows(dmp, local_part(_global_batch(0), rank, WORLD))


@pytest.mark.parametrize("kind", ["bag", "seq"])
def test_awkward_names_in_a_replicated_table_load_and_look_up(run_ranks, kind):
    unsharded = _module(kind)
    torch.nn.init.normal_(unsharded.state_dict()[f"{_prefix(kind)}.type.weight"])
    state = {key: value.clone() for key, value in unsharded.state_dict().items()}
    expected = {k: v.detach() for k, v in _rows(unsharded, _global_batch(0)).items()}
    results = run_ranks(_replicated, WORLD, kind, state)
    for keys, _ in results:
        assert sorted(keys) == sorted(state)
    _assert_outputs(kind, [{k: v.detach() for k, v in rows.items()} for _, rows in results],
                    expected, 0)  # fmt: skip


def _prefix(kind: str) -> str:
    return "embedding_bags" if kind == "bag" else "embeddings"
