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
        "CombinedOptimizer",
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
    "shardkit.sparse": ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"],
    "shardkit.sparse.jagged_tensor": ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"],
    "shardkit.planner": [
        "BATCH_SIZE",
        "BaseEmbeddingSharder",
        "DDR_CAP",
        "EmbeddingComputeKernel",
        "EmbeddingModuleShardingPlan",
        "EmbeddingShardingPlanner",
        "EnumerableShardingSpec",
        "HBM_CAP",
        "HeuristicalStorageReservation",
        "MIN_CW_DIM",
        "ModuleSharder",
        "ParameterConstraints",
        "ParameterSharding",
        "PlanResult",
        "PlanStats",
        "PlannerError",
        "PlannerErrorType",
        "RankStats",
        "ShardMetadata",
        "ShardPlacement",
        "ShardingEnv",
        "ShardingPlan",
        "ShardingType",
        "TableStats",
        "Topology",
        "embedding_compute_kernels",
        "embedding_sharding_types",
        "estimate_plan",
        "placement",
        "plan_tables",
        "split_evenly",
    ],
    "shardkit.sharding": [
        "DataExhaustedError",
        "DistributedModelParallel",
        "EmbeddingBagCollectionSharder",
        "EmbeddingCollectionSharder",
        "InputError",
        "ParameterShardingGenerator",
        "ShardedEmbeddingBagCollection",
        "ShardedEmbeddingCollection",
        "TrainPipelineSparseDist",
        "apply_to_all",
        "column_wise",
        "construct_module_sharding_plan",
        "data_parallel",
        "get_default_sharders",
        "grid_shard",
        "row_wise",
        "table_row_wise",
        "table_wise",
    ],
    "shardkit.distributed": ["DistributedModelParallel", "ShardingEnv", "ShardingPlan"],
    "shardkit.distributed.types": [
        "EmbeddingModuleShardingPlan",
        "EnumerableShardingSpec",
        "ModuleSharder",
        "ParameterSharding",
        "ShardMetadata",
        "ShardingEnv",
        "ShardingPlan",
        "ShardingType",
    ],
    "shardkit.distributed.model_parallel": ["DistributedModelParallel"],
    "shardkit.distributed.train_pipeline": ["DataExhaustedError", "TrainPipelineSparseDist"],
    "shardkit.distributed.embedding_types": [
        "BaseEmbeddingSharder",
        "EmbeddingComputeKernel",
    ],
    "shardkit.distributed.embeddingbag": [
        "EmbeddingBagCollectionSharder",
        "ShardedEmbeddingBagCollection",
    ],
    "shardkit.distributed.embedding": ["EmbeddingCollectionSharder", "ShardedEmbeddingCollection"],
    "shardkit.distributed.sharding_plan": [
        "ParameterShardingGenerator",
        "apply_to_all",
        "column_wise",
        "construct_module_sharding_plan",
        "data_parallel",
        "get_default_sharders",
        "grid_shard",
        "row_wise",
        "table_row_wise",
        "table_wise",
    ],
    "shardkit.distributed.planner": [
        "EmbeddingShardingPlanner",
        "HeuristicalStorageReservation",
        "ParameterConstraints",
        "Topology",
    ],
    "shardkit.distributed.planner.types": [
        "ParameterConstraints",
        "PlannerError",
        "PlannerErrorType",
        "Topology",
    ],
    "shardkit.distributed.planner.storage_reservations": [
        "HeuristicalStorageReservation",
    ],
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
