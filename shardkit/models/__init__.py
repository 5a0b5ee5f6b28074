"""Recommendation models built on shardkit's embedding collections, at TorchRec's paths:
``shardkit.models.dlrm`` (DLRM, DLRM_DCN, DLRM_Projection) and ``shardkit.models.deepfm``
(SimpleDeepFMNN)."""

from shardkit.models import deepfm, dlrm  # noqa: F401 (torchrec.models has its submodules)
from shardkit.models.deepfm import SimpleDeepFMNN
from shardkit.models.dlrm import (
    DLRM,
    DLRM_DCN,
    DenseArch,
    DLRM_Projection,
    DLRMTrain,
    InteractionArch,
    InteractionDCNArch,
    InteractionProjectionArch,
    LowRankCrossNet,
    OverArch,
    SparseArch,
)

__all__ = [
    "DLRM",
    "DLRM_DCN",
    "DLRMTrain",
    "DLRM_Projection",
    "DenseArch",
    "InteractionArch",
    "InteractionDCNArch",
    "InteractionProjectionArch",
    "LowRankCrossNet",
    "OverArch",
    "SimpleDeepFMNN",
    "SparseArch",
]
