"""Topology and constraints: memory read from the machine unless given (TorchRec's constants
where the machine cannot tell), and errors that give value, rule and fix.
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
    _machine,
    split_evenly,
)
from shardkit.planner._enumerate import expand, offsets_of, size_groups

GIB = 1024**3


@pytest.fixture
def machine(monkeypatch):
    """Plan as if on a machine with 64 GiB of memory and an 80 GiB GPU."""
    monkeypatch.setattr(_machine, "host_memory", lambda: 64 * GIB)
    monkeypatch.setattr(_machine, "gpu_memory", lambda: 80 * GIB)


def test_topology_reads_memory_from_the_machine(machine):
    cpu = Topology(world_size=8, compute_device="cpu", local_world_size=4)
    assert (cpu.hbm_cap, cpu.ddr_cap, cpu.memory_per_rank) == (0, 16 * GIB, 16 * GIB)
    assert cpu.memory_source == "this machine's 64 GiB / 4 local ranks"
    one_host = Topology(world_size=2, compute_device="cpu")  # local_world_size: all ranks
    assert one_host.ddr_cap == 32 * GIB and one_host.local_world_size == 2
    cuda = Topology(world_size=16, compute_device="cuda", local_world_size=8)
    assert (cuda.hbm_cap, cuda.ddr_cap, cuda.memory_per_rank) == (80 * GIB, 8 * GIB, 80 * GIB)
    assert cuda.memory_source == "the GPU's"


def test_given_capacities_override_the_machine(monkeypatch):
    def unread():
        raise AssertionError("a given capacity must not read the machine")

    monkeypatch.setattr(_machine, "host_memory", unread)
    monkeypatch.setattr(_machine, "gpu_memory", unread)
    cpu = Topology(world_size=2, compute_device="cpu", ddr_cap=3 * GIB)
    assert cpu.memory_per_rank == 3 * GIB and cpu.memory_source == "given"
    cuda = Topology(world_size=2, compute_device="cuda", hbm_cap=GIB, ddr_cap=2 * GIB)
    assert (cuda.memory_per_rank, cuda.ddr_cap, cuda.memory_source) == (GIB, 2 * GIB, "given")
    assert cpu == Topology(world_size=2, compute_device="cpu", ddr_cap=3 * GIB, hbm_cap=0)


def test_topology_falls_back_to_torchrec_defaults(monkeypatch):
    monkeypatch.setattr(_machine, "host_memory", lambda: None)
    monkeypatch.setattr(_machine, "gpu_memory", lambda: None)  # planning for GPUs without one
    cuda = Topology(world_size=16, compute_device="cuda", local_world_size=8)
    assert (cuda.hbm_cap, cuda.ddr_cap, HBM_CAP, DDR_CAP) == (
        32 * GIB,
        128 * GIB,
        32 * GIB,
        128 * GIB,
    )
    assert cuda.memory_source == "TorchRec's default: no GPU here"
    assert cuda.intra_host_bw == 600 * GIB / 1000 and cuda.inter_host_bw == 12.5 * GIB / 1000
    assert cuda.hbm_mem_bw == 897 * GIB / 1000 and cuda.ddr_mem_bw == 51 * GIB / 1000
    assert cuda.num_hosts == 2 and cuda.memory_per_rank == 32 * GIB and BATCH_SIZE == 512
    cpu = Topology(world_size=4, compute_device="cpu")
    assert cpu.hbm_cap == 0 and cpu.memory_per_rank == 128 * GIB and cpu.local_world_size == 4
    assert cpu.memory_bw == cpu.ddr_mem_bw
    assert cpu.memory_source == "TorchRec's default: the OS does not say"


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({}, 100 * GIB),  # no cgroup files: the physical memory
        ({"memory.max": "max\n"}, 100 * GIB),  # cgroup v2 without a limit
        ({"memory.max": "17179869184\n"}, 16 * GIB),  # a 16 GiB container
        ({"limit_in_bytes": "9223372036854771712\n"}, 100 * GIB),  # cgroup v1's "no limit"
        ({"limit_in_bytes": "8589934592\n"}, 8 * GIB),
        ({"memory.max": str(200 * GIB)}, 100 * GIB),  # a limit above the machine's memory
    ],
)
def test_host_memory_is_the_smaller_of_physical_and_container_limit(
    monkeypatch, tmp_path, limits, expected
):
    pages = {"SC_PHYS_PAGES": 100 * GIB // 4096, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(_machine.os, "sysconf", pages.__getitem__)
    paths = (tmp_path / "memory.max", tmp_path / "limit_in_bytes")
    for path in paths:
        if path.name in limits:
            path.write_text(limits[path.name])
    monkeypatch.setattr(_machine, "_CGROUP_LIMITS", paths)
    assert _machine.host_memory() == expected


def test_machine_readings_without_a_gpu_or_sysconf(monkeypatch):
    monkeypatch.setattr(_machine.torch.cuda, "is_available", lambda: False)
    assert _machine.gpu_memory() is None

    def no_sysconf(name):
        raise ValueError(name)

    monkeypatch.setattr(_machine.os, "sysconf", no_sysconf)
    assert _machine.host_memory() is None
    this_machine = Topology(world_size=1, compute_device="cpu")
    assert this_machine.ddr_cap == DDR_CAP


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


def test_topology_takes_torchrec_1_8s_arguments_in_its_order():
    by_position = Topology(4, "cpu", None, 2**30, None, 2)  # ssd_cap is fifth in TorchRec 1.8
    assert by_position == Topology(
        world_size=4, compute_device="cpu", ddr_cap=2**30, local_world_size=2
    )
    assert by_position.local_world_size == 2 and by_position.num_hosts == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ssd_cap": 2**40}, r"ssd_cap=1099511627776: SSD tables are FBGEMM kernels"),
        (
            {"custom_topology_data": object()},
            r"custom_topology_data: shardkit plans ranks with equal",
        ),
        (
            {"uneven_sharding_perf_multiplier": 2.0},
            r"uneven_sharding_perf_multiplier=2.0: shardkit",
        ),
    ],
)
def test_topology_refuses_torchrec_fields_it_cannot_honour(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Topology(world_size=2, compute_device="cpu", **kwargs)


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
