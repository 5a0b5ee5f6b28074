"""Position-weighted features against their spec (the pooled sum of ``w[position] * E[id]``,
written out with one nn.EmbeddingBag per table): outputs, gradients of tables and position
weights, parameters after SGD and fused row-wise Adagrad steps, state_dict names and round trips,
and the errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardkit import KeyedJaggedTensor
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.modules.feature_processor_ import (
    PositionWeightedModule,
    PositionWeightedModuleCollection,
)
from shardkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from shardkit.optim import EmbOptimType
from shardkit.sparse import JaggedTensor
from tests.modules.reference import ReferenceEBC, reference_optimizer

MAX = {"a": 4, "b": 3, "c": 5}


def _tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=9, feature_names=["a", "b"]),
        EmbeddingBagConfig(name="t1", embedding_dim=2, num_embeddings=5, feature_names=["c"]),
    ]


def _batch(seed: int, keys=("c", "a", "b")) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.cat([torch.randint(0, MAX[k] + 1, (3,), generator=g) for k in keys])
    rows = {"a": 9, "b": 9, "c": 5}
    per_key = lengths.view(len(keys), 3).sum(1).tolist()
    values = torch.cat(
        [torch.randint(0, rows[k], (n,), generator=g) for k, n in zip(keys, per_key)]
    )
    weights = torch.rand(values.numel(), generator=g)  # replaced by the position weights
    return KeyedJaggedTensor(keys=list(keys), values=values, lengths=lengths, weights=weights)


def _spec_weights(kjt: KeyedJaggedTensor, position_weights: dict[str, torch.Tensor]):
    """The per-id weights, the obvious way: a loop over bags."""
    out = []
    for key, jt in kjt.to_dict().items():
        for bag in jt.lengths().tolist():
            for position in range(bag):
                out.append(position_weights[key][position] if key in position_weights else 1.0)
    return torch.stack([torch.as_tensor(w) for w in out]) if out else torch.zeros(0)


class Spec(torch.nn.Module):
    """Reference tables and position weights: sum over each bag of w[position] * E[id]."""

    def __init__(self, tables, table_weights, position_weights):
        super().__init__()
        self.tables = ReferenceEBC(tables, table_weights, sparse=False)
        self.position = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(v.clone()) for k, v in position_weights.items()}
        )

    def forward(self, kjt):
        order = [kjt.keys().index(f) for f in ("a", "b", "c")]
        kjt = kjt.permute(order)
        weights = _spec_weights(kjt, dict(self.position.items()))
        return self.tables(KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(),
                                             lengths=kjt.lengths(), weights=weights))  # fmt: skip


def test_position_weighted_module_weighs_each_id_by_its_position():
    module = PositionWeightedModule(4)
    with torch.no_grad():
        module.position_weight.copy_(torch.tensor([1.0, 0.5, 0.25, 0.125]))
    jt = JaggedTensor(values=torch.tensor([7, 8, 9, 4, 5]), lengths=torch.tensor([3, 0, 1, 1]))
    out = module(jt)
    assert out.weights().tolist() == [1.0, 0.5, 0.25, 1.0, 1.0]
    assert torch.equal(out.values(), jt.values()) and torch.equal(out.lengths(), jt.lengths())
    pre = JaggedTensor(values=jt.values(), lengths=jt.lengths(), weights=torch.zeros(5))
    module.pre_process_input(pre)  # TorchRec's inference path: positions precomputed
    assert pre.weights().tolist() == [0.0, 1.0, 2.0, 0.0, 0.0]
    assert module(pre).weights().tolist() == [1.0, 0.5, 0.25, 1.0, 1.0]


@pytest.mark.parametrize("form", ["collection", "dict"])
@pytest.mark.parametrize("kind", [EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ROWWISE_ADAGRAD])
def test_fp_ebc_trains_as_its_spec(form, kind):
    tables = _tables()
    ebc = EmbeddingBagCollection(tables=tables, is_weighted=True,
                                 fused_params={"optimizer": kind, "learning_rate": 0.05})  # fmt: skip
    if form == "collection":
        processors = PositionWeightedModuleCollection(MAX)
        position = dict(processors.position_weights.items())
    else:
        processors = {k: PositionWeightedModule(n) for k, n in MAX.items()}
        position = {k: m.position_weight for k, m in processors.items()}
    fp_ebc = FeatureProcessedEmbeddingBagCollection(ebc, processors)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for weight in position.values():
            weight.copy_(torch.rand(weight.shape, generator=g) + 0.5)
    spec = Spec(tables, {c.name: ebc.embedding_bags[c.name].weight.detach() for c in tables},
                {k: v.detach() for k, v in position.items()})  # fmt: skip
    table_optimizer = reference_optimizer(kind, spec.tables.parameters(), lr=0.05)
    ours_sgd = torch.optim.SGD(list(position.values()), lr=0.05)
    spec_sgd = torch.optim.SGD(spec.position.parameters(), lr=0.05)
    for step in range(4):
        kjt = _batch(step)
        pooled, expected = fp_ebc(kjt).values(), spec(kjt)
        torch.testing.assert_close(pooled, expected)
        target = torch.linspace(-1, 1, expected.numel()).view_as(expected)
        ours_sgd.zero_grad(), spec_sgd.zero_grad(), table_optimizer.zero_grad()
        F.mse_loss(pooled, target, reduction="sum").backward()
        F.mse_loss(expected, target, reduction="sum").backward()
        for key, weight in position.items():
            assert weight.grad is not None and bool(weight.grad.abs().sum() > 0)
            torch.testing.assert_close(weight.grad, spec.position[key].grad, rtol=1e-5, atol=1e-5)
        ours_sgd.step(), spec_sgd.step(), table_optimizer.step()
    for key, weight in position.items():
        torch.testing.assert_close(weight, spec.position[key])
    for config in tables:
        torch.testing.assert_close(
            ebc.embedding_bags[config.name].weight, spec.tables.bags[config.name].weight
        )


def test_collection_weighs_only_its_features_and_keeps_the_layout():
    processors = PositionWeightedModuleCollection({"a": 4})
    kjt = KeyedJaggedTensor(keys=["a", "z"], values=torch.tensor([1, 2, 3, 4]),
                            lengths=torch.tensor([2, 0, 1, 1]), weights=torch.full((4,), 9.0))  # fmt: skip
    with torch.no_grad():
        processors.position_weights["a"].copy_(torch.tensor([2.0, 3.0, 4.0, 5.0]))
    out = processors(kjt)
    assert out.weights().tolist() == [2.0, 3.0, 1.0, 1.0]  # 'z' has none: 1.0, as TorchRec
    assert out.keys() == ["a", "z"] and torch.equal(out.lengths(), kjt.lengths())


@pytest.mark.parametrize("form", ["collection", "dict"])
def test_state_dict_has_torchrec_names_and_round_trips(form):
    def build():
        ebc = EmbeddingBagCollection(tables=_tables(), is_weighted=True)
        if form == "collection":
            return FeatureProcessedEmbeddingBagCollection(
                ebc, PositionWeightedModuleCollection(MAX)
            )
        return FeatureProcessedEmbeddingBagCollection(ebc, {k: PositionWeightedModule(n) for k, n in MAX.items()})  # fmt: skip

    model = build()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.rand(param.shape))
    state = model.state_dict()
    tables = ["_embedding_bag_collection.embedding_bags.t0.weight",
              "_embedding_bag_collection.embedding_bags.t1.weight"]  # fmt: skip
    if form == "collection":
        assert list(state) == tables + [f"_feature_processors.position_weights.{k}" for k in MAX]
    else:
        assert list(state) == tables + [f"_feature_processors.{k}.position_weight" for k in MAX]
    fresh = build()
    fresh.load_state_dict(state)
    for key, value in fresh.state_dict().items():
        torch.testing.assert_close(value, state[key])
    torch.testing.assert_close(fresh(_batch(5)).values(), model(_batch(5)).values())
    processors, ebc = model.split()
    torch.testing.assert_close(ebc(processors(_batch(6))).values(), model(_batch(6)).values())


def test_errors_name_the_feature_and_the_fix():
    weighted = EmbeddingBagCollection(tables=_tables(), is_weighted=True)
    with pytest.raises(ValueError, match="needs an EmbeddingBagCollection built with is_weighted=True"):  # fmt: skip
        FeatureProcessedEmbeddingBagCollection(
            EmbeddingBagCollection(tables=_tables()), PositionWeightedModuleCollection(MAX)
        )
    with pytest.raises(ValueError, match=r"given for \['a'\] but the tables' features are \['a', 'b', 'c'\]"):  # fmt: skip
        FeatureProcessedEmbeddingBagCollection(weighted, {"a": PositionWeightedModule(2)})
    long_bag = KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.arange(5),
                                 lengths=torch.tensor([5, 0, 0]))  # fmt: skip
    collection = FeatureProcessedEmbeddingBagCollection(weighted, PositionWeightedModuleCollection(MAX))  # fmt: skip
    with pytest.raises(ValueError, match="feature 'a': a bag has 5 ids but max_feature_length is 4; truncate"):  # fmt: skip
        collection(long_bag)
    per_feature = FeatureProcessedEmbeddingBagCollection(
        weighted, {k: PositionWeightedModule(n) for k, n in MAX.items()}
    )
    with pytest.raises(ValueError, match="feature 'a': PositionWeightedModule: a bag has 5 ids"):
        per_feature(long_bag)
    with pytest.raises(ValueError, match=r"features \['c'\] are not keys of the input"):
        per_feature(KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(1), lengths=torch.tensor([1, 0])))  # fmt: skip
    with pytest.raises(ValueError, match="max_feature_length must be >= 1, got 0"):
        PositionWeightedModule(0)
    with pytest.raises(ValueError, match=r"feature 'x.y': max_feature_length must be >= 1 \(got 2\) and the feature name free of '.'"):  # fmt: skip
        PositionWeightedModuleCollection({"x.y": 2})
