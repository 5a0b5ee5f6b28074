"""`shard_modules` on a collection its plan leaves out: left unsharded, as a child would be."""

from __future__ import annotations

import torch

from shardkit import EmbeddingBagCollection
from shardkit.sharding import shard_modules
from shardkit.types import ShardingEnv, ShardingPlan
from tests.sharding.common import configs


def test_a_root_collection_the_plan_leaves_out_stays_unsharded():
    ebc = EmbeddingBagCollection(tables=configs())
    out = shard_modules(ebc, ShardingEnv(1, 0, None), torch.device("cpu"), plan=ShardingPlan({}))
    assert out is ebc
