"""The memory and cost model of one shard (docs/planner.md, [Note: memory model] and
[Note: cost model] in shardkit/planner/_estimate.py), checked against hand-computed values."""

from __future__ import annotations

import math

import pytest

from shardkit.modules import EmbeddingBagConfig
from shardkit.optim import EmbOptimType
from shardkit.optim._rules import STATE_SHAPES
from shardkit.planner import EmbeddingComputeKernel, ParameterConstraints, ShardingType, Topology
from shardkit.planner._constants import BATCHED_COPY_PERF_FACTOR, DENSE_UPDATE_PERF_FACTOR
from shardkit.planner._estimate import estimate_shard, optimizer_state_bytes
from shardkit.planner._tables import config_sources, resolve_tables

FUSED, DENSE = EmbeddingComputeKernel.FUSED, EmbeddingComputeKernel.DENSE
TW, RW, DP = ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL
TWRW = ShardingType.TABLE_ROW_WISE


def spec(rows=1000, dim=64, *, optimizer="rowwise_adagrad", pooling=1.0, batch=512, weighted=False):
    config = EmbeddingBagConfig(
        name="t", num_embeddings=rows, embedding_dim=dim, feature_names=["f"]
    )
    sources = config_sources(
        [config], compute_device="cuda", is_weighted=weighted, fused_params={"optimizer": optimizer}
    )
    constraints = {"t": ParameterConstraints(pooling_factors=[pooling])}
    return resolve_tables(sources, constraints, batch_size=batch)[0]


def topo(world=1, local=None):
    return Topology(world_size=world, compute_device="cuda", local_world_size=local)


def test_table_wise_memory_is_weights_state_and_buffers():
    cost = estimate_shard(spec(), TW, FUSED, 1000, 64, topo())
    ids, outputs = 512, 512  # pooling factor 1, batch 512, one rank
    io = ids * 8 + outputs * 64 * 4
    assert cost.io_memory == io
    assert cost.memory == 1000 * 64 * 4 + 1000 * 4 + io  # weights, row-wise Adagrad, buffers


@pytest.mark.parametrize(
    ("optimizer", "state"),
    [
        ("sgd", 0),
        ("rowwise_adagrad", 1000 * 4),
        ("adagrad", 1000 * 64 * 4),
        ("adam", 2 * 1000 * 64 * 4),
    ],
)
def test_optimizer_state_counts(optimizer, state):
    base = estimate_shard(spec(optimizer="sgd"), TW, FUSED, 1000, 64, topo()).memory
    assert (
        estimate_shard(spec(optimizer=optimizer), TW, FUSED, 1000, 64, topo()).memory
        == base + state
    )


@pytest.mark.parametrize("kind", list(EmbOptimType))
def test_optimizer_state_matches_what_shardkit_optim_allocates(kind):
    shapes = STATE_SHAPES[kind](37, 24)
    assert optimizer_state_bytes(kind, 37, 24) == 4 * sum(math.prod(s) for s in shapes.values())


def test_dense_kernel_adds_a_gradient_and_runs_at_half_bandwidth():
    fused = estimate_shard(spec(), TW, FUSED, 1000, 64, topo())
    dense = estimate_shard(spec(), TW, DENSE, 1000, 64, topo())
    assert dense.memory - fused.memory == 1000 * 64 * 4
    assert dense.compute == pytest.approx(2 * fused.compute)


def test_buffers_grow_with_batch_and_pooling():
    small = estimate_shard(spec(batch=512), TW, FUSED, 1000, 64, topo(4))
    large = estimate_shard(spec(batch=1024), TW, FUSED, 1000, 64, topo(4))
    assert large.io_memory == 2 * small.io_memory
    assert large.memory - small.memory == small.io_memory
    pooled = estimate_shard(spec(pooling=10.0), TW, FUSED, 1000, 64, topo(4))
    # 10x the ids, the same number of pooled outputs
    assert pooled.io_memory - small.io_memory == 9 * 512 * 4 * 8


def test_lookup_compute_is_bytes_over_memory_bandwidth():
    t = topo(4)
    cost = estimate_shard(spec(), TW, FUSED, 1000, 64, t)
    ids = outputs = 512 * 4  # a table-wise shard serves every rank's batch
    forward = (ids * 8 + ids * 64 * 4 + outputs * 64 * 4) / t.hbm_mem_bw
    assert cost.compute == pytest.approx(forward * (1 + t.bwd_compute_multiplier))


def test_table_wise_comms_use_intra_host_links_inside_a_host_and_inter_host_across():
    one_host = estimate_shard(spec(), TW, FUSED, 1000, 64, topo(8))
    two_hosts = estimate_shard(spec(), TW, FUSED, 1000, 64, topo(8, local=4))
    t = topo(8)
    ids, output_bytes = 512 * 8, 512 * 8 * 64 * 4
    assert one_host.comms == pytest.approx((ids * 8 + 2 * output_bytes) / t.intra_host_bw)
    assert two_hosts.comms == pytest.approx((ids * 8 + 2 * output_bytes) / t.inter_host_bw)
    assert one_host.compute == two_hosts.compute


def test_one_rank_communicates_nothing():
    assert estimate_shard(spec(), TW, FUSED, 1000, 64, topo(1)).comms == 0.0


def test_row_wise_shard_serves_its_share_of_ids_and_reduce_scatters_partial_sums():
    t = topo(4)
    cost = estimate_shard(spec(), RW, FUSED, 250, 64, t)
    ids = 512 * 4 * 250 / 1000  # its quarter of the global batch's ids
    output_bytes = 512 * 4 * 64 * 4  # partial sums for every bag of the global batch
    assert cost.io_memory == ids * 8 + output_bytes
    copy = BATCHED_COPY_PERF_FACTOR * output_bytes / t.hbm_mem_bw
    assert cost.comms == pytest.approx((ids * 8 + 2 * output_bytes) / t.intra_host_bw + copy)


def test_table_row_wise_crosses_hosts_with_one_local_share():
    t = topo(8, local=4)
    cost = estimate_shard(spec(), TWRW, FUSED, 250, 64, t)
    ids, output_bytes = 512 * 8 * 250 / 1000, 512 * 8 * 64 * 4
    across = output_bytes / 4 / t.inter_host_bw
    copy = BATCHED_COPY_PERF_FACTOR * output_bytes / t.hbm_mem_bw
    expected = ids * 8 / t.inter_host_bw + 2 * (output_bytes / t.intra_host_bw + across) + copy
    assert cost.comms == pytest.approx(expected)


def test_data_parallel_has_no_forward_comms_and_all_reduces_the_table():
    t = topo(4)
    cost = estimate_shard(spec(), DP, DENSE, 1000, 64, t)
    weights = 1000 * 64 * 4
    assert cost.comms == pytest.approx(weights * 2 * 3 / 4 / t.intra_host_bw)
    assert cost.memory == 2 * weights + 1000 * 4 + 512 * 8 + 512 * 64 * 4  # + a dense gradient
    lookup = (512 * 8 + 2 * 512 * 64 * 4) / (t.hbm_mem_bw / 2)
    update = DENSE_UPDATE_PERF_FACTOR * weights / t.hbm_mem_bw
    assert cost.compute == pytest.approx(lookup * (1 + t.bwd_compute_multiplier) + update)


def test_weighted_tables_move_a_weight_per_id():
    plain = estimate_shard(spec(), TW, FUSED, 1000, 64, topo(2))
    weighted = estimate_shard(spec(weighted=True), TW, FUSED, 1000, 64, topo(2))
    assert weighted.io_memory - plain.io_memory == 512 * 2 * 4
