"""The planner's data in TorchRec's vocabulary (``torchrec.distributed.planner.types``): storage
and perf of a shard, sharding options, hardware configs and the factory that turns them into a
`Topology`, and hashing helpers.

shardkit's own planner works on run-length encoded options (``_enumerate.Option``); these are
what `EmbeddingEnumerator.enumerate` returns and TorchRec's proposers, partitioners and stats
take, built from the same estimates.
"""

from __future__ import annotations

import abc
import enum
import hashlib
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from shardkit.planner import Topology

__all__ = [
    "BasicCommsBandwidths",
    "CollectiveType",
    "CriticalPathEstimate",
    "CustomTopologyData",
    "DeviceHardware",
    "GeneralizedCommsBandwidth",
    "HardwareConfig",
    "KernelConfig",
    "PartitionByType",
    "Perf",
    "PlanDebugStats",
    "Shard",
    "SharderData",
    "ShardingOption",
    "Storage",
    "TopologyConfigBase",
    "TopologyFactory",
    "TrainerConfig",
    "bytes_to_gb",
    "hash_sha256_str",
    "hash_sha256_to_int",
    "round_to_nearest",
    "sharder_name",
]


@dataclass
class Perf:
    """Milliseconds of one step of a shard, by part."""

    fwd_compute: float
    fwd_comms: float
    bwd_compute: float
    bwd_comms: float
    input_dist_comms: float = 0.0
    prefetch_compute: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def __add__(self, other: Perf) -> Perf:
        return Perf(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(self)))


@dataclass
class Storage:
    """Bytes of GPU memory (``hbm``), host memory (``ddr``) and SSD."""

    hbm: int
    ddr: int
    ssd: int = 0

    def __add__(self, other: Storage) -> Storage:
        return Storage(self.hbm + other.hbm, self.ddr + other.ddr, self.ssd + other.ssd)

    def __sub__(self, other: Storage) -> Storage:
        return Storage(self.hbm - other.hbm, self.ddr - other.ddr, self.ssd - other.ssd)

    def __hash__(self) -> int:
        return hash((self.hbm, self.ddr, self.ssd))

    def fits_in(self, other: Storage) -> bool:
        return self.hbm <= other.hbm and self.ddr <= other.ddr and self.ssd <= other.ssd


@dataclass
class DeviceHardware:
    """One rank: its free storage and the perf placed on it so far."""

    rank: int
    storage: Storage
    perf: Perf

    def __hash__(self) -> int:
        return hash((self.rank, self.storage, self.perf))


class CustomTopologyData:
    """Per-rank values a custom topology carries (``data[key]`` has ``world_size`` entries)."""

    supported_fields = ["ddr_cap", "hbm_cap"]

    def __init__(self, data: dict[str, list[int]], world_size: int) -> None:
        for key, values in data.items():
            if len(values) != world_size:
                raise ValueError(f"custom topology data {key!r} has {len(values)} values, "
                                 f"one per rank expected ({world_size})")  # fmt: skip
        self._data = dict(data)
        self._world_size = world_size

    def get_data(self, key: str) -> list[int]:
        if key not in self._data:
            raise KeyError(f"custom topology data has no {key!r}; it has {sorted(self._data)}")
        return self._data[key]

    def has_data(self, key: str) -> bool:
        return key in self._data


class CollectiveType(enum.Enum):
    ALL_TO_ALL = "all_to_all"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"


class GeneralizedCommsBandwidth(abc.ABC):
    """Bandwidth (bytes/ms) of a collective among ranks."""

    @abc.abstractmethod
    def get_bw(
        self, local_world_size: int, world_size: int, collective_type: CollectiveType
    ) -> float:
        """Bandwidth of ``collective_type`` over ``world_size`` ranks, ``local_world_size`` a host."""

    @property
    @abc.abstractmethod
    def intra_host_bw(self) -> float: ...

    @property
    @abc.abstractmethod
    def inter_host_bw(self) -> float: ...


class BasicCommsBandwidths(GeneralizedCommsBandwidth):
    """One bandwidth inside a host, one across hosts (TorchRec's defaults, bytes/ms)."""

    def __init__(self, inter_host_bw: float = 13421772.8, intra_host_bw: float = 644245094.4):
        self._inter, self._intra = inter_host_bw, intra_host_bw

    @property
    def inter_host_bw(self) -> float:
        return self._inter

    @property
    def intra_host_bw(self) -> float:
        return self._intra

    def get_bw(
        self, local_world_size: int, world_size: int, collective_type: CollectiveType
    ) -> float:
        return self._intra if world_size <= local_world_size else self._inter

    def __repr__(self) -> str:
        return f"BasicCommsBandwidths(inter_host_bw={self._inter}, intra_host_bw={self._intra})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BasicCommsBandwidths) and (self._inter, self._intra) == (
            other._inter, other._intra)  # fmt: skip

    def __hash__(self) -> int:
        return hash((self._inter, self._intra))


