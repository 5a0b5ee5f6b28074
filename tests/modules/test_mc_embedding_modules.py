"""Managed-collision EBC/EC against their spec: the plain embedding lookup (one nn.EmbeddingBag
per table) of the ids a separate `ManagedCollisionCollection` remaps, with evicted rows and their
optimizer state reset; outputs, weights and optimizer state after SGD and row-wise Adagrad steps,
state_dict round trips."""

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
)
from shardkit.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from shardkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from shardkit.optim import EmbOptimType
from tests.modules.reference import ReferenceEBC, reference_optimizer

BIG = 2**40
SPACE = 10_007  # the ids' range after `spread`


def spread(ids: torch.Tensor, size: int) -> torch.Tensor:
    """The remappers' input_hash_func: spreads the raw ids over ``[0, size)``, whose blocks are
    the buckets (TorchRec's routing)."""
    return ids % size


FRESH = 0.25  # what init_fn writes: an evicted row is recognisable


def _fresh(weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.init.constant_(weight, FRESH)


def _tables(kind=EmbeddingBagConfig, init_fn=_fresh):
    return [
        kind(name="users", embedding_dim=4, num_embeddings=8, feature_names=["u", "v"],
             init_fn=init_fn),
        kind(name="goods", embedding_dim=4, num_embeddings=6, feature_names=["i"],
             init_fn=init_fn),
    ]  # fmt: skip


def _mcc(tables, buckets=2) -> ManagedCollisionCollection:
    return ManagedCollisionCollection(
        {
            c.name: MCHManagedCollisionModule(
                c.num_embeddings, "cpu", DistanceLFU_EvictionPolicy(), 2, buckets=buckets,
                name=c.name, input_hash_size=SPACE, input_hash_func=spread,
            )
            for c in tables
        },
        tables,
    )  # fmt: skip


def _batch(step: int, batch_size: int = 3) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 4, (3 * batch_size,), generator=g)
    ranks = torch.multinomial(1.0 / torch.arange(1.0, 30.0), int(lengths.sum()), True, generator=g)
    return KeyedJaggedTensor(keys=["u", "i", "v"], values=ranks * 1_000_003 + BIG, lengths=lengths)


def _randomise(module) -> None:
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=g))


@pytest.mark.parametrize("kind", [EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ROWWISE_ADAGRAD])
def test_mc_ebc_trains_as_the_lookup_of_the_remapped_ids(kind):
    tables = _tables()
    ebc = EmbeddingBagCollection(tables=tables, fused_params={"optimizer": kind, "learning_rate": 0.3})  # fmt: skip
    _randomise(ebc)
    mc_ebc = ManagedCollisionEmbeddingBagCollection(ebc, _mcc(tables), return_remapped_features=True)  # fmt: skip
    weights = {c.name: ebc.embedding_bags[c.name].weight.detach().clone() for c in tables}
    reference = ReferenceEBC(tables, weights, sparse=False)
    optimizer = reference_optimizer(kind, reference.parameters(), lr=0.3)
    spec_mcc, resets = _mcc(tables), 0
    for step in range(8):
        batch = _batch(step)
        pooled, remapped = mc_ebc(batch)
        rows = spec_mcc(batch)
        torch.testing.assert_close(remapped.values(), rows.values())
        for name, evicted in spec_mcc.evict().items():  # the spec resets what was evicted
            if evicted is not None:
                resets += evicted.numel()
                reference.bags[name].weight.data[evicted] = FRESH
                for state in optimizer.state[reference.bags[name].weight].values():
                    if state.dim() > 0:  # per-row state; a step counter stays
                        state[evicted] = 0
        expected = reference(rows)
        torch.testing.assert_close(pooled.values(), expected)
        target = torch.linspace(-1, 1, expected.numel()).view_as(expected)
        F.mse_loss(pooled.values(), target, reduction="sum").backward()
        optimizer.zero_grad()
        F.mse_loss(expected, target, reduction="sum").backward()
        optimizer.step()
    assert resets > 0
    for config in tables:
        torch.testing.assert_close(
            ebc.embedding_bags[config.name].weight, reference.bags[config.name].weight
        )
        if kind == EmbOptimType.EXACT_ROWWISE_ADAGRAD:
            fused = ebc.fused_optimizer.state[ebc.embedding_bags[config.name].weight]
            torch.testing.assert_close(
                fused["momentum1"],
                optimizer.state[reference.bags[config.name].weight]["sum"].view(-1),
            )


