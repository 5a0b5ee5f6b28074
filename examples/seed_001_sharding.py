"""Seed 001, "Exploring TorchRec sharding", run with shardkit.

    python examples/seed_001_sharding.py                  # table-wise, row-wise, column-wise, data-parallel
    python examples/seed_001_sharding.py table_row_wise   # also table-row-wise on 2 simulated hosts

The tutorial's code, unchanged but for the mechanical rewrite the README documents:
`torchrec` -> `shardkit` in imports, "cuda"/"nccl" -> "cpu"/"gloo"; the notebook's Colab set-up
cells (pip, sys.path) are dropped, and the calls at the bottom sit under `if __name__ ==
"__main__":`, which a script started with the spawn method needs. It uses the `multiprocess`
package as the tutorial does (`pip install 'shardkit[examples]'`).
Table-row-wise needs several hosts, which the seed could not show; the last function below
(not the seed's) simulates 2 hosts of 2 ranks with shardkit.launch.spawn.
"""

# ----- the seed's code (rewritten imports and devices) ------------------------------------
import os
import sys

import torch
import shardkit

os.environ["MASTER_ADDR"] = "localhost"
os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "29500")

from shardkit.distributed.planner.types import ParameterConstraints
from shardkit.distributed.embedding_types import EmbeddingComputeKernel
from shardkit.distributed.types import ShardingType
from typing import Dict

large_table_cnt = 2
small_table_cnt = 2
large_tables = [
    shardkit.EmbeddingBagConfig(
        name="large_table_" + str(i),
        embedding_dim=64,
        num_embeddings=4096,
        feature_names=["large_table_feature_" + str(i)],
        pooling=shardkit.PoolingType.SUM,
    )
    for i in range(large_table_cnt)
]
small_tables = [
    shardkit.EmbeddingBagConfig(
        name="small_table_" + str(i),
        embedding_dim=64,
        num_embeddings=1024,
        feature_names=["small_table_feature_" + str(i)],
        pooling=shardkit.PoolingType.SUM,
    )
    for i in range(small_table_cnt)
]


def gen_constraints(
    sharding_type: ShardingType = ShardingType.TABLE_WISE,
) -> Dict[str, ParameterConstraints]:
    large_table_constraints = {
        "large_table_" + str(i): ParameterConstraints(
            sharding_types=[sharding_type.value],
        )
        for i in range(large_table_cnt)
    }
    small_table_constraints = {
        "small_table_" + str(i): ParameterConstraints(
            sharding_types=[sharding_type.value],
        )
        for i in range(small_table_cnt)
    }
    constraints = {**large_table_constraints, **small_table_constraints}
    return constraints


ebc = shardkit.EmbeddingBagCollection(device="cpu", tables=large_tables + small_tables)


def single_rank_execution(
    rank: int,
    world_size: int,
    constraints: Dict[str, ParameterConstraints],
    module: torch.nn.Module,
    backend: str,
) -> None:
    import os
    import torch
    import torch.distributed as dist
    from shardkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from shardkit.distributed.model_parallel import DistributedModelParallel
    from shardkit.distributed.planner import EmbeddingShardingPlanner, Topology
    from shardkit.distributed.types import ModuleSharder, ShardingEnv
    from typing import cast

    def init_distributed_single_host(
        rank: int,
        world_size: int,
        backend: str,
        # pyre-fixme[11]: Annotation `ProcessGroup` is not defined as a type.
    ) -> dist.ProcessGroup:
        os.environ["RANK"] = f"{rank}"
        os.environ["WORLD_SIZE"] = f"{world_size}"
        dist.init_process_group(rank=rank, world_size=world_size, backend=backend)
        return dist.group.WORLD

    if backend == "nccl":
        device = torch.device(f"cuda:{rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    topology = Topology(world_size=world_size, compute_device="cpu")
    pg = init_distributed_single_host(rank, world_size, backend)
    planner = EmbeddingShardingPlanner(
        topology=topology,
        constraints=constraints,
    )
    sharders = [cast(ModuleSharder[torch.nn.Module], EmbeddingBagCollectionSharder())]
    plan: ShardingPlan = planner.collective_plan(module, sharders, pg)

    sharded_model = DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(pg),
        plan=plan,
        sharders=sharders,
        device=device,
    )
    print(f"rank:{rank},sharding plan: {plan}")
    return sharded_model


import multiprocess


def spmd_sharing_simulation(
    sharding_type: ShardingType = ShardingType.TABLE_WISE,
    world_size=2,
):
    ctx = multiprocess.get_context("spawn")
    processes = []
    for rank in range(world_size):
        p = ctx.Process(
            target=single_rank_execution,
            args=(
                rank,
                world_size,
                gen_constraints(sharding_type),
                ebc,
                "gloo",
            ),
        )
        p.start()
        processes.append(p)

    for p in processes:
        p.join()
        assert p.exitcode == 0


# ----- not in the seed: table-row-wise on 2 simulated hosts of 2 ranks ----------------------


def table_row_wise_on_two_hosts(rank: int, world_size: int) -> str:
    """Plan and shard the same tables table-row-wise over 4 ranks in 2 hosts of 2."""
    from shardkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from shardkit.distributed.model_parallel import DistributedModelParallel
    from shardkit.distributed.planner import EmbeddingShardingPlanner, Topology

    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device="cpu", local_world_size=2),
        constraints=gen_constraints(ShardingType.TABLE_ROW_WISE),
    )
    sharders = [EmbeddingBagCollectionSharder()]
    plan = planner.collective_plan(ebc, sharders)
    DistributedModelParallel(ebc, plan=plan, sharders=sharders, device=torch.device("cpu"))
    return f"rank:{rank},sharding plan: {plan}"


if __name__ == "__main__":
    spmd_sharing_simulation(ShardingType.TABLE_WISE)
    spmd_sharing_simulation(ShardingType.ROW_WISE)
    spmd_sharing_simulation(ShardingType.COLUMN_WISE)
    spmd_sharing_simulation(ShardingType.DATA_PARALLEL)
    if "table_row_wise" in sys.argv[1:]:
        from shardkit.launch import spawn

        for line in spawn(table_row_wise_on_two_hosts, world_size=4, local_world_size=2):
            print(line)
