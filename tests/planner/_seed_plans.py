"""Seed 001's printed plans, verbatim (world_size 2, compute_device "cuda"). The contract:
forcing one sharding type per table gives exactly these tables, each ``ParameterSharding``
printing as the tutorial shows (`tutorial_text`) but for the kernel's name, which is TorchRec
1.8's (``'fused'``, ``'dense'``: issue 27) where the tutorial's older TorchRec printed
``'batched_fused'`` and ``'batched_dense'`` (`SEED_PLANS_VERBATIM` keeps the seed's text); on
CPUs placements read ``rank:<r>/cpu``.
``print(plan)`` itself is a table (issue 14: never a raw repr), checked by `check_readable`."""

from __future__ import annotations


def tutorial_text(plan) -> str:
    """The plan as TorchRec's tutorial printed it: the nested dict of ``ParameterSharding``
    reprs."""
    return str({path: dict(module_plan) for path, module_plan in plan.plan.items()})


def check_readable(plan) -> None:
    """``str(plan)`` is a table that names every table once, with its type and shard sizes,
    under its module; never the dict repr."""
    text = str(plan)
    assert "ParameterSharding(" not in text and "{" not in text, text
    for path, module_plan in plan.plan.items():
        assert ("module " + path if path else "module (the model itself)") in text
        for name, sharding in module_plan.items():
            rows = [line.split() for line in text.splitlines() if line.split()[:1] == [name]]
            assert len(rows) == 1, (name, text)
            assert sharding.sharding_type.value in rows[0], (name, rows[0])
            if sharding.sharding_spec is not None:
                sizes = {"[{}, {}]".format(*s.shard_sizes) for s in sharding.sharding_spec.shards}
                assert all(size in " ".join(rows[0]) for size in sizes), (name, rows[0])


SEED_PLANS_VERBATIM = {
    "TABLE_WISE": (
        "{'': {'large_table_0': ParameterSharding(sharding_type='table_wise', "
        "compute_kernel='batched_fused', ranks=[0], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[4096, 64], placement=rank:0/cuda:0)])), 'large_table_1': "
        "ParameterSharding(sharding_type='table_wise', compute_kernel='batched_fused', "
        "ranks=[1], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[4096, 64], placement=rank:1/cuda:1)])), 'small_table_0': "
        "ParameterSharding(sharding_type='table_wise', compute_kernel='batched_fused', "
        "ranks=[0], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[1024, 64], placement=rank:0/cuda:0)])), 'small_table_1': "
        "ParameterSharding(sharding_type='table_wise', compute_kernel='batched_fused', "
        "ranks=[1], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[1024, 64], placement=rank:1/cuda:1)]))}}"
    ),
    "ROW_WISE": (
        "{'': {'large_table_0': ParameterSharding(sharding_type='row_wise', "
        "compute_kernel='batched_fused', ranks=[0, 1], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[2048, 64], placement=rank:0/cuda:0), ShardMetadata(shard_offsets=[2048, "
        "0], shard_sizes=[2048, 64], placement=rank:1/cuda:1)])), 'large_table_1': "
        "ParameterSharding(sharding_type='row_wise', compute_kernel='batched_fused', ranks=[0, "
        "1], sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[2048, 64], placement=rank:0/cuda:0), ShardMetadata(shard_offsets=[2048, "
        "0], shard_sizes=[2048, 64], placement=rank:1/cuda:1)])), 'small_table_0': "
        "ParameterSharding(sharding_type='row_wise', compute_kernel='batched_fused', ranks=[0, "
        "1], sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[512, 64], placement=rank:0/cuda:0), ShardMetadata(shard_offsets=[512, 0], "
        "shard_sizes=[512, 64], placement=rank:1/cuda:1)])), 'small_table_1': "
        "ParameterSharding(sharding_type='row_wise', compute_kernel='batched_fused', ranks=[0, "
        "1], sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[512, 64], placement=rank:0/cuda:0), ShardMetadata(shard_offsets=[512, 0], "
        "shard_sizes=[512, 64], placement=rank:1/cuda:1)]))}}"
    ),
    "COLUMN_WISE": (
        "{'': {'large_table_0': ParameterSharding(sharding_type='column_wise', "
        "compute_kernel='batched_fused', ranks=[0, 1], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[4096, 32], placement=rank:0/cuda:0), ShardMetadata(shard_offsets=[0, 32], "
        "shard_sizes=[4096, 32], placement=rank:1/cuda:1)])), 'large_table_1': "
        "ParameterSharding(sharding_type='column_wise', compute_kernel='batched_fused', "
        "ranks=[0, 1], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[4096, 32], placement=rank:0/cuda:0), ShardMetadata(shard_offsets=[0, 32], "
        "shard_sizes=[4096, 32], placement=rank:1/cuda:1)])), 'small_table_0': "
        "ParameterSharding(sharding_type='column_wise', compute_kernel='batched_fused', "
        "ranks=[0, 1], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[1024, 32], placement=rank:0/cuda:0), ShardMetadata(shard_offsets=[0, 32], "
        "shard_sizes=[1024, 32], placement=rank:1/cuda:1)])), 'small_table_1': "
        "ParameterSharding(sharding_type='column_wise', compute_kernel='batched_fused', "
        "ranks=[0, 1], "
        "sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], "
        "shard_sizes=[1024, 32], placement=rank:0/cuda:0), ShardMetadata(shard_offsets=[0, 32], "
        "shard_sizes=[1024, 32], placement=rank:1/cuda:1)]))}}"
    ),
    "DATA_PARALLEL": (
        "{'': {'large_table_0': ParameterSharding(sharding_type='data_parallel', "
        "compute_kernel='batched_dense', ranks=[0, 1], sharding_spec=None), 'large_table_1': "
        "ParameterSharding(sharding_type='data_parallel', compute_kernel='batched_dense', "
        "ranks=[0, 1], sharding_spec=None), 'small_table_0': "
        "ParameterSharding(sharding_type='data_parallel', compute_kernel='batched_dense', "
        "ranks=[0, 1], sharding_spec=None), 'small_table_1': "
        "ParameterSharding(sharding_type='data_parallel', compute_kernel='batched_dense', "
        "ranks=[0, 1], sharding_spec=None)}}"
    ),
}

# TorchRec 1.8 renamed the kernels: the same plans as it prints them.
SEED_PLANS = {
    kind: text.replace("'batched_fused'", "'fused'").replace("'batched_dense'", "'dense'")
    for kind, text in SEED_PLANS_VERBATIM.items()
}
