"""Metrics computed across ranks: every value is the one a single process would compute on all
ranks' examples together (not rank 0's share). AUC (exact), log loss, normalised entropy,
accuracy; a throughput meter; JSON-lines records for plots.

``update`` is local and cheap; ``compute`` is a collective when a process group is up (every rank
of the group must call it, in the same order), and plain arithmetic otherwise.
"""

from shardkit.metrics._auc import AUC, auc_score
from shardkit.metrics._binary import BinaryMetrics
from shardkit.metrics._jsonl import JsonlWriter, read_jsonl
from shardkit.metrics._sums import Accuracy, LogLoss, NormalizedEntropy
from shardkit.metrics._throughput import ThroughputMeter

__all__ = [
    "AUC",
    "Accuracy",
    "BinaryMetrics",
    "JsonlWriter",
    "LogLoss",
    "NormalizedEntropy",
    "ThroughputMeter",
    "auc_score",
    "read_jsonl",
]
