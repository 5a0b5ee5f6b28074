"""An unsharded EmbeddingBagCollection takes a batch size per feature (VBE): the pooled rows
and the tables' gradients equal those of the plain batch it stands for."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit import (
    EmbeddingBagCollection,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    PoolingType,
)
from shardkit.modules import expand_variable_batch
from tests.sharding.common import FEATURES, LIMITS, configs
from tests.sharding.vbe import kjt_of, vbe_batch


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_vbe_input_equals_the_plain_batch(pooling):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs(pooling))
    reference = copy.deepcopy(ebc)
    vbe, bags = vbe_batch(3, 5)
    plain = kjt_of(bags)
    assert vbe.variable_stride_per_key() and vbe.stride_per_key()[0] == 2
    out, expected = ebc(vbe), reference(plain)
    assert out.keys() == expected.keys()
    torch.testing.assert_close(out.values(), expected.values(), rtol=0, atol=1e-6)
    grad = torch.randn_like(expected.values())
    (out.values() * grad).sum().backward()
    (expected.values() * grad).sum().backward()
    for (name, p), q in zip(ebc.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-6, msg=name)


def test_vbe_without_inverse_indices_is_refused():
    vbe, _ = vbe_batch(3, 5)
    bare = KeyedJaggedTensor(keys=vbe.keys(), values=vbe.values(), lengths=vbe.lengths(),
                             stride_per_key_per_rank=[[s] for s in vbe.stride_per_key()])  # fmt: skip
    with pytest.raises(ValueError, match=r"batch size per key \(\[2, 5, 1, 5, 5\]\) needs "
                       r"inverse_indices .* to say which bag each example uses"):  # fmt: skip
        expand_variable_batch(bare)
    with pytest.raises(ValueError, match="needs inverse_indices"):
        EmbeddingBagCollection(tables=configs())(bare)


def test_vbe_into_the_sequence_collection_gives_the_full_batch():
    """Every key's full-batch bags (TorchRec's sharded EmbeddingCollection's output), with the
    tables' gradients summed from the repeated rows into their deduplicated bag."""
    torch.manual_seed(0)
    tables = [EmbeddingConfig(name=f"t_{k}", embedding_dim=3, num_embeddings=LIMITS[k],
                              feature_names=[k]) for k in FEATURES]  # fmt: skip
    ec = EmbeddingCollection(tables=tables)
    reference = copy.deepcopy(ec)
    vbe, bags = vbe_batch(3, 5)
    out, expected = ec(vbe), reference(kjt_of(bags))
    loss, ref_loss = 0.0, 0.0
    for key in FEATURES:
        torch.testing.assert_close(out[key].lengths(), expected[key].lengths(), rtol=0, atol=0)
        torch.testing.assert_close(out[key].values(), expected[key].values(), rtol=0, atol=0)
        coef = torch.randn(expected[key].values().shape)
        loss, ref_loss = (
            loss + (out[key].values() * coef).sum(),
            ref_loss + (expected[key].values() * coef).sum(),
        )
    loss.backward()
    ref_loss.backward()
    for (name, p), q in zip(ec.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-6, msg=name)
