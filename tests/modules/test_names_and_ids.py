"""Any table or feature name that a state-dict key can hold works, TorchRec's layout kept
(issue 14, item 3); int32 and int64 ids look up the same rows (issue 14, item 2).

The unsharded collections here; the sharded ones and checkpoints in
``tests/sharding/test_names_and_ids.py``.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

from shardkit import KeyedJaggedTensor
from shardkit.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    TableDict,
)
from shardkit.optim import EmbOptimType

# Attribute names of nn.ModuleDict and nn.Module (which add_module refuses), and others.
AWKWARD = ["items", "keys", "values", "to", "forward", "type", "training", "__class__", "_modules"]
FUSED = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.1}
B = 3


def _collection(kind: str, names: list[str], **kwargs):
    """One table per name, looked up by a feature of the same name and one called 'plain'."""
    config = EmbeddingBagConfig if kind == "bag" else EmbeddingConfig
    tables = [
        config(name=name, embedding_dim=2 + i % 2, num_embeddings=5 + i, feature_names=[name])
        for i, name in enumerate(names)
    ]
    tables.append(config(name="plain", embedding_dim=2, num_embeddings=4, feature_names=["f"]))
    module = EmbeddingBagCollection if kind == "bag" else EmbeddingCollection
    return module(tables=tables, **kwargs)


def _batch(keys: list[str], seed: int, dtype=torch.int64) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (len(keys) * B,), generator=g)
    values = torch.randint(0, 4, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys, values.to(dtype), lengths=lengths)


def _outputs(module, kjt) -> dict[str, torch.Tensor]:
    out = module(kjt)
    if isinstance(module, EmbeddingBagCollection):
        return out.to_dict()
    return {key: jt.values() for key, jt in out.items()}


@pytest.mark.parametrize("kind, prefix", [("bag", "embedding_bags"), ("seq", "embeddings")])
def test_every_awkward_name_works_with_torchrecs_state_dict_layout(kind, prefix):
    torch.manual_seed(0)
    module = _collection(kind, AWKWARD, fused_params=FUSED)
    expected = [f"{prefix}.{name}.weight" for name in [*AWKWARD, "plain"]]
    assert list(module.state_dict()) == expected
    assert [name for name, _ in module.named_parameters()] == expected
    assert sorted(module.fused_optimizer.state_dict()["state"]) == sorted(expected)
    tables = getattr(module, prefix)
    assert isinstance(tables, TableDict) and list(tables) == [*AWKWARD, "plain"]
    assert tables["items"].weight.shape == (5, 2) and callable(tables.items)

    keys = [*AWKWARD, "f"]
    kjt = _batch(keys, seed=1)
    before = _outputs(module, kjt)
    assert list(before) == keys
    sum(t.sum() for t in before.values()).backward()  # fused Adam: one step on every table
    copy_ = _collection(kind, AWKWARD, fused_params=FUSED)
    copy_.load_state_dict(module.state_dict())
    copy_.fused_optimizer.load_state_dict(module.fused_optimizer.state_dict())
    for twin in (copy_, copy.deepcopy(module), module.to("cpu")):
        for key, value in _outputs(twin, kjt).items():
            torch.testing.assert_close(value, _outputs(module, kjt)[key], msg=key)
    # the optimizer state came over: one more step is the same step on both
    for twin in (module, copy_):
        sum(t.sum() for t in _outputs(twin, _batch(keys, seed=2)).values()).backward()
    for key, value in module.state_dict().items():
        torch.testing.assert_close(copy_.state_dict()[key], value, rtol=0, atol=0, msg=key)


def test_a_table_called_training_leaves_train_and_eval_working():
    ebc = _collection("bag", ["training"])
    assert ebc.eval().training is False and ebc.embedding_bags.training is False
    assert ebc.train().embedding_bags.training is True
    assert isinstance(ebc.embedding_bags["training"], torch.nn.Module)


def test_the_table_dict_still_refuses_what_cannot_be_a_state_dict_key():
    tables = TableDict()
    with pytest.raises(KeyError, match=r'module name can.+t contain "\.", got: a\.b'):
        tables["a.b"] = torch.nn.Linear(1, 1)
    with pytest.raises(TypeError, match="int is not a Module subclass"):
        tables["items"] = 3


RULE = (
    "a table's name is part of its state-dict keys (embedding_bags.<name>.weight), which join "
    'their parts with ".", so it must be a non-empty string without "."'
)


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("", ValueError, f"an embedding table needs a name: {RULE}"),
        (7, TypeError, "a table name must be a str, got int 7"),
    ],
)
@pytest.mark.parametrize("config", [EmbeddingBagConfig, EmbeddingConfig])
def test_a_table_name_that_is_not_a_non_empty_str_is_refused_by_the_config(
    config, name, kind, message
):
    with pytest.raises(kind, match="^" + re.escape(message) + "$"):
        config(name=name, embedding_dim=2, num_embeddings=3, feature_names=["f"])


@pytest.mark.parametrize("kind", ["bag", "seq"])
def test_a_table_name_with_a_dot_is_refused_by_the_collection(kind):
    message = f"table name 'user.ids' contains \".\": {RULE}; e.g. 'user_ids'"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        _collection(kind, ["items", "user.ids"])


@pytest.mark.parametrize("kind", ["bag", "seq"])
def test_int32_and_int64_ids_look_up_the_same_rows(kind):
    """Outputs, gradients and fused updates are the same for int32 ids as for int64 ids."""
    torch.manual_seed(0)
    wide = _collection(kind, ["a", "b"], fused_params={**FUSED, "optimizer": "exact_sgd"})
    narrow = copy.deepcopy(wide)
    for seed in range(2):
        kjt = _batch(["a", "b", "f"], seed)
        kjt32 = KeyedJaggedTensor(kjt.keys(), kjt.values().int(), lengths=kjt.lengths().int())
        assert kjt32.values().dtype == torch.int32
        ours, theirs = _outputs(narrow, kjt32), _outputs(wide, kjt)
        for key in theirs:
            torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=key)
        sum(t.sum() for t in ours.values()).backward()
        sum(t.sum() for t in theirs.values()).backward()
    for key, value in wide.state_dict().items():
        torch.testing.assert_close(narrow.state_dict()[key], value, rtol=0, atol=0, msg=key)
