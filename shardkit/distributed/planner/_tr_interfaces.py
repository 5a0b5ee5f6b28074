"""TorchRec's planner component interfaces (``torchrec.distributed.planner.types``) and the base
of its planners. shardkit's planner is one pipeline (see ``_core``); its TorchRec-style
components (``_components``) implement these interfaces, and `EmbeddingShardingPlanner` takes
them (a custom implementation of an interface is refused by name: shardkit's search does not
call out to components)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from shardkit.distributed.planner._tr_types import (
    ShardingOption,
    hash_sha256_str,
    hash_sha256_to_int,
)
from shardkit.planner import (
    EmbeddingShardingPlanner,
    FixedAbsoluteStorageReservation,
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
    InferenceStorageReservation,
    ParameterConstraints,
    PlanResult,
    Topology,
)
from shardkit.planner.steps import plan_on_rank_zero, process_group
from shardkit.types import ModuleSharder, ShardingPlan, ShardingPlanner

__all__ = [
    "EmbeddingPlannerBase",
    "Enumerator",
    "Partitioner",
    "PerfModel",
    "PlanLoader",
    "Proposer",
    "ShardEstimator",
    "Stats",
    "StorageReservation",
    "hash_planner_context_inputs",
    "hash_planner_context_inputs_str",
]


class StorageReservation(abc.ABC):
    """What each rank keeps back from the tables; shardkit's reservations implement
    ``reserve(topology, *, input_bytes, dense_parameter_bytes) -> Reservation``."""

    @abc.abstractmethod
    def reserve(self, topology: Topology, *args: Any, **kwargs: Any) -> Any:
        """Each rank's capacity and what is kept back of it."""


class PerfModel(abc.ABC):
    @abc.abstractmethod
    def rate(self, plan: list[ShardingOption]) -> float:
        """A score of a placed plan (lower is better)."""


class ShardEstimator(abc.ABC):
    """Fills in the storage or perf of sharding options' shards."""

    def __init__(self, topology: Topology, constraints: Mapping[str, ParameterConstraints] | None = None) -> None:  # fmt: skip
        self._topology = topology
        self._constraints = constraints

    @abc.abstractmethod
    def estimate(self, sharding_options: list[ShardingOption], sharder_map: Any = None) -> None:
        """Set each shard's estimate."""


class Enumerator(abc.ABC):
    """Every way to shard each table of a module."""

    def __init__(self, topology: Topology, batch_size: int = 512,
                 constraints: Mapping[str, ParameterConstraints] | None = None,
                 estimator: Any = None) -> None:  # fmt: skip
        self.topology = topology
        self.batch_size = batch_size
        self.constraints = dict(constraints) if constraints is not None else None
        self.estimator = estimator

    @abc.abstractmethod
    def enumerate(self, module: nn.Module, sharders: list[ModuleSharder]) -> list[ShardingOption]:
        """Every sharding option of every table."""

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        """Re-run the estimators on ``sharding_options``."""
        return None


class Proposer(abc.ABC):
    """Proposes one option per table, learning from how each proposal fared."""

    @abc.abstractmethod
    def load(
        self, search_space: list[ShardingOption], enumerator: Enumerator | None = None
    ) -> None:
        """Take the options to choose from."""

    @abc.abstractmethod
    def feedback(self, partitionable: bool, plan: list[ShardingOption] | None = None,
                 perf_rating: float | None = None, storage_constraint: Topology | None = None) -> None:  # fmt: skip
        """How the last proposal fared."""

    @abc.abstractmethod
    def propose(self) -> list[ShardingOption] | None:
        """The next proposal, or None when done."""


class Partitioner(abc.ABC):
    """Places a proposal's shards on ranks (sets each shard's ``rank``)."""

    @abc.abstractmethod
    def partition(
        self, proposal: list[ShardingOption], storage_constraint: Topology
    ) -> list[ShardingOption]:
        """The proposal with every shard on a rank; PlannerError if it does not fit."""


class Stats(abc.ABC):
    """Reports a plan."""

    @abc.abstractmethod
    def log(self, sharding_plan: ShardingPlan, topology: Topology, batch_size: int,
            storage_reservation: Any, num_proposals: int, num_plans: int, run_time: float,
            best_plan: list[ShardingOption], constraints: Any = None, sharders: Any = None,
            debug: bool = False, **kwargs: Any) -> None:  # fmt: skip
        """Report ``sharding_plan``."""


class PlanLoader(abc.ABC):
    """Loads a stored plan (TorchRec's plan cache)."""

    @abc.abstractmethod
    def load(self) -> dict[int, ShardingOption] | None:
        """The stored plan, by sharding option hash."""

    @abc.abstractmethod
    def plan_context_hash(self) -> str:
        """The hash of the planning context the stored plan was made for."""


def _context(topology: Topology, batch_size: int, enumerator: Any, storage_reservation: Any,
             constraints: Mapping[str, ParameterConstraints] | None) -> list[Any]:  # fmt: skip
    return [
        topology.world_size, topology.compute_device, topology.hbm_cap, topology.ddr_cap,
        topology.local_world_size, topology.intra_host_bw, topology.inter_host_bw, batch_size,
        type(enumerator).__name__, repr(storage_reservation),
        sorted((name, repr(c)) for name, c in (constraints or {}).items()),
    ]  # fmt: skip


def hash_planner_context_inputs(
    topology: Topology, batch_size: int, enumerator: Any, storage_reservation: Any,
    constraints: Mapping[str, ParameterConstraints] | None,
    hash_function: Callable[[list[Any]], int] = hash_sha256_to_int,
) -> int:  # fmt: skip
    """A hash of what a plan depends on (topology, batch size, components, constraints)."""
    return hash_function(
        _context(topology, batch_size, enumerator, storage_reservation, constraints)
    )


def hash_planner_context_inputs_str(
    topology: Topology, batch_size: int, enumerator: Any, storage_reservation: Any,
    constraints: Mapping[str, ParameterConstraints] | None,
    hash_function: Callable[[list[Any]], str] = hash_sha256_str,
) -> str:  # fmt: skip
    """`hash_planner_context_inputs` as hex text."""
    return hash_function(
        _context(topology, batch_size, enumerator, storage_reservation, constraints)
    )


class EmbeddingPlannerBase(ShardingPlanner):
    """The base of TorchRec's embedding planners: `plan` for one rank; `collective_plan` plans
    on rank 0 and broadcasts (`EmbeddingShardingPlanner` is shardkit's)."""

    @abc.abstractmethod
    def plan(self, module: nn.Module, sharders: Sequence[ModuleSharder]) -> ShardingPlan:
        """The plan for ``module``."""

    def collective_plan(self, module: nn.Module, sharders: Sequence[ModuleSharder] | None = None,
                        pg: Any = None) -> ShardingPlan:  # fmt: skip
        if sharders is None:
            raise ValueError(
                "collective_plan needs sharders, e.g. [EmbeddingBagCollectionSharder()]"
            )
        planned = plan_on_rank_zero(
            # A TorchRec-style plan() has no estimates; plan_on_rank_zero passes the None on.
            lambda: PlanResult(self.plan(module, sharders), None),  # type: ignore[arg-type]
            process_group(pg),
        )
        return planned.plan


# shardkit's planner and reservations (which know nothing of the edge) are TorchRec's kinds.
EmbeddingPlannerBase.register(EmbeddingShardingPlanner)
StorageReservation.register(HeuristicalStorageReservation)
StorageReservation.register(FixedPercentageStorageReservation)
StorageReservation.register(FixedAbsoluteStorageReservation)
StorageReservation.register(InferenceStorageReservation)