def test_evicted_rows_are_reinitialised_and_their_optimizer_state_reset():
    tables = _tables(init_fn=None)
    ebc = EmbeddingBagCollection(
        tables=tables,
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1,
                      "initial_accumulator_value": 0.5},
    )  # fmt: skip
    with torch.no_grad():
        ebc.embedding_bags["users"].weight.fill_(9.0)
    mc_ebc = ManagedCollisionEmbeddingBagCollection(ebc, _mcc(tables, buckets=1))
    momentum = ebc.fused_optimizer.state[ebc.embedding_bags["users"].weight]["momentum1"]
    momentum.fill_(3.0)
    kjt = KeyedJaggedTensor(
        keys=["u", "v", "i"], values=torch.tensor([BIG, BIG + 1, BIG]), lengths=torch.tensor([2, 1, 0])
    )  # fmt: skip
    mc_ebc(kjt)
    pooled, remapped = mc_ebc(kjt)  # iteration 2: BIG and BIG + 1 take rows, reset first
    weight = ebc.embedding_bags["users"].weight
    changed = (weight != 9.0).any(dim=1).nonzero().squeeze(1)
    assert changed.numel() == 2  # the two ids took two empty slots' rows, reset before lookup
    assert remapped is None and sorted(mc_ebc._managed_collision_collection(kjt).values()[:2].tolist()) == changed.tolist()  # fmt: skip
    bound = tables[0].get_weight_init_max()
    assert bool((weight[changed].abs() <= bound).all())  # TorchRec's uniform init range
    assert momentum[changed].tolist() == [0.5, 0.5]  # initial_accumulator_value
    assert int((momentum == 3.0).sum()) == 6
    torch.testing.assert_close(pooled.values()[:, :4], weight[changed].sum(0, keepdim=True))


def test_mc_ec_is_the_lookup_of_the_remapped_ids():
    tables = _tables(EmbeddingConfig)
    ec = EmbeddingCollection(tables=tables)
    _randomise(ec)
    mc_ec = ManagedCollisionEmbeddingCollection(ec, _mcc(tables), return_remapped_features=True)
    for step in range(5):
        out, remapped = mc_ec(_batch(step))
        for key, jt in out.items():
            table = "users" if key in ("u", "v") else "goods"
            ids = remapped[key].values()
            torch.testing.assert_close(jt.values(), ec.embeddings[table].weight[ids])
            torch.testing.assert_close(jt.lengths(), remapped[key].lengths())


def test_state_dict_keys_are_torchrec_and_round_trip():
    tables = _tables()
    mc_ebc = ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(tables=tables), _mcc(tables))  # fmt: skip
    for step in range(4):
        mc_ebc(_batch(step))
    state = {k: v.clone() for k, v in mc_ebc.state_dict().items()}
    prefix = "_managed_collision_collection._managed_collision_modules.users."
    assert [k for k in state if k.startswith(prefix)] == [
        prefix + name
        for name in ("_output_segments_tensor", "_current_iter_tensor", "_mch_sorted_raw_ids",
                     "_mch_remapped_ids_mapping", "_mch_counts", "_mch_last_access_iter")
    ]  # fmt: skip
    assert "_embedding_module.embedding_bags.users.weight" in state
    fresh = ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(tables=tables), _mcc(tables))  # fmt: skip
    fresh.load_state_dict(state)
    for key, value in fresh.state_dict().items():
        torch.testing.assert_close(value, state[key])
    mc_ebc.eval(), fresh.eval()
    torch.testing.assert_close(fresh(_batch(9))[0].values(), mc_ebc(_batch(9))[0].values())


def test_tables_must_match():
    tables = _tables()
    with pytest.raises(ValueError, match=r"tables \['users', 'goods'\] and the ManagedCollision"):
        ManagedCollisionEmbeddingBagCollection(
            EmbeddingBagCollection(tables=tables), _mcc(_tables(init_fn=None))
        )
    with pytest.raises(TypeError, match="wraps an EmbeddingBagCollection or EmbeddingCollection"):
        ManagedCollisionEmbeddingBagCollection(torch.nn.Linear(2, 2), _mcc(tables))
