"""Bad input to embedding collections is refused with the key, the value and the rule."""

from __future__ import annotations

import pytest
import torch

from shardkit import KeyedJaggedTensor
from shardkit.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
)

TABLES = [
    EmbeddingBagConfig(
        name="product_table", embedding_dim=4, num_embeddings=10, feature_names=["product"]
    ),
    EmbeddingBagConfig(
        name="user_table", embedding_dim=4, num_embeddings=20, feature_names=["user"]
    ),
]


def _kjt(values, keys=("product", "user"), **kwargs):
    return KeyedJaggedTensor(
        keys=list(keys), values=torch.tensor(values), lengths=torch.tensor([1, 1, 1, 1]), **kwargs
    )


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        (
            [1, 2, 3, 20],
            r"feature 'user' \(table 'user_table'\): id 20 at position 1 .* 0 <= id < num_embeddings = 20",
        ),
        ([1, -1, 3, 4], r"feature 'product' \(table 'product_table'\): id -1 at position 1"),
    ],
)
def test_ids_out_of_range(values, pattern):
    with pytest.raises(ValueError, match=pattern):
        EmbeddingBagCollection(tables=TABLES)(_kjt(values))


SAME_SIZE = [
    EmbeddingBagConfig(name="a_t", embedding_dim=4, num_embeddings=8, feature_names=["a", "b"]),
    EmbeddingBagConfig(name="c_t", embedding_dim=4, num_embeddings=8, feature_names=["c"]),
    EmbeddingBagConfig(name="d_t", embedding_dim=4, num_embeddings=9, feature_names=["d"]),
]


@pytest.mark.parametrize(
    ("values", "lengths", "pattern"),
    [
        # keys a, b, c share a limit (one pass over their ids): the message still names the key
        ([1, 2, 8, 3], [1, 0, 1, 0, 1, 0, 1, 0], r"feature 'c' \(table 'c_t'\): id 8 at position 0"),
        ([1, -2, 7, 8], [1, 0, 1, 0, 1, 0, 1, 0], r"feature 'b' \(table 'a_t'\): id -2 at position 0"),
        ([1, 2, 3, 9], [1, 1, 0, 0, 1, 0, 0, 1], r"feature 'd' \(table 'd_t'\): id 9 at position 0 .* = 9"),
    ],
)  # fmt: skip
def test_ids_out_of_range_among_tables_of_one_size(values, lengths, pattern):
    kjt = KeyedJaggedTensor(
        ["a", "b", "c", "d"], torch.tensor(values), lengths=torch.tensor(lengths)
    )
    with pytest.raises(ValueError, match=pattern):
        EmbeddingBagCollection(tables=SAME_SIZE)(kjt)
    ok = KeyedJaggedTensor(
        ["a", "b", "c", "d"], torch.tensor([7, 0, 7, 8]), lengths=torch.tensor(lengths)
    )
    assert EmbeddingBagCollection(tables=SAME_SIZE)(ok).values().shape == (2, 16)


def test_id_check_can_be_switched_off():
    ebc = EmbeddingBagCollection(tables=TABLES, validate_ids=False)
    assert ebc(_kjt([1, 2, 3, 4])).values().shape == (2, 8)


def test_keys_must_include_the_features_and_others_are_ignored_as_in_torchrec():
    with pytest.raises(ValueError, match=r"lacks the module's features \['user'\] \(it has"):
        EmbeddingBagCollection(tables=TABLES)(_kjt([1, 2, 3, 4], keys=("product", "item")))
    ebc = EmbeddingBagCollection(tables=TABLES)
    extra = KeyedJaggedTensor.concat([_kjt([1, 2, 3, 4]), _kjt([1, 2, 3, 4], keys=("a", "b"))])
    torch.testing.assert_close(ebc(extra).values(), ebc(_kjt([1, 2, 3, 4])).values())


def test_weighted_module_needs_weights():
    with pytest.raises(ValueError, match=r"weighted but the KJT has no weights"):
        EmbeddingBagCollection(tables=TABLES, is_weighted=True)(_kjt([1, 2, 3, 4]))


def test_variable_batch_size_without_inverse_indices_is_refused():
    """A batch size per key is taken with inverse_indices (tests/modules/test_vbe.py)."""
    kjt = KeyedJaggedTensor(
        keys=["product", "user"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]),
        stride_per_key_per_rank=[[2], [1]],
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"batch size per key \(\[2, 1\]\) needs inverse_indices"):
        EmbeddingBagCollection(tables=TABLES)(kjt)


@pytest.mark.parametrize(
    ("tables", "error", "pattern"),
    [
        ([TABLES[0], TABLES[0]], ValueError, r"table names must be unique; \['product_table'\]"),
        (
            [
                TABLES[0],
                EmbeddingBagConfig(
                    name="x", embedding_dim=4, num_embeddings=3, feature_names=["product"]
                ),
            ],
            ValueError,
            r"feature 'product' is looked up in two tables \('product_table' and 'x'\)",
        ),
        (
            [EmbeddingConfig(name="e", embedding_dim=4, num_embeddings=3, feature_names=["f"])],
            TypeError,
            r"expected EmbeddingBagConfig, got EmbeddingConfig",
        ),
    ],
)
def test_bad_tables(tables, error, pattern):
    with pytest.raises(error, match=pattern):
        EmbeddingBagCollection(tables=tables)


def test_unknown_fused_params_key():
    with pytest.raises(ValueError, match=r"unknown fused_params key\(s\) \['moment'\]"):
        EmbeddingBagCollection(tables=TABLES, fused_params={"optimizer": "sgd", "moment": 0.9})
    with pytest.raises(
        ValueError, match=r"fused_params key 'momentum' \(0.9\): used only by FBGEMM"
    ):
        EmbeddingBagCollection(tables=TABLES, fused_params={"optimizer": "sgd", "momentum": 0.9})


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_embeddings": 0}, r"table 't': num_embeddings must be >= 1, got 0"),
        ({"embedding_dim": 0}, r"table 't': embedding_dim must be >= 1, got 0"),
        ({"name": ""}, r"an embedding table needs a name"),
        ({"feature_names": ["f", "f"]}, r"table 't': feature names \['f'\] appear twice"),
        ({"pooling": PoolingType.NONE}, r"an EmbeddingBagConfig pools \(SUM or MEAN\)"),
        (
            {"weight_init_min": 1.0, "weight_init_max": 0.0},
            r"weight_init_min \(1.0\) > weight_init_max \(0.0\)",
        ),
    ],
)
def test_bad_configs(kwargs, pattern):
    base = {"name": "t", "embedding_dim": 4, "num_embeddings": 3, "feature_names": ["f"]}
    with pytest.raises(ValueError, match=pattern):
        EmbeddingBagConfig(**{**base, **kwargs})


def test_lengths_that_do_not_sum_to_the_values_are_refused():
    kjt = KeyedJaggedTensor(
        keys=["product", "user"],
        values=torch.tensor([1, 2, 3, 4, 5]),
        lengths=torch.tensor([1, 1, 1, 1]),
    )
    with pytest.raises(ValueError, match=r"lengths sum to 4 .* but values have 5 entries"):
        EmbeddingBagCollection(tables=TABLES)(kjt)
