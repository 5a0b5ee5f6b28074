"""``torchrec.distributed.planner.proposers``: TorchRec's proposers over sharding options."""

from shardkit.compat import refuse
from shardkit.distributed.planner._proposers import (
    MAX_PROPOSALS,
    DynamicProgrammingProposer,
    GreedyProposer,
    GridSearchProposer,
    UniformProposer,
    proposers_to_proposals_list,
)

__all__ = [
    "MAX_PROPOSALS",
    "DynamicProgrammingProposer",
    "GreedyProposer",
    "GridSearchProposer",
    "UniformProposer",
    "proposers_to_proposals_list",
]

__getattr__ = refuse(
    __name__,
    {
        "EmbeddingOffloadScaleupProposer": "it scales up FBGEMM's UVM caches; shardkit has no cache: use GreedyProposer or the planner's own search",
    },
)
