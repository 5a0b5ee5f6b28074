"""``torchrec.distributed.planner.stats``: reporting a plan."""

from shardkit.distributed.planner._partitioners import (
    IMBALANCE_STAT_MEASURE,
    MIN_WIDTH,
    EmbeddingStats,
    NoopEmbeddingStats,
    round_to_one_sigfig,
)

__all__ = [
    "IMBALANCE_STAT_MEASURE",
    "MIN_WIDTH",
    "EmbeddingStats",
    "NoopEmbeddingStats",
    "round_to_one_sigfig",
]
