"""DLRM and DLRM_DCN: shapes, the interaction formula, and training that lowers the loss."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.models import DLRM, DLRM_DCN, DLRMTrain, InteractionArch


def _ebc(dim: int = 4) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=dim, num_embeddings=10, feature_names=[f"f{i}"]
            )
            for i in range(3)
        ]
    )


def _kjt(batch: int, seed: int = 0) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (3 * batch,), generator=g)
    values = torch.randint(0, 10, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=values, lengths=lengths)


def test_interaction_is_pairwise_dot_products():
    torch.manual_seed(0)
    dense, sparse = torch.randn(2, 3), torch.randn(2, 2, 3)
    out = InteractionArch(num_sparse_features=2)(dense, sparse)
    rows = [dense, sparse[:, 0], sparse[:, 1]]
    pairs = [(rows[i] * rows[j]).sum(1) for i in range(3) for j in range(i + 1, 3)]
    torch.testing.assert_close(out, torch.cat([dense, torch.stack(pairs, dim=1)], dim=1))


@pytest.mark.parametrize("cls", [DLRM, DLRM_DCN])
def test_training_lowers_the_loss(cls):
    torch.manual_seed(0)
    extra = {"dcn_num_layers": 2, "dcn_low_rank_dim": 4} if cls is DLRM_DCN else {}
    model = DLRMTrain(
        cls(
            _ebc(),
            dense_in_features=5,
            dense_arch_layer_sizes=[8, 4],
            over_arch_layer_sizes=[8, 1],
            **extra,
        )
    )
    dense, sparse = torch.randn(16, 5), _kjt(16)
    labels = (dense[:, 0] > 0).float()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(30):
        loss, (_, logits, _) = model(
            SimpleNamespace(dense_features=dense, sparse_features=sparse, labels=labels)
        )
        assert logits.shape == (16,)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_dense_arch_must_end_with_the_embedding_dim():
    with pytest.raises(
        ValueError, match=r"dense_arch_layer_sizes must end with the embedding dim 4, got \[8, 3\]"
    ):
        DLRM(
            _ebc(), dense_in_features=5, dense_arch_layer_sizes=[8, 3], over_arch_layer_sizes=[2, 1]
        )


def test_tables_must_share_one_dim():
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="a", embedding_dim=4, num_embeddings=3, feature_names=["a"]),
            EmbeddingBagConfig(name="b", embedding_dim=8, num_embeddings=3, feature_names=["b"]),
        ]
    )
    with pytest.raises(
        ValueError, match=r"DLRM needs one embedding dim for all tables, got \[4, 8\]"
    ):
        DLRM(ebc, dense_in_features=2, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[2, 1])
