"""The fused optimizer's own state dict (TorchRec's names): step counts travel with it, a dict
without them (as TorchRec's) still loads, and a dict missing a state buffer is refused naming
it."""

from __future__ import annotations

import pytest
import torch

from shardkit import EmbeddingBagCollection, KeyedJaggedTensor
from shardkit.modules import EmbeddingBagConfig
from shardkit.optim import EmbOptimType


def _trained(steps: int) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=5, feature_names=["f"])
        ],
        fused_params={"optimizer": EmbOptimType.ADAM, "learning_rate": 0.1},
    )
    batch = KeyedJaggedTensor(
        keys=["f"], values=torch.tensor([0, 1, 1]), lengths=torch.tensor([2, 1])
    )
    for _ in range(steps):
        ebc(batch).values().sum().backward()
    return ebc


def test_step_counts_round_trip_and_are_optional():
    saved = _trained(3).fused_optimizer.state_dict()
    entry = saved["state"]["embedding_bags.t.weight"]
    assert sorted(entry) == ["t.exp_avg_sq", "t.momentum1", "t.step"]  # TorchRec's names
    assert int(entry["t.step"]) == 3
    fresh = _trained(1)
    fresh.fused_optimizer.load_state_dict(saved)
    assert (
        int(fresh.fused_optimizer.state_dict()["state"]["embedding_bags.t.weight"]["t.step"]) == 3
    )
    del entry["t.step"]
    fresh.fused_optimizer.load_state_dict(saved)  # keeps its own count
    assert (
        int(fresh.fused_optimizer.state_dict()["state"]["embedding_bags.t.weight"]["t.step"]) == 3
    )
    del entry["t.exp_avg_sq"]
    with pytest.raises(
        ValueError, match=r"lacks 't.exp_avg_sq' \(it has \['t.momentum1'\]\): load"
    ):
        fresh.fused_optimizer.load_state_dict(saved)


def test_the_buffers_own_names_still_load():
    """Before the unsharded state dict took TorchRec's names (the sharded one's), Adam's first
    moment was saved as ``t.exp_avg``: such a dict loads alike."""
    saved = _trained(3).fused_optimizer.state_dict()
    entry = saved["state"]["embedding_bags.t.weight"]
    entry["t.exp_avg"] = entry.pop("t.momentum1")
    fresh = _trained(1)
    fresh.fused_optimizer.load_state_dict(saved)
    expected = _trained(3).fused_optimizer.state_dict()["state"]
    torch.testing.assert_close(fresh.fused_optimizer.state_dict()["state"], expected)
