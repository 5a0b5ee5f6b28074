"""The public surface of each package is pinned: adding or removing a name is a decision."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PUBLIC = {
    "shardkit": [
        "DataType",
        "EmbeddingBagCollection",
        "EmbeddingBagConfig",
        "EmbeddingCollection",
        "EmbeddingConfig",
        "JaggedTensor",
        "KeyedJaggedTensor",
        "KeyedTensor",
        "PoolingType",
        "__version__",
    ],
    "shardkit.modules": [
        "BaseEmbeddingConfig",
        "DataType",
        "EmbeddingBagCollection",
        "EmbeddingBagConfig",
        "EmbeddingCollection",
        "EmbeddingConfig",
        "PoolingType",
        "data_type_to_dtype",
    ],
    "shardkit.optim": [
        "EmbOptimType",
        "FusedOptimizer",
        "FusedOptimizerConfig",
        "FusedTable",
        "RowOptimizer",
        "RowWiseAdagrad",
        "apply_optimizer_in_backward",
        "fused_config_of",
    ],
    "shardkit.models": [
        "DLRM",
        "DLRM_DCN",
        "DLRMTrain",
        "DenseArch",
        "InteractionArch",
        "InteractionDCNArch",
        "LowRankCrossNet",
        "OverArch",
        "SparseArch",
    ],
    "shardkit.launch": [
        "RankFailedError",
        "RankInfo",
        "RankPool",
        "RendezvousTimeoutError",
        "current",
        "init_from_env",
        "is_initialized",
        "select_backend_and_device",
        "shutdown",
        "spawn",
    ],
    "shardkit.comm": [
        "CollectiveError",
        "CollectiveMismatchError",
        "Handle",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_sizes",
        "all_reduce",
        "all_to_all_single",
        "barrier",
        "broadcast",
        "broadcast_object",
        "reduce_scatter_tensor",
        "set_debug",
    ],
    "shardkit.data": [
        "ADULT_PATH",
        "AdultData",
        "Batch",
        "CriteoConfig",
        "CriteoFormat",
        "CriteoReader",
        "GlobalBatchIterator",
        "IdMapping",
        "LastBatch",
        "MapDataset",
        "Missing",
        "SyntheticConfig",
        "SyntheticDataset",
        "TERABYTE_NUM_EMBEDDINGS",
        "TabularDataset",
        "batch_from_ids",
        "epoch_order",
        "load_adult",
        "read_criteo",
    ],
    "shardkit.metrics": [
        "AUC",
        "Accuracy",
        "BinaryMetrics",
        "JsonlWriter",
        "LogLoss",
        "NormalizedEntropy",
        "ThroughputMeter",
        "auc_score",
        "read_jsonl",
    ],
    "shardkit.sparse": ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"],
    "shardkit.sparse.jagged_tensor": ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_pinned(module):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is in __all__ but missing"


def test_import_has_no_side_effects():
    code = (
        "import logging, torch.distributed as dist, shardkit, shardkit.launch, shardkit.comm;"
        "assert not dist.is_initialized();"
        "assert logging.getLogger().handlers == [];"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