class TopologyConfigBase(abc.ABC):
    """A group of topology settings; ``additional_params`` holds the rest."""

    additional_params: dict[str, Any]

    def get_param(self, key: str, default: Any = None) -> Any:
        if hasattr(self, key) and key != "additional_params":
            return getattr(self, key)
        return self.additional_params.get(key, default)

    def has_param(self, key: str) -> bool:
        return (hasattr(self, key) and key != "additional_params") or key in self.additional_params

    def validate(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"{type(self).__name__}.{f.name} must be >= 0, got {value}")


@dataclass
class HardwareConfig(TopologyConfigBase):
    """Memory caps and bandwidths of the ranks (None: `Topology`'s default)."""

    hbm_cap_bytes: int | None = None
    ddr_cap_bytes: int | None = None
    ssd_cap_bytes: int | None = None
    intra_host_bw: float | None = None
    inter_host_bw: float | None = None
    hbm_mem_bw: float | None = None
    ddr_mem_bw: float | None = None
    hbm_to_ddr_mem_bw: float | None = None
    ssd_mem_bw: float | None = None
    additional_params: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainerConfig(TopologyConfigBase):
    """The job: ranks, ranks per host, memory caps (a dry run plans with the given bytes)."""

    world_size: int | None = None
    local_world_size: int | None = None
    hbm_cap_bytes: int | None = None
    ddr_cap_bytes: int | None = None
    ssd_cap_bytes: int | None = None
    is_dry_run: bool = False
    dry_run_hbm_bytes: int | None = None
    dry_run_ddr_bytes: int | None = None
    pod_size: int | None = None
    additional_params: dict[str, Any] = field(default_factory=dict)


@dataclass
class KernelConfig(TopologyConfigBase):
    """How the cost model counts: device, backward multipliers, comms bandwidths."""

    compute_device: str = "cuda"
    bwd_compute_multiplier: float = 2
    weighted_feature_bwd_compute_multiplier: float = 1
    uneven_sharding_perf_multiplier: float = 1.0
    use_hardware_based_bandwidth: bool = False
    generalized_comms_bandwidths: GeneralizedCommsBandwidth | None = None
    additional_params: dict[str, Any] = field(default_factory=dict)


class TopologyFactory:
    """Builds a `Topology` from a trainer, hardware and kernel config."""

    @staticmethod
    def create_topology(
        trainer_config: TrainerConfig | None = None,
        hardware_config: HardwareConfig | None = None,
        kernel_config: KernelConfig | None = None,
    ) -> Topology:
        trainer = trainer_config or TrainerConfig()
        hardware = hardware_config or HardwareConfig()
        kernel = kernel_config or KernelConfig()
        if trainer.world_size is None:
            raise ValueError("TrainerConfig.world_size is needed to build a Topology")
        dry = trainer.is_dry_run
        kwargs: dict[str, Any] = {
            "hbm_cap": (trainer.dry_run_hbm_bytes if dry else None) or trainer.hbm_cap_bytes
            or hardware.hbm_cap_bytes,
            "ddr_cap": (trainer.dry_run_ddr_bytes if dry else None) or trainer.ddr_cap_bytes
            or hardware.ddr_cap_bytes,
            "local_world_size": trainer.local_world_size,
            "bwd_compute_multiplier": kernel.bwd_compute_multiplier,
            "weighted_feature_bwd_compute_multiplier": kernel.weighted_feature_bwd_compute_multiplier,
            "generalized_comms_bandwidths": kernel.generalized_comms_bandwidths,
        }  # fmt: skip
        for name in ("intra_host_bw", "inter_host_bw", "hbm_mem_bw", "ddr_mem_bw"):
            if getattr(hardware, name) is not None:
                kwargs[name] = getattr(hardware, name)
        return Topology(trainer.world_size, kernel.compute_device, **kwargs)


@dataclass
class Shard:
    """A block of a table: ``size`` ``[rows, cols]`` at ``offset``, its estimates and rank."""

    size: list[int]
    offset: list[int]
    storage: Storage | None = None
    perf: Perf | None = None
    rank: int | None = None

    def __hash__(self) -> int:
        return hash((tuple(self.size), tuple(self.offset), self.storage, self.perf, self.rank))


