"""``torchrec.distributed.planner.stats``: reporting a plan."""

from shardkit.planner import (
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
