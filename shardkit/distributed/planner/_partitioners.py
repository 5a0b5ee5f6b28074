"""TorchRec's partitioners (``torchrec.distributed.planner.partitioners``) and stats
(``.stats``) over `ShardingOption`s: place a proposal's shards on ranks, greedily by perf or by
memory, and report a placed plan."""

from __future__ import annotations

import copy
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from shardkit.distributed.planner._components import _raise_no_fit
from shardkit.distributed.planner._tr_interfaces import Partitioner, Stats
from shardkit.distributed.planner._tr_types import DeviceHardware, Perf, ShardingOption, Storage
from shardkit.planner import PlannerError, Topology

__all__ = [
    "IMBALANCE_STAT_MEASURE",
    "MIN_WIDTH",
    "EmbeddingStats",
    "GreedyPerfPartitioner",
    "MemoryBalancedPartitioner",
    "NoopEmbeddingStats",
    "OrderedDeviceHardware",
    "ShardingOptionGroup",
    "SortBy",
    "round_to_one_sigfig",
]

logger = logging.getLogger(__name__)


class SortBy(enum.Enum):
    STORAGE = "storage"
    PERF = "perf"


@dataclass
class ShardingOptionGroup:
    """Options placed together, with their summed storage and perf."""

    sharding_options: list[ShardingOption]
    storage_sum: Storage
    perf_sum: float
    param_count: int


@dataclass
class OrderedDeviceHardware:
    """A rank, ordered by perf placed on it, then local rank, then rank."""

    device: DeviceHardware
    local_world_size: int

    def _key(self) -> tuple:
        rank = self.device.rank
        return (self.device.perf.total, rank % self.local_world_size, rank)

    def __lt__(self, other: OrderedDeviceHardware) -> bool:
        return self._key() < other._key()


def _devices(topology: Topology) -> list[DeviceHardware]:
    hbm, ddr = topology.hbm_cap, topology.ddr_cap
    assert hbm is not None and ddr is not None, "Topology.__post_init__ fills the capacities"
    free = Storage(hbm, ddr)
    return [
        DeviceHardware(r, copy.copy(free), Perf(0, 0, 0, 0)) for r in range(topology.world_size)
    ]


