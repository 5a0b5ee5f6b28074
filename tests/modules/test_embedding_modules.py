"""EmbeddingBagCollection / EmbeddingCollection against one nn.EmbeddingBag (or F.embedding) per
table: outputs, gradients, and every fused optimizer over several steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardkit import KeyedJaggedTensor
from shardkit.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    PoolingType,
)
from shardkit.optim import (
    LAMB,
    EmbOptimType,
    LarsSGD,
    PartialRowWiseAdam,
    PartialRowWiseLAMB,
    RowWiseAdagrad,
    apply_optimizer_in_backward,
)
from tests.modules.reference import ReferenceEBC, is_sparse_reference, reference_optimizer

B = 4


def _configs(pooling: PoolingType = PoolingType.SUM) -> list[EmbeddingBagConfig]:
    """Three tables, two dims (two batched groups), a table with two features, uneven sizes."""
    return [
        EmbeddingBagConfig(
            name="t0", embedding_dim=4, num_embeddings=11, feature_names=["a", "b"], pooling=pooling
        ),
        EmbeddingBagConfig(
            name="t1", embedding_dim=6, num_embeddings=7, feature_names=["c"], pooling=pooling
        ),
        EmbeddingBagConfig(
            name="t2",
            embedding_dim=4,
            num_embeddings=5,
            feature_names=["d"],
            pooling=PoolingType.SUM,
        ),
    ]


def _batch(seed: int, weighted: bool, keys=("a", "b", "c", "d")) -> KeyedJaggedTensor:
    """Random bags with duplicates, empty bags, and key 'c' with no ids at all in odd batches."""
    g = torch.Generator().manual_seed(seed)
    limits = {"a": 11, "b": 11, "c": 7, "d": 5}
    lengths, values = [], []
    for key in keys:
        key_lengths = torch.randint(0, 4, (B,), generator=g)
        if key == "c" and seed % 2:
            key_lengths.zero_()
        lengths.append(key_lengths)
        values.append(torch.randint(0, limits[key], (int(key_lengths.sum()),), generator=g))
    values = torch.cat(values)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor(
        keys=list(keys), values=values, lengths=torch.cat(lengths), weights=weights
    )


def _weights(ebc) -> dict[str, torch.Tensor]:
    return {name: table.weight.detach().clone() for name, table in ebc.embedding_bags.items()}


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_and_gradients_match_reference(pooling, weighted):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=_configs(pooling), is_weighted=weighted)
    reference = ReferenceEBC(_configs(pooling), _weights(ebc), sparse=False)
    kjt = _batch(1, weighted, keys=("d", "c", "b", "a"))  # another key order than the module's
    out = ebc(kjt)
    assert out.keys() == ["a", "b", "c", "d"]
    assert out.length_per_key() == [4, 4, 6, 4]
    expected = reference(kjt)
    torch.testing.assert_close(out.values(), expected)
    grad = torch.randn_like(expected)
    out.values().backward(grad)
    expected.backward(grad)
    for name, table in ebc.embedding_bags.items():
        torch.testing.assert_close(table.weight.grad, reference.bags[name].weight.grad)


@pytest.mark.parametrize("kind", list(EmbOptimType))
@pytest.mark.parametrize(
    ("pooling", "weighted"), [(PoolingType.SUM, False), (PoolingType.MEAN, True)]
)
@pytest.mark.parametrize("how", ["fused_params", "apply_optimizer_in_backward"])
def test_fused_optimizers_match_torch(kind, pooling, weighted, how):
    torch.manual_seed(0)
    lr = 0.05
    if how == "fused_params":
        ebc = EmbeddingBagCollection(
            tables=_configs(pooling), is_weighted=weighted,
            fused_params={"optimizer": kind, "learning_rate": lr, "eps": 1e-8},
        )  # fmt: skip
    else:
        ebc = EmbeddingBagCollection(tables=_configs(pooling), is_weighted=weighted)
        cls = {
            EmbOptimType.EXACT_SGD: torch.optim.SGD,
            EmbOptimType.EXACT_ADAGRAD: torch.optim.Adagrad,
            EmbOptimType.EXACT_ROWWISE_ADAGRAD: RowWiseAdagrad,
            EmbOptimType.ADAM: torch.optim.Adam,
            EmbOptimType.LAMB: LAMB,
            EmbOptimType.LARS_SGD: LarsSGD,
            EmbOptimType.PARTIAL_ROWWISE_ADAM: PartialRowWiseAdam,
            EmbOptimType.PARTIAL_ROWWISE_LAMB: PartialRowWiseLAMB,
        }[kind]
        no_eps = (EmbOptimType.EXACT_SGD, EmbOptimType.LARS_SGD)
        apply_optimizer_in_backward(
            cls, ebc.parameters(), {"lr": lr, **({} if kind in no_eps else {"eps": 1e-8})}
        )
    reference = ReferenceEBC(_configs(pooling), _weights(ebc), sparse=is_sparse_reference(kind))
    optimizer = reference_optimizer(kind, reference.parameters(), lr)
    for step in range(4):
        kjt = _batch(10 + step, weighted)
        grad = torch.randn(B, 18, generator=torch.Generator().manual_seed(step))
        ebc(kjt).values().backward(grad)
        optimizer.zero_grad()
        reference(kjt).backward(grad)
        optimizer.step()
        for name, table in ebc.embedding_bags.items():
            assert table.weight.grad is None
            torch.testing.assert_close(
                table.weight.detach(), reference.bags[name].weight.detach(), atol=1e-5, rtol=1e-5,
                msg=lambda m, name=name, step=step: f"table {name} after step {step}: {m}",
            )  # fmt: skip


def test_learning_rate_changes_and_schedulers_take_effect():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=_configs(), fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    )
    reference = ReferenceEBC(_configs(), _weights(ebc), sparse=True)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    ours = torch.optim.lr_scheduler.StepLR(ebc.fused_optimizer, step_size=1, gamma=0.5)
    theirs = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    for step in range(3):
        kjt = _batch(step, False)
        ebc(kjt).values().sum().backward()
        ref_opt.zero_grad()
        reference(kjt).sum().backward()
        ref_opt.step()
        ebc.fused_optimizer.step()
        ours.step()
        theirs.step()
    assert ebc.fused_optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)
    for name, table in ebc.embedding_bags.items():
        torch.testing.assert_close(table.weight.detach(), reference.bags[name].weight.detach())


@pytest.mark.parametrize("kind", list(EmbOptimType))
def test_fused_optimizer_state_dict_round_trip(kind):
    """Every fused optimizer's whole state (accumulators, moments and step counters) survives
    state_dict/load_state_dict, so the next step is the same step: Adam must not restart its
    bias correction on resume."""
    torch.manual_seed(0)
    fused = {"optimizer": kind, "learning_rate": 0.1}
    ebc = EmbeddingBagCollection(tables=_configs(), fused_params=fused)
    for seed in range(2):
        ebc(_batch(seed, False)).values().sum().backward()
    ebc.fused_optimizer.save_param_groups(True)
    state = ebc.fused_optimizer.state_dict()
    assert sorted(state["state"]) == [f"embedding_bags.t{i}.weight" for i in range(3)]
    t1 = state["state"]["embedding_bags.t1.weight"]
    assert set(t1) == {f"t1.{name}" for name in _STATE_NAMES[kind]}
    assert "t1.step" not in t1 or t1["t1.step"].item() == 2
    if kind == EmbOptimType.EXACT_ROWWISE_ADAGRAD:
        assert t1["t1.momentum1"].shape == (7,)
    assert state["param_groups"][0]["lr"] == 0.1
    other = EmbeddingBagCollection(tables=_configs(), fused_params=fused)
    other.load_state_dict(ebc.state_dict())
    other.fused_optimizer.load_state_dict(state)
    other.fused_optimizer.save_param_groups(True)
    _assert_same_state(other.fused_optimizer.state_dict(), state)
    kjt = _batch(2, False)
    ebc(kjt).values().sum().backward()
    other(kjt).values().sum().backward()
    for name in ("t0", "t1", "t2"):
        torch.testing.assert_close(
            ebc.embedding_bags[name].weight, other.embedding_bags[name].weight, rtol=0, atol=0
        )
    _assert_same_state(other.fused_optimizer.state_dict(), ebc.fused_optimizer.state_dict())


# TorchRec's names (a sharded collection's): the buffers by position, the step count where the
# rule reads it
_STATE_NAMES = {
    EmbOptimType.EXACT_SGD: [],
    EmbOptimType.EXACT_ADAGRAD: ["momentum1"],
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: ["momentum1"],
    EmbOptimType.ADAM: ["momentum1", "exp_avg_sq", "step"],
    EmbOptimType.LAMB: ["momentum1", "exp_avg_sq", "step"],
    EmbOptimType.LARS_SGD: ["momentum1", "step"],
    EmbOptimType.PARTIAL_ROWWISE_ADAM: ["momentum1", "exp_avg_sq", "step"],
    EmbOptimType.PARTIAL_ROWWISE_LAMB: ["momentum1", "exp_avg_sq", "step"],
}


def _assert_same_state(actual: dict, expected: dict) -> None:
    assert actual.get("param_groups") == expected.get("param_groups")
    assert sorted(actual["state"]) == sorted(expected["state"])
    for name, tensors in expected["state"].items():
        assert sorted(actual["state"][name]) == sorted(tensors), name
        for key, value in tensors.items():
            torch.testing.assert_close(actual["state"][name][key], value, rtol=0, atol=0, msg=key)


def test_meta_device_state_dict_and_init_range():
    ebc = EmbeddingBagCollection(tables=_configs(), device="meta")
    assert ebc.embedding_bags["t0"].weight.device.type == "meta"
    assert list(ebc.state_dict()) == [f"embedding_bags.t{i}.weight" for i in range(3)]
    ebc.reset_parameters()
    weight = ebc.embedding_bags["t1"].weight
    assert weight.device.type == "cpu" and weight.shape == (7, 6)
    bound = (1 / 7) ** 0.5
    assert weight.abs().max() <= bound and weight.abs().max() > bound / 2
    out = ebc(_batch(0, False))  # materialised tables are usable and still batched
    assert out.values().shape == (B, 18)


@pytest.mark.parametrize("kind", [EmbOptimType.ADAM, EmbOptimType.EXACT_ROWWISE_ADAGRAD])
def test_to_empty_then_reset_trains_like_a_module_built_in_place(kind):
    """meta -> ``to_empty`` -> ``reset_parameters`` (DMP's meta path): the fused optimizer's
    state must start at its initial values, not at whatever the new memory held."""
    fused = {"optimizer": kind, "learning_rate": 0.05, "initial_accumulator_value": 0.25}
    torch.manual_seed(3)
    built = EmbeddingBagCollection(tables=_configs(), fused_params=fused)
    late = EmbeddingBagCollection(tables=_configs(), fused_params=fused, device="meta")
    garbage = torch.full((1 << 16,), float("nan"))  # freed memory to_empty may be handed
    del garbage
    late.to_empty(device="cpu")
    torch.manual_seed(3)
    late.reset_parameters()
    _assert_same_state(late.fused_optimizer.state_dict(), built.fused_optimizer.state_dict())
    for step in range(2):
        for ebc in (built, late):
            ebc(_batch(step, False)).values().sum().backward()
    for name, table in built.embedding_bags.items():
        torch.testing.assert_close(late.embedding_bags[name].weight, table.weight, rtol=0, atol=0)
    _assert_same_state(late.fused_optimizer.state_dict(), built.fused_optimizer.state_dict())


def test_load_state_dict_writes_into_the_batched_buffer():
    ebc = EmbeddingBagCollection(tables=_configs())
    state = {k: torch.full_like(v, 0.5) for k, v in ebc.state_dict().items()}
    ebc.load_state_dict(state)
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c", "d"], values=torch.tensor([1, 2, 3]),
        lengths=torch.tensor([2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
    )  # fmt: skip
    out = ebc(kjt).to_dict()
    torch.testing.assert_close(out["a"][0], torch.full((4,), 1.0))
    torch.testing.assert_close(out["c"][0], torch.full((6,), 0.5))


def test_embedding_collection_matches_functional_embedding():
    torch.manual_seed(0)
    configs = [
        EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=11, feature_names=["a", "b"]),
        EmbeddingConfig(name="t1", embedding_dim=4, num_embeddings=7, feature_names=["c"]),
    ]
    ec = EmbeddingCollection(tables=configs)
    kjt = _batch(3, False, keys=("c", "a", "b"))
    out = ec(kjt)
    assert list(out) == ["a", "b", "c"]
    total = 0
    for feature, table in (("a", "t0"), ("b", "t0"), ("c", "t1")):
        jt = kjt[feature]
        weight = ec.embeddings[table].weight
        torch.testing.assert_close(out[feature].values(), F.embedding(jt.values(), weight))
        assert torch.equal(out[feature].lengths(), jt.lengths())
        total = total + out[feature].values().sum()
    total.backward()
    counts = torch.bincount(torch.cat([kjt["a"].values(), kjt["b"].values()]), minlength=11)
    torch.testing.assert_close(
        ec.embeddings["t0"].weight.grad, counts.float().unsqueeze(1).expand(11, 4)
    )


def test_deepcopy_keeps_tables_batched_and_independent():
    import copy

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.5}
    ebc = EmbeddingBagCollection(tables=_configs(), fused_params=fused)
    twin = copy.deepcopy(ebc)
    twin(_batch(1, False)).values().sum().backward()
    # batch 1 has no ids for feature 'c' (table t1): only t0 and t2 train
    for name, trained in (("t0", True), ("t1", False), ("t2", True)):
        ours, theirs = ebc.embedding_bags[name].weight, twin.embedding_bags[name].weight
        assert torch.equal(ours, theirs) != trained, f"{name}: only the copy trains"
        assert theirs.data_ptr() != ours.data_ptr()
    assert twin.fused_optimizer.param_groups[0]["lr"] == 0.5
