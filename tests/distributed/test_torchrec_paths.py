"""Code written for TorchRec runs with ``torchrec`` -> ``shardkit`` in its imports (seeds
000/001, the planner part), and the thin modules stay thin."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import cast

import pytest
import torch

# The seed's imports, with torchrec renamed.
from shardkit.distributed.embedding_types import EmbeddingComputeKernel
from shardkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
from shardkit.distributed.planner import EmbeddingShardingPlanner, Topology
from shardkit.distributed.planner.types import (
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
)
from shardkit.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_row_wise,
    table_wise,
)
from shardkit.distributed.types import ModuleSharder, ShardingEnv, ShardingPlan, ShardingType
from shardkit.optim import apply_optimizer_in_backward
from tests.planner._helpers import meta_ebc, seed_tables
from tests.planner._seed_plans import SEED_PLANS, check_readable, tutorial_text


def gen_constraints(sharding_type: ShardingType = ShardingType.TABLE_WISE):
    """The seed's function, verbatim but for the table list."""
    large_table_constraints = {
        "large_table_" + str(i): ParameterConstraints(
            sharding_types=[sharding_type.value],
        )
        for i in range(2)
    }
    small_table_constraints = {
        "small_table_" + str(i): ParameterConstraints(
            sharding_types=[sharding_type.value],
        )
        for i in range(2)
    }
    constraints = {**large_table_constraints, **small_table_constraints}
    return constraints


def test_the_seed_planning_code_runs_and_prints_the_seed_plan():
    topology = Topology(world_size=2, compute_device="cuda")
    planner = EmbeddingShardingPlanner(topology=topology, constraints=gen_constraints())
    sharders = [cast(ModuleSharder, EmbeddingBagCollectionSharder())]
    plan: ShardingPlan = planner.plan(meta_ebc(seed_tables()), sharders)
    assert tutorial_text(plan) == SEED_PLANS["TABLE_WISE"]
    assert f"{plan}" == str(planner.stats)  # the planner's plans print its stats table
    check_readable(plan)
    assert plan.plan[""]["small_table_1"].compute_kernel == EmbeddingComputeKernel.FUSED.value


def test_torchrec_kernel_strings_are_understood():
    constraints = {"large_table_0": ParameterConstraints(compute_kernels=["dense"])}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"), constraints=constraints
    )
    plan = planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    assert plan.plan[""]["large_table_0"].compute_kernel == EmbeddingComputeKernel.DENSE


def test_planner_error_from_the_torchrec_path_says_why_and_survives_pickling():
    """TorchRec code catches PlannerError and reads its error_type; collective_plan pickles the
    error to send it from rank 0 to every rank, so the type must survive that too."""
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=1 << 20)  # 1 MiB per rank
    planner = EmbeddingShardingPlanner(topology=topology)
    with pytest.raises(
        PlannerError,
        match=r"2 of 4 tables have no way to be sharded on 2 ranks with 550 KiB for tables each"
        r"(.|\n)*table 'large_table_0' \(4096 x 64",
    ) as caught:
        planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    assert caught.value.error_type is PlannerErrorType.INSUFFICIENT_STORAGE
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is PlannerError and str(again) == str(caught.value)
    assert again.error_type is PlannerErrorType.INSUFFICIENT_STORAGE


def test_sharding_env_is_plain_data():
    env = ShardingEnv.from_local(world_size=4, rank=1)
    assert (env.world_size, env.rank, env.pg, env.process_group) == (4, 1, None, None)


def test_manual_plans_from_the_torchrec_path():
    ebc = meta_ebc(seed_tables())
    # TorchRec's generators plan FUSED for tables with an optimizer in backward, as the seed's
    apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.1})
    plan = construct_module_sharding_plan(
        ebc,
        {
            name: row_wise()
            for name in ["large_table_0", "large_table_1", "small_table_0", "small_table_1"]
        },
        sharder=EmbeddingBagCollectionSharder(),
        world_size=2,
        local_size=2,
        device_type="cuda",
    )
    assert tutorial_text(ShardingPlan({"": plan})) == SEED_PLANS["ROW_WISE"]
    check_readable(ShardingPlan({"": plan}))
    assert torch.Size([4096, 64]) == ebc.embedding_bags["large_table_0"].weight.shape


def test_torchrec_generators_choose_the_kernel_as_torchrec():
    """TorchRec's generators, given no kernel: FUSED where the table has an optimizer applied
    in backward, DENSE otherwise (its program then steps the table with its own optimizer);
    an explicit kernel wins; shardkit's own generators plan FUSED ([Note: the kernel a
    TorchRec generator chooses])."""
    from shardkit.sharding import table_wise as shardkit_table_wise

    ebc = meta_ebc(seed_tables())
    marked = ebc.embedding_bags["large_table_1"].weight
    apply_optimizer_in_backward(torch.optim.SGD, [marked], {"lr": 0.1})
    generators = {
        "large_table_0": table_wise(rank=0),
        "large_table_1": row_wise(),
        "small_table_0": column_wise(ranks=[0, 1]),
        "small_table_1": table_row_wise(host_index=0),
    }
    plan = construct_module_sharding_plan(
        ebc, generators, world_size=2, local_size=2, device_type="cpu"
    )
    kernels = {name: sharding.compute_kernel for name, sharding in plan.items()}
    assert kernels == {
        "large_table_0": "dense",
        "large_table_1": "fused",
        "small_table_0": "dense",
        "small_table_1": "dense",
    }
    explicit = {**generators, "large_table_0": table_wise(0, None, "fused")}
    plan = construct_module_sharding_plan(
        ebc, explicit, world_size=2, local_size=2, device_type="cpu"
    )
    assert plan["large_table_0"].compute_kernel == "fused"
    own = {name: shardkit_table_wise(rank=0) for name in generators}
    plan = construct_module_sharding_plan(ebc, own, world_size=2, local_size=2, device_type="cpu")
    assert {sharding.compute_kernel for sharding in plan.values()} == {"fused"}


# Each in a fresh interpreter, both started at once (each is mostly the import of shardkit).
FRESH = {
    # Seed 002 reaches DMP as ``torchrec.distributed.DistributedModelParallel`` after a bare
    # ``import torchrec``; the same must hold for shardkit.
    "dmp": (
        "import shardkit;"
        "from shardkit.sharding import DistributedModelParallel as DMP;"
        "assert shardkit.distributed.DistributedModelParallel is DMP;"
        "print('ok')"
    ),
    "planner": (
        "import logging, torch.distributed as dist, shardkit.planner, shardkit.sharding,"
        " shardkit.distributed.planner, shardkit.distributed.types, shardkit.distributed.embeddingbag;"
        "assert not dist.is_initialized();"
        "assert logging.getLogger().handlers == [];"
        "print('ok')"
    ),
}


@pytest.fixture(scope="module")
def fresh() -> dict[str, tuple[str, str]]:
    """(stdout, stderr) of each FRESH program."""
    procs = {
        name: subprocess.Popen([sys.executable, "-W", "ignore", "-c", code],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, code in FRESH.items()
    }  # fmt: skip
    try:
        return {name: proc.communicate(timeout=60) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_import_shardkit_gives_distributed_model_parallel(fresh):
    out, err = fresh["dmp"]
    assert out.strip() == "ok", err


def test_importing_the_planner_has_no_side_effects(fresh):
    out, err = fresh["planner"]
    assert out.strip() == "ok", err
