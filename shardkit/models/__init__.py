"""Recommendation models built on shardkit's embedding collections."""

from shardkit.models.dlrm import (
    DLRM,
    DLRM_DCN,
    DenseArch,
    DLRMTrain,
    InteractionArch,
    InteractionDCNArch,
    LowRankCrossNet,
    OverArch,
    SparseArch,
)

__all__ = [
    "DLRM",
    "DLRM_DCN",
    "DLRMTrain",
    "DenseArch",
    "InteractionArch",
    "InteractionDCNArch",
    "LowRankCrossNet",
    "OverArch",
    "SparseArch",
]
