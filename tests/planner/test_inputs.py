"""Topology and constraints: TorchRec's defaults, and errors that give value, rule and fix.
Even splits: no row or column dropped, offsets tile the table."""

from __future__ import annotations

import pytest

from shardkit.planner import (
    BATCH_SIZE,
    DDR_CAP,
    HBM_CAP,
    EmbeddingComputeKernel,
    ParameterConstraints,
    ShardingType,
    Topology,
    split_evenly,
)
from shardkit.planner._enumerate import expand, offsets_of, size_groups

GIB = 1024**3


def test_topology_has_torchrec_defaults():
    cuda = Topology(world_size=16, compute_device="cuda", local_world_size=8)
    assert (cuda.hbm_cap, cuda.ddr_cap, HBM_CAP, DDR_CAP) == (
        32 * GIB,
        128 * GIB,
        32 * GIB,
        128 * GIB,
    )
    assert cuda.intra_host_bw == 600 * GIB / 1000 and cuda.inter_host_bw == 12.5 * GIB / 1000
    assert cuda.hbm_mem_bw == 897 * GIB / 1000 and cuda.ddr_mem_bw == 51 * GIB / 1000
    assert cuda.num_hosts == 2 and cuda.memory_per_rank == 32 * GIB and BATCH_SIZE == 512
    cpu = Topology(world_size=4, compute_device="cpu")
    assert cpu.hbm_cap == 0 and cpu.memory_per_rank == 128 * GIB and cpu.local_world_size == 4
    assert cpu.memory_bw == cpu.ddr_mem_bw


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0, "compute_device": "cpu"}, r"world_size must be an int >= 1, got 0"),
        (
            {"world_size": 2, "compute_device": "tpu"},
            r"compute_device must be one of \['cpu', 'cuda'\], got 'tpu'",
        ),
        (
            {"world_size": 10, "compute_device": "cpu", "local_world_size": 4},
            r"world_size \(10\) must be a multiple of local_world_size \(4\).*divides world_size",
        ),
        (
            {"world_size": 2, "compute_device": "cuda", "hbm_cap": -1},
            r"hbm_cap must be an int >= 0, got -1",
        ),
        (
            {"world_size": 2, "compute_device": "cuda", "inter_host_bw": 0},
            r"inter_host_bw must be > 0 bytes/ms, got 0",
        ),
    ],
)
def test_topology_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Topology(**kwargs)


def test_topology_takes_torchrecs_first_five_arguments_by_position():
    by_position = Topology(4, "cpu", None, 2**30, 2)
    assert by_position == Topology(
        world_size=4, compute_device="cpu", ddr_cap=2**30, local_world_size=2
    )
    with pytest.raises(TypeError):  # beyond TorchRec's first five: keywords
        Topology(4, "cpu", None, None, 2, 1.0)  # type: ignore[misc]


def test_constraints_take_torchrec_strings_and_enums():
    c = ParameterConstraints(
        sharding_types=[ShardingType.ROW_WISE.value, "table_wise", ShardingType.ROW_WISE],
        compute_kernels=["fused", EmbeddingComputeKernel.DENSE],
        pooling_factors=[2.0, 10],
        batch_sizes=[128, 256],
    )
    assert c.sharding_types == (ShardingType.ROW_WISE, ShardingType.TABLE_WISE)
    assert c.compute_kernels == (EmbeddingComputeKernel.FUSED, EmbeddingComputeKernel.DENSE)
    assert c.num_inputs() == 2 and ParameterConstraints().num_inputs() is None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"sharding_types": ["diagonal"]}, ValueError, r"unknown sharding type 'diagonal'"),
        ({"sharding_types": []}, ValueError, r"sharding_types is empty: it would allow nothing"),
        (
            {"sharding_types": "row_wise"},
            TypeError,
            r"sharding_types must be a list, got 'row_wise'",
        ),
        (
            {"compute_kernels": ["quant"]},
            ValueError,
            r"unknown or unsupported compute kernel 'quant'",
        ),
        ({"min_partition": 0}, ValueError, r"min_partition must be an int >= 1 column, got 0"),
        (
            {"pooling_factors": [1.0, -2.0]},
            ValueError,
            r"pooling_factors must be a non-empty list of finite numbers > 0, got \[1.0, -2.0\]",
        ),
        ({"batch_sizes": [1.5]}, ValueError, r"batch_sizes must be ints, got \[1.5\]"),
        (
            {"pooling_factors": [1.0, 2.0], "num_poolings": [1.0]},
            ValueError,
            r"must have the same length; got lengths \{'pooling_factors': 2, 'num_poolings': 1\}",
        ),
    ],
)
def test_constraint_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        ParameterConstraints(**kwargs)


def test_ten_rows_on_three_ranks_are_four_three_three():
    assert split_evenly(10, 3) == [4, 3, 3]
    assert size_groups(10, 3) == ((1, 4), (2, 3))
    assert size_groups(8, 4) == ((4, 2),)
    assert offsets_of([4, 3, 3]) == [0, 4, 7]


@pytest.mark.parametrize("total", [1, 2, 7, 10, 64, 1000, 4097])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7, 8])
def test_even_splits_tile_exactly(total, parts):
    sizes = split_evenly(total, parts)
    assert len(sizes) == parts and sum(sizes) == total and max(sizes) - min(sizes) <= 1
    assert expand(size_groups(total, parts)) == sizes
    offsets = offsets_of(sizes)
    assert all(o + s == n for o, s, n in zip(offsets, sizes, [*offsets[1:], total]))
