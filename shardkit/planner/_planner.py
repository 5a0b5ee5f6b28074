"""`EmbeddingShardingPlanner`: TorchRec's planner interface over shardkit's pure pipeline (TorchRec's
`EmbeddingPlannerBase`, at the edge, counts it as one of its own)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from shardkit.modules import BaseEmbeddingConfig
from shardkit.planner._collective import group_topology, plan_on_rank_zero, process_group
from shardkit.planner._constants import BATCH_SIZE
from shardkit.planner._core import PlannerSettings, PlanResult, make_plan
from shardkit.planner._inputs import ParameterConstraints, Topology
from shardkit.planner._resolve import resolve_components
from shardkit.planner._stats import PlanStats
from shardkit.planner._tables import TableSource, config_sources, module_sources
from shardkit.types import ModuleSharder, ShardingPlan, ShardingPlanner

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["EmbeddingShardingPlanner"]

logger = logging.getLogger(__name__)


class EmbeddingShardingPlanner(ShardingPlanner):
    """Plans how to shard the embedding tables of a model over ranks (TorchRec's interface).

    Planning is a pure function of the tables, the topology and the constraints: it starts no
    process, allocates no table and gives every rank the same plan. After each plan the stats
    table (per-rank memory and cost, per-table layout, imbalance) is logged at INFO and kept in
    `stats`.

    Args:
        topology: the ranks to plan for; if None, `collective_plan` uses its process group's
            size (`shardkit.launch.local_world_size` ranks per host) and device.
        batch_size: examples per rank per step (default 512).
        constraints: table name -> `ParameterConstraints`.
        storage_reservation: what each rank keeps back (default 15% of its memory, plus the
            dense model and input batches).
        debug: log the stats table (at INFO) after planning.
        enumerator, proposer, partitioner, performance_model, stats, callbacks,
            timeout_seconds, plan_loader: TorchRec's components, in TorchRec's order; see
            [Note: TorchRec's planner components] for what shardkit takes from each.

    Example::

        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=2, compute_device="cpu"),
            constraints={"large_table_0": ParameterConstraints(sharding_types=["row_wise"])},
        )
        plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
        plan                    # {'': {'large_table_0': ParameterSharding(...), ...}}
        str(planner.stats)      # per-rank memory and cost, per-table layout
    """

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        enumerator: Any = None,
        storage_reservation: Any = None,
        proposer: Any = None,
        partitioner: Any = None,
        performance_model: Any = None,
        stats: Any = None,
        constraints: Mapping[str, ParameterConstraints] | None = None,
        debug: bool = True,
        callbacks: Any = None,
        timeout_seconds: int | None = None,
        plan_loader: Any = None,
    ) -> None:
        if topology is not None and not isinstance(topology, Topology):
            raise TypeError(f"topology must be a Topology, got {type(topology).__name__}")
        parts = resolve_components(
            enumerator=enumerator, storage_reservation=storage_reservation, proposer=proposer,
            partitioner=partitioner, performance_model=performance_model, stats=stats,
            callbacks=callbacks, plan_loader=plan_loader, constraints=constraints,
            batch_size=batch_size,
        )  # fmt: skip
        if topology is None and enumerator is not None:
            topology = enumerator.topology
        self._topology = topology
        self._settings = PlannerSettings(
            constraints=parts.constraints,
            batch_size=BATCH_SIZE if parts.batch_size is None else parts.batch_size,
            storage_reservation=parts.storage_reservation,
        )
        self._debug = debug and parts.log_stats
        self._timeout_seconds = timeout_seconds  # shardkit's search is bounded: never hit
        self._stats: PlanStats | None = None

    @property
    def topology(self) -> Topology | None:
        return self._topology

    @property
    def stats(self) -> PlanStats | None:
        """The stats of the last plan (None before the first)."""
        return self._stats

    def plan(self, module: nn.Module, sharders: Sequence[ModuleSharder]) -> ShardingPlan:
        """The plan for every module of ``module`` that one of ``sharders`` handles."""
        return self._keep(self._plan_module(self._require_topology(), module, sharders))

    def plan_tables(
        self,
        tables: Sequence[BaseEmbeddingConfig],
        *,
        fused_params: Mapping[str, Any] | None = None,
        is_weighted: bool = False,
        module_path: str = "",
    ) -> ShardingPlan:
        """The plan for tables given as configs (no module needed); see `plan_tables`."""
        topology = self._require_topology()
        sources = config_sources(
            tables,
            compute_device=topology.compute_device,
            module_path=module_path,
            is_weighted=is_weighted,
            fused_params=fused_params,
        )
        return self._keep(self._run(sources, topology))

    def collective_plan(
        self,
        module: nn.Module,
        sharders: Sequence[ModuleSharder] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """Plan on rank 0 of ``pg`` (default: the world) and broadcast the plan to every rank.

        If planning fails on rank 0, every rank raises the same error (no rank waits forever).
        """
        group = process_group(pg)
        if sharders is None:
            raise ValueError(
                "collective_plan needs sharders, e.g. [EmbeddingBagCollectionSharder()] from "
                "shardkit.distributed.embeddingbag"
            )
        topology = group_topology(group, self._topology)
        return self._keep(
            plan_on_rank_zero(lambda: self._plan_module(topology, module, sharders), group)
        )

    def _plan_module(
        self, topology: Topology, module: nn.Module, sharders: Sequence[ModuleSharder]
    ) -> PlanResult:
        _check_sharders(sharders)
        sources, dense = module_sources(module, sharders, compute_device=topology.compute_device)
        return self._run(sources, topology, dense_parameter_bytes=dense)

    def _run(
        self, sources: Sequence[TableSource], topology: Topology, *, dense_parameter_bytes: int = 0
    ) -> PlanResult:
        start = time.perf_counter()
        result = make_plan(
            sources, topology, self._settings, dense_parameter_bytes=dense_parameter_bytes
        )
        if self._debug and result.stats.tables:
            logger.info(
                "planned %d tables on %d ranks in %.2f s (%d proposals)\n%s",
                len(result.stats.tables),
                result.stats.world_size,
                time.perf_counter() - start,
                result.stats.num_proposals,
                result.stats,
            )
        return result

    def _keep(self, result: PlanResult) -> ShardingPlan:
        self._stats = result.stats
        return result.plan

    def _require_topology(self) -> Topology:
        if self._topology is None:
            raise ValueError(
                "plan() needs a topology, e.g. EmbeddingShardingPlanner(topology=Topology("
                "world_size=8, compute_device='cuda')); collective_plan() can infer it"
            )
        return self._topology


def _check_sharders(sharders: Sequence[ModuleSharder]) -> None:
    for sharder in sharders:
        if not isinstance(sharder, ModuleSharder):
            raise TypeError(
                f"sharders must be ModuleSharder instances, got {type(sharder).__name__}"
            )