class ShardingOption:
    """One way to shard one table: its sharding type, kernel and shards (TorchRec's fields).

    Args: see TorchRec's; ``module`` is ``(path, module)`` of the collection holding the table.
    """

    def __init__(self, name: str, tensor: torch.Tensor, module: tuple[str, nn.Module],
                 input_lengths: list[float], batch_size: int, sharding_type: str,
                 partition_by: str, compute_kernel: str, shards: list[Shard],
                 cache_params: Any = None, enforce_hbm: bool | None = None,
                 stochastic_rounding: bool | None = None, bounds_check_mode: Any = None,
                 dependency: str | None = None, is_pooled: bool | None = None,
                 feature_names: list[str] | None = None, output_dtype: Any = None,
                 key_value_params: Any = None, num_poolings: list[float] | None = None) -> None:  # fmt: skip
        self.name, self._tensor, self._module = name, tensor, module
        self.input_lengths, self.batch_size = input_lengths, batch_size
        self.sharding_type, self.partition_by = str(sharding_type), str(partition_by)
        self.compute_kernel, self.shards = str(compute_kernel), shards
        self.cache_params, self.enforce_hbm = cache_params, enforce_hbm
        self.stochastic_rounding, self.bounds_check_mode = stochastic_rounding, bounds_check_mode
        self.dependency, self.feature_names = dependency, feature_names
        self.output_dtype, self.key_value_params = output_dtype, key_value_params
        self.num_poolings = num_poolings
        self._is_pooled = (
            is_pooled if is_pooled is not None else hasattr(module[1], "embedding_bag_configs")
        )
        self.is_weighted = getattr(module[1], "is_weighted", lambda: None)()

    @property
    def tensor(self) -> torch.Tensor:
        return self._tensor

    @property
    def module(self) -> tuple[str, nn.Module]:
        return self._module

    @property
    def path(self) -> str:
        return self._module[0]

    @property
    def fqn(self) -> str:
        return f"{self.path}.{self.name}"

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def num_inputs(self) -> int:
        return len(self.input_lengths)

    @property
    def total_storage(self) -> Storage:
        total = Storage(0, 0)
        for shard in self.shards:
            total = total + (shard.storage or Storage(0, 0))
        return total

    @property
    def total_perf(self) -> float:
        return sum(shard.perf.total for shard in self.shards if shard.perf is not None)

    @property
    def is_pooled(self) -> bool:
        return self._is_pooled

    @property
    def cache_load_factor(self) -> float | None:
        return None if self.cache_params is None else self.cache_params.load_factor

    @property
    def module_type_key(self) -> str:
        kind = type(self._module[1])
        return f"{kind.__module__}.{kind.__name__}"

    def get_shards_assignment(self) -> list[int | None]:
        return [shard.rank for shard in self.shards]

    def __hash__(self) -> int:
        return hash((self.fqn, self.sharding_type, self.compute_kernel,
                     tuple(self.shards), self.cache_params))  # fmt: skip

    def __str__(self) -> str:
        return (f"ShardingOption(name={self.name}, sharding_type={self.sharding_type}, "
                f"compute_kernel={self.compute_kernel}, num_shards={self.num_shards})")  # fmt: skip

    __repr__ = __str__


class PartitionByType(enum.Enum):
    """How a partitioner places an option's shards."""

    DEVICE = "device"
    HOST = "host"
    UNIFORM = "uniform"
    MULTI_HOST = "multi_host"


@dataclass
class SharderData:
    fused_params: dict[str, Any]
    qcomm_dtype_sizes: dict[str, tuple[float, float]]
    storage_usage_type: Any


@dataclass
class CriticalPathEstimate:
    comms_estimate: float
    comp_estimate: float

    def total(self) -> float:
        return self.comms_estimate + self.comp_estimate


@dataclass
class PlanDebugStats:
    planner_type: str
    timeout_seconds: int | None


def hash_sha256_to_int(hashable_list: list[Any]) -> int:
    """SHA-256 of ``str(hashable_list)`` as an integer."""
    return int(hash_sha256_str(hashable_list), 16)


def hash_sha256_str(hashable_list: list[Any]) -> str:
    """SHA-256 of ``str(hashable_list)`` as hex text."""
    return hashlib.sha256(str(hashable_list).encode("utf-8")).hexdigest()


def round_to_nearest(x: int, unit: int) -> int:
    """``x`` rounded to a multiple of ``unit``."""
    return round(x / unit) * unit


def bytes_to_gb(num_bytes: int) -> float:
    return float(num_bytes / (1024 * 1024 * 1024))


def sharder_name(t: type) -> str:
    """``module.Class`` of a sharder type."""
    return f"{t.__module__}.{t.__name__}"
