"""TorchRec's planner components live at the edge (``shardkit.distributed.planner``) and the
planner, which does not import them, takes them by the part each declares (see
[Note: TorchRec's planner components])."""

from __future__ import annotations

import logging

import pytest

from shardkit.distributed.planner import EmbeddingPlannerBase, EmbeddingShardingPlanner
from shardkit.distributed.planner.enumerators import EmbeddingEnumerator
from shardkit.distributed.planner.partitioners import GreedyPerfPartitioner
from shardkit.distributed.planner.proposers import GreedyProposer, GridSearchProposer
from shardkit.distributed.planner.stats import EmbeddingStats, NoopEmbeddingStats
from shardkit.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from shardkit.distributed.planner.types import Proposer, StorageReservation
from shardkit.planner import ParameterConstraints, ShardingType, Topology
from shardkit.sharding import EmbeddingBagCollectionSharder
from tests.planner._helpers import meta_ebc, seed_tables

TOPOLOGY = Topology(world_size=2, compute_device="cpu")


class _MyProposer(Proposer):
    def load(self, search_space, enumerator=None):
        pass

    def feedback(self, partitionable, plan=None, perf_rating=None, storage_constraint=None):
        pass

    def propose(self):
        return None


def test_the_edge_s_components_are_taken_and_the_enumerator_gives_its_constraints(caplog):
    tables = seed_tables()
    name = tables[0].name
    constraints = {name: ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value])}
    with caplog.at_level(logging.INFO, logger="shardkit.planner"):
        planner = EmbeddingShardingPlanner(
            topology=TOPOLOGY,
            enumerator=EmbeddingEnumerator(TOPOLOGY, batch_size=64, constraints=constraints),
            proposer=[GreedyProposer(), GridSearchProposer()],
            partitioner=GreedyPerfPartitioner(),
            stats=NoopEmbeddingStats(),
            storage_reservation=FixedPercentageStorageReservation(0.1),
        )
        plan = planner.plan(meta_ebc(tables), [EmbeddingBagCollectionSharder()])
    assert plan.plan[""][name].sharding_type == ShardingType.ROW_WISE.value
    # NoopEmbeddingStats: no stats table logged, only the line saying the search is shardkit's
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "planner: ['GreedyProposer', 'GridSearchProposer', 'GreedyPerfPartitioner'] accepted"
    ]
    assert EmbeddingShardingPlanner(topology=TOPOLOGY, stats=[EmbeddingStats()])._debug


def test_a_custom_component_is_refused_by_name():
    with pytest.raises(
        TypeError,
        match=r"proposer=_MyProposer\(\.\.\.\)\): .* pass GreedyProposer, UniformProposer, "
        r"GridSearchProposer, DynamicProgrammingProposer or leave proposer out",
    ):
        EmbeddingShardingPlanner(topology=TOPOLOGY, proposer=_MyProposer())
    with pytest.raises(TypeError, match=r"partitioner=GreedyProposer\(\.\.\.\)\).* pass Greedy"):
        EmbeddingShardingPlanner(topology=TOPOLOGY, partitioner=GreedyProposer())


def test_shardkit_s_planner_and_reservations_are_torchrec_s_kinds():
    assert isinstance(EmbeddingShardingPlanner(topology=TOPOLOGY), EmbeddingPlannerBase)
    assert isinstance(FixedPercentageStorageReservation(0.1), StorageReservation)
