"""`EmbeddingShardingPlanner`: TorchRec's planner interface over shardkit's pure pipeline."""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.launch import local_world_size
from shardkit.modules import BaseEmbeddingConfig
from shardkit.planner._constants import BATCH_SIZE
from shardkit.planner._constraints import ParameterConstraints
from shardkit.planner._core import PlanResult, plan_sources
from shardkit.planner._errors import PlannerError, PlannerErrorType
from shardkit.planner._modules import config_sources, module_sources
from shardkit.planner._reservation import HeuristicalStorageReservation
from shardkit.planner._stats import PlanStats
from shardkit.planner._topology import Topology
from shardkit.types import ModuleSharder, ShardingPlan

__all__ = ["EmbeddingShardingPlanner"]

logger = logging.getLogger(__name__)


class EmbeddingShardingPlanner:
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
        *,
        constraints: Mapping[str, ParameterConstraints] | None = None,
        storage_reservation: HeuristicalStorageReservation | None = None,
        debug: bool = True,
    ) -> None:
        if topology is not None and not isinstance(topology, Topology):
            raise TypeError(f"topology must be a Topology, got {type(topology).__name__}")
        self._topology = topology
        self._batch_size = BATCH_SIZE if batch_size is None else batch_size
        self._constraints = dict(constraints or {})
        for name, value in self._constraints.items():
            if not isinstance(value, ParameterConstraints):
                raise TypeError(
                    f"constraints['{name}'] must be ParameterConstraints, got {value!r}"
                )
        self._reservation = storage_reservation or HeuristicalStorageReservation()
        self._debug = debug
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
        topology = self._require_topology()
        _check_sharders(sharders)
        start = time.perf_counter()
        sources, dense = module_sources(module, sharders, compute_device=topology.compute_device)
        result = plan_sources(
            sources,
            topology,
            constraints=self._constraints,
            batch_size=self._batch_size,
            storage_reservation=self._reservation,
            dense_parameter_bytes=dense,
        )
        return self._done(result, time.perf_counter() - start)

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
        start = time.perf_counter()
        sources = config_sources(
            tables,
            compute_device=topology.compute_device,
            module_path=module_path,
            is_weighted=is_weighted,
            fused_params=fused_params,
        )
        result = plan_sources(
            sources,
            topology,
            constraints=self._constraints,
            batch_size=self._batch_size,
            storage_reservation=self._reservation,
        )
        return self._done(result, time.perf_counter() - start)

    def collective_plan(
        self,
        module: nn.Module,
        sharders: Sequence[ModuleSharder] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """Plan on rank 0 of ``pg`` (default: the world) and broadcast the plan to every rank.

        If planning fails on rank 0, every rank raises the same error (no rank waits forever).
        """
        if pg is None:
            if not dist.is_initialized():
                raise RuntimeError(
                    "collective_plan needs a process group: call "
                    "torch.distributed.init_process_group() (or shardkit.launch.spawn) first, "
                    "or use plan() to plan without processes"
                )
            pg = dist.group.WORLD
        if sharders is None:
            raise ValueError(
                "collective_plan needs sharders, e.g. [EmbeddingBagCollectionSharder()] from "
                "shardkit.distributed.embeddingbag"
            )
        topology = self._topology or _topology_of(pg)
        size = dist.get_world_size(pg)
        if topology.world_size != size:
            raise ValueError(
                f"topology.world_size ({topology.world_size}) differs from the process group's "
                f"size ({size}); plan for the ranks that will run the model"
            )
        payload = None
        if dist.get_rank(pg) == 0:
            payload = _attempt(lambda: self._planned_with(topology, module, sharders))
        payload = comm.broadcast_object(payload, src=dist.get_global_rank(pg, 0), group=pg)
        status, value = payload
        if status == "error":
            raise value
        plan_json, stats = value
        self._stats = stats
        return ShardingPlan.from_json(plan_json)

    def _planned_with(self, topology, module, sharders) -> tuple[str, PlanStats]:
        saved = self._topology
        self._topology = topology
        try:
            plan = self.plan(module, sharders)
        finally:
            self._topology = saved
        assert self._stats is not None
        return plan.to_json(), self._stats

    def _require_topology(self) -> Topology:
        if self._topology is None:
            raise ValueError(
                "plan() needs a topology, e.g. EmbeddingShardingPlanner(topology=Topology("
                "world_size=8, compute_device='cuda')); collective_plan() can infer it"
            )
        return self._topology

    def _done(self, result: PlanResult, seconds: float) -> ShardingPlan:
        self._stats = result.stats
        if self._debug and result.stats.tables:
            logger.info(
                "planned %d tables on %d ranks in %.2f s (%d proposals)\n%s",
                len(result.stats.tables),
                result.stats.world_size,
                seconds,
                result.stats.num_proposals,
                result.stats,
            )
        return result.plan


def _check_sharders(sharders: Sequence[ModuleSharder]) -> None:
    for sharder in sharders:
        if not isinstance(sharder, ModuleSharder):
            raise TypeError(
                f"sharders must be ModuleSharder instances, got {type(sharder).__name__}"
            )


def _topology_of(pg: dist.ProcessGroup) -> Topology:
    size = dist.get_world_size(pg)
    device = "cuda" if dist.get_backend(pg) == "nccl" else "cpu"
    return Topology(world_size=size, compute_device=device, local_world_size=local_world_size(size))


def _attempt(fn) -> tuple[str, Any]:
    """("ok", fn()) or ("error", the exception), made safe to pickle for the broadcast."""
    try:
        return "ok", fn()
    except Exception as exc:
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            exc = PlannerError(f"{type(exc).__name__}: {exc}", PlannerErrorType.OTHER)
        return "error", exc