class GreedyPerfPartitioner(Partitioner):
    """Places the options biggest first (by storage, or by perf), each shard on the rank with
    the least perf so far that has room; a uniform option's shard ``i`` on rank ``i``, a host
    option's shards on the ranks of one host."""

    _shardkit_component: ClassVar[str] = "partitioner"  # its part: planner/_resolve

    _order_by_storage = False  # pick ranks by placed perf (memory-balanced: by used memory)

    def __init__(self, sort_by: SortBy = SortBy.STORAGE, balance_modules: bool = False) -> None:
        self._sort_by = SortBy(sort_by)

    def partition(
        self, proposal: list[ShardingOption], storage_constraint: Topology
    ) -> list[ShardingOption]:
        placed = copy.deepcopy(proposal)
        devices = _devices(storage_constraint)
        local = self._local = storage_constraint.intra_group_size
        key = (lambda o: _bytes(o.total_storage)) if self._sort_by == SortBy.STORAGE else (
            lambda o: o.total_perf)  # fmt: skip
        for option in sorted(placed, key=key, reverse=True):
            if option.partition_by == "uniform":
                ranks = list(range(len(option.shards)))
            elif option.partition_by == "host":
                ranks = self._host(option, devices, local)
            else:
                ranks = self._spread(option, devices, range(len(devices)))
            for shard, rank in zip(option.shards, ranks):
                self._take(devices[rank], shard, option)
        return placed

    def _rank_key(self, device: DeviceHardware, local: int) -> tuple:
        if self._order_by_storage:
            return (-_bytes(device.storage), device.rank)
        return OrderedDeviceHardware(device, local)._key()

    def _spread(
        self, option: ShardingOption, devices: list[DeviceHardware], candidates
    ) -> list[int]:
        """A rank for each shard (a table's shards on distinct ranks); nothing is taken yet."""
        free = {d.rank: d.storage for d in devices if d.rank in candidates}
        ranks: list[int] = []
        for shard in option.shards:
            storage = shard.storage
            assert storage is not None, "enumerated shards carry their storage estimate"
            fits = [d for d in devices if d.rank in free and d.rank not in ranks
                    and storage.fits_in(free[d.rank])]  # fmt: skip
            if not fits:
                _raise_no_fit(f"no rank has room for a shard {shard.size} of table {option.fqn!r}")
            best = min(fits, key=lambda d: self._rank_key(d, self._local))
            ranks.append(best.rank)
            free[best.rank] = free[best.rank] - storage
        return ranks

    def _host(self, option: ShardingOption, devices: list[DeviceHardware], local: int) -> list[int]:
        for host in sorted(range(len(devices) // local),
                           key=lambda h: sum(devices[r].perf.total for r in range(h * local, (h + 1) * local))):  # fmt: skip
            try:
                return self._spread(option, devices, range(host * local, (host + 1) * local))
            except PlannerError:
                continue
        _raise_no_fit(f"no host has room for the shards of table {option.fqn!r}")
        return []

    @staticmethod
    def _take(device: DeviceHardware, shard: Any, option: ShardingOption) -> None:
        if not shard.storage.fits_in(device.storage):
            _raise_no_fit(f"rank {device.rank} has no room for a shard of table {option.fqn!r}")
        device.storage = device.storage - shard.storage
        device.perf = device.perf + shard.perf
        shard.rank = device.rank


class MemoryBalancedPartitioner(GreedyPerfPartitioner):
    """`GreedyPerfPartitioner` that puts each shard on the rank with the most free memory."""

    _order_by_storage = True

    def __init__(self, max_search_count: int = 10, tolerance: float = 0.02,
                 balance_modules: bool = False) -> None:  # fmt: skip
        super().__init__(SortBy.STORAGE, balance_modules)


def _bytes(storage: Storage) -> int:
    return storage.hbm + storage.ddr


# Imbalance of a distribution ``p`` over ranks (shares summing to 1) against the uniform one.
def _total_variation(p: list[float]) -> float:
    return max(abs(x - 1 / len(p)) for x in p)


def _total_distance(p: list[float]) -> float:
    return sum(abs(x - 1 / len(p)) for x in p)


def _chi_divergence(p: list[float]) -> float:
    k = len(p)
    most = ((k - 1) / k) ** 2 * k + (k - 1) / k  # all on one rank
    value = sum((x - 1 / k) ** 2 * k for x in p)
    return value / most if most > 0 else 0.0


def _kl_divergence(p: list[float]) -> float:
    k = len(p)
    value = sum(x * math.log(x * k) for x in p if x > 0)
    return value / math.log(k) if k > 1 else 0.0


# name -> (measure, its keyword arguments), as TorchRec's stats table reports them
IMBALANCE_STAT_MEASURE: dict[str, tuple[Callable[..., float], dict[str, Any]]] = {
    "Total Variation": (_total_variation, {}),
    "Total Distance": (_total_distance, {}),
    "Chi Divergence": (_chi_divergence, {}),
    "KL Divergence": (_kl_divergence, {}),
}
MIN_WIDTH = 90  # characters of the stats table


def round_to_one_sigfig(x: float) -> str:
    """``x`` with one significant figure: 1234 -> ``"1000"``."""
    return f"{float(f'{x:.1g}'):g}"


class EmbeddingStats(Stats):
    """Logs (INFO) each rank's storage and perf of a placed plan and keeps the lines in
    ``last_report``."""

    _shardkit_component: ClassVar[str] = "stats"  # its part: planner/_resolve

    def __init__(self) -> None:
        self.last_report: list[str] = []

    def log(self, sharding_plan: Any, topology: Topology, batch_size: int, storage_reservation: Any,
            num_proposals: int, num_plans: int, run_time: float, best_plan: list[ShardingOption],
            constraints: Any = None, sharders: Any = None, debug: bool = True, **kwargs: Any) -> None:  # fmt: skip
        used = [Storage(0, 0) for _ in range(topology.world_size)]
        perf = [0.0] * topology.world_size
        for option in best_plan:
            for shard in option.shards:
                if shard.rank is not None:
                    used[shard.rank] = used[shard.rank] + (shard.storage or Storage(0, 0))
                    perf[shard.rank] += shard.perf.total if shard.perf is not None else 0.0
        lines = [
            f"{num_proposals} proposals, {num_plans} plans, {run_time:.2f} s, batch {batch_size}"
        ]
        lines += [
            f"rank {r}: {_bytes(u) / 2**30:.3g} GiB, {p:.3g} ms"
            for r, (u, p) in enumerate(zip(used, perf))
        ]
        self.last_report = lines
        logger.info("\n".join(lines))


class NoopEmbeddingStats(Stats):
    """Reports nothing."""

    _shardkit_component: ClassVar[str] = "no stats"  # its part: planner/_resolve

    def log(self, *args: Any, **kwargs: Any) -> None:
        return None
