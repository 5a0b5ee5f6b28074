"""What the planner is given besides the tables: the ranks (`Topology`), what the user allows or
knows about each table (`ParameterConstraints`) and how much of each rank's memory the tables may
use (`HeuristicalStorageReservation`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit.planner import _machine
from shardkit.planner._constants import (
    BWD_COMPUTE_MULTIPLIER,
    CROSS_NODE_BANDWIDTH,
    DDR_CAP,
    DDR_MEM_BW,
    DENSE_PARAMETER_MULTIPLIER,
    HBM_CAP,
    HBM_MEM_BW,
    HBM_TO_DDR_MEM_BW,
    INTRA_NODE_BANDWIDTH,
    KJT_BUFFER_COPIES,
    SSD_MEM_BW,
    STORAGE_RESERVE_PERCENTAGE,
    WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER,
)
from shardkit.planner._errors import PlannerError, PlannerErrorType, format_bytes
from shardkit.planner._profile import MachineProfile
from shardkit.types import EmbeddingComputeKernel, ShardingType, refuse_kernel_settings

__all__ = [
    "COMPUTE_DEVICES",
    "HeuristicalStorageReservation",
    "ParameterConstraints",
    "Reservation",
    "Topology",
]

COMPUTE_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Topology:
    """``world_size`` ranks in hosts of ``local_world_size``.

    Tables live in the memory of the compute device: HBM (``hbm_cap`` bytes per rank) on
    ``"cuda"``, host memory (``ddr_cap`` bytes per rank) on ``"cpu"``. Capacities not given are
    read from this machine when the topology is built: ``ddr_cap`` is its memory (the container's
    limit if lower) divided among the ``local_world_size`` ranks of a host, ``hbm_cap`` the
    current GPU's memory. Where the machine cannot tell (planning for GPUs on a machine without
    one), TorchRec's constants apply: 32 GiB HBM, 128 GiB DDR. Give the capacities to plan for
    another machine. `memory_source` says where the capacity tables live in came from.

    Args:
        world_size: number of ranks.
        compute_device: ``"cuda"`` or ``"cpu"``.
        hbm_cap: GPU memory per rank in bytes (default: the GPU's, else 32 GiB; 0 on ``"cpu"``).
        ddr_cap: host memory per rank in bytes (default: this machine's memory divided among
            ``local_world_size`` ranks, else 128 GiB).
        local_world_size: ranks per host (default ``world_size``: one host).
        hbm_mem_bw: GPU memory bandwidth, bytes/ms.
        ddr_mem_bw: host memory bandwidth, bytes/ms.
        intra_host_bw: bandwidth of a link between ranks of one host, bytes/ms.
        inter_host_bw: bandwidth of a rank's link to other hosts, bytes/ms.
        bwd_compute_multiplier: backward lookup cost / forward lookup cost.
        weighted_feature_bwd_compute_multiplier: extra backward factor for weighted features.
        ssd_cap, pod_size, ssd_mem_bw, hbm_to_ddr_mem_bw, custom_topology_data,
            uneven_sharding_perf_multiplier, generalized_comms_bandwidths, created_by_factory:
            TorchRec 1.8's other fields, in its order. shardkit has no SSD or UVM tables and
            plans ranks of equal memory: ``ssd_cap`` and ``custom_topology_data`` are refused
            when set, ``uneven_sharding_perf_multiplier`` unless 1.0; the SSD/UVM bandwidths and
            ``pod_size`` are kept but unused; a `BasicCommsBandwidths` sets the two bandwidths.
        profile: a `MachineProfile` the ranks run on (``shardkit bench calibrate``): the costs
            become predicted milliseconds from its measurements, and the plan carries a
            predicted step time (see docs/planner.md). `from_profile` builds such a topology.

    Example::

        Topology(world_size=16, compute_device="cuda", local_world_size=8)  # 2 hosts of 8 GPUs
        Topology(world_size=2, compute_device="cpu", ddr_cap=8 * 1024**3)  # 8 GiB per rank
        Topology.from_profile(load_profile("profile.json"), world_size=4)  # calibrated
    """

    world_size: int
    compute_device: str
    hbm_cap: int | None = None
    ddr_cap: int | None = None
    ssd_cap: int | None = None
    local_world_size: int | None = None
    pod_size: int | None = None
    hbm_mem_bw: float = HBM_MEM_BW
    ddr_mem_bw: float = DDR_MEM_BW
    ssd_mem_bw: float = SSD_MEM_BW
    hbm_to_ddr_mem_bw: float = HBM_TO_DDR_MEM_BW
    intra_host_bw: float = INTRA_NODE_BANDWIDTH
    inter_host_bw: float = CROSS_NODE_BANDWIDTH
    bwd_compute_multiplier: float = BWD_COMPUTE_MULTIPLIER
    custom_topology_data: Any = None
    weighted_feature_bwd_compute_multiplier: float = WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER
    uneven_sharding_perf_multiplier: float = 1.0
    generalized_comms_bandwidths: Any = None
    created_by_factory: bool = False
    profile: MachineProfile | None = None
    memory_source: str = field(init=False, compare=False, repr=False)

    @classmethod
    def from_profile(
        cls,
        profile: MachineProfile,
        *,
        world_size: int,
        local_world_size: int | None = None,
        hbm_cap: int | None = None,
        ddr_cap: int | None = None,
    ) -> Topology:
        """``world_size`` ranks of the calibrated machine (``local_world_size`` per host, default
        all on one): its device, its memory (the GPU's, or the host's divided among its ranks)
        and bandwidths, and the profile for the planner's predictions."""
        local = world_size if local_world_size is None else local_world_size
        if profile.compute_device == "cuda":
            hbm_cap = profile.memory_bytes if hbm_cap is None else hbm_cap
        elif ddr_cap is None and profile.memory_bytes > 0 and isinstance(local, int) and local > 0:
            ddr_cap = profile.memory_bytes // local
        # TorchRec's two bandwidth fields: the calibrated all-to-all's (the costs use the profile)
        intra = profile.link("all_to_all", max(2, local), "intra")
        inter = profile.link("all_to_all", max(2, world_size), "inter")
        cuda = profile.compute_device == "cuda"
        return cls(
            world_size=world_size,
            compute_device=profile.compute_device,
            hbm_cap=hbm_cap,
            ddr_cap=ddr_cap,
            local_world_size=local_world_size,
            profile=profile,
            hbm_mem_bw=profile.memory_bw if cuda else HBM_MEM_BW,
            ddr_mem_bw=DDR_MEM_BW if cuda else profile.memory_bw,
            intra_host_bw=intra.bytes_per_ms if intra is not None else INTRA_NODE_BANDWIDTH,
            inter_host_bw=inter.bytes_per_ms if inter is not None else CROSS_NODE_BANDWIDTH,
        )

    def __post_init__(self) -> None:
        _check_int("world_size", self.world_size, 1)
        self._torchrec_fields()
        if self.compute_device not in COMPUTE_DEVICES:
            raise ValueError(
                f"compute_device must be one of {list(COMPUTE_DEVICES)}, got {self.compute_device!r}"
            )
        if self.local_world_size is None:
            object.__setattr__(self, "local_world_size", self.world_size)
        _check_int("local_world_size", self.local_world_size, 1)
        self._fill_capacities()
        _check_int("hbm_cap", self.hbm_cap, 0)
        _check_int("ddr_cap", self.ddr_cap, 0)
        if self.world_size % self.intra_group_size:
            raise ValueError(
                f"world_size ({self.world_size}) must be a multiple of local_world_size "
                f"({self.local_world_size}): every host holds the same number of ranks; use a "
                "local_world_size that divides world_size"
            )
        for name in ("hbm_mem_bw", "ddr_mem_bw", "intra_host_bw", "inter_host_bw"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 bytes/ms, got {getattr(self, name)}")
        if self.profile is not None and not isinstance(self.profile, MachineProfile):
            raise TypeError(
                f"profile must be a MachineProfile (load_profile(path)), got "
                f"{type(self.profile).__name__}"
            )
        for name in ("bwd_compute_multiplier", "weighted_feature_bwd_compute_multiplier"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def _fill_capacities(self) -> None:
        """Capacities not given, from the machine (see the class docstring)."""
        sources = {"hbm_cap": "given", "ddr_cap": "given"}
        if self.hbm_cap is None:
            gpu = _machine.gpu_memory() if self.compute_device == "cuda" else 0
            hbm_cap, sources["hbm_cap"] = (
                (HBM_CAP, "TorchRec's default: no GPU here") if gpu is None else (gpu, "the GPU's")
            )
            object.__setattr__(self, "hbm_cap", hbm_cap)
        if self.ddr_cap is None:
            host = _machine.host_memory()
            if host is None:
                ddr_cap, sources["ddr_cap"] = DDR_CAP, "TorchRec's default: the OS does not say"
            else:
                ddr_cap = host // self.intra_group_size
                sources["ddr_cap"] = (
                    f"this machine's {format_bytes(host)} / {self.local_world_size} local ranks"
                )
            object.__setattr__(self, "ddr_cap", ddr_cap)
        kind = "hbm_cap" if self.compute_device == "cuda" else "ddr_cap"
        object.__setattr__(self, "memory_source", sources[kind])

    def _torchrec_fields(self) -> None:
        """TorchRec's fields for SSD, UVM and uneven ranks: refused unless at their defaults;
        a `generalized_comms_bandwidths` sets the two bandwidths."""
        if self.ssd_cap:
            raise ValueError(
                f"ssd_cap={self.ssd_cap}: SSD tables are FBGEMM kernels, not in shardkit; leave "
                "ssd_cap None (tables live in HBM on GPUs, host memory on CPUs)"
            )
        if self.custom_topology_data is not None:
            raise ValueError(
                "custom_topology_data: shardkit plans ranks with equal memory; give "
                "hbm_cap/ddr_cap (bytes per rank) instead"
            )
        if self.uneven_sharding_perf_multiplier != 1.0:
            raise ValueError(
                f"uneven_sharding_perf_multiplier={self.uneven_sharding_perf_multiplier}: "
                "shardkit's cost model has no such factor; leave it 1.0"
            )
        comms = self.generalized_comms_bandwidths
        if comms is not None:
            object.__setattr__(self, "intra_host_bw", float(comms.intra_host_bw))
            object.__setattr__(self, "inter_host_bw", float(comms.inter_host_bw))

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.intra_group_size

    @property
    def intra_group_size(self) -> int:
        """TorchRec's name for the ranks joined by the fast intra-host links: ``local_world_size``
        as an int (``__post_init__`` replaces a None, "not given")."""
        assert self.local_world_size is not None, "__post_init__ resolves local_world_size"
        return self.local_world_size

    @property
    def memory_per_rank(self) -> int:
        """Bytes of the memory tables live in: HBM on ``"cuda"``, host memory on ``"cpu"``."""
        cap = self.hbm_cap if self.compute_device == "cuda" else self.ddr_cap
        assert cap is not None, "__post_init__ fills the capacities not given"
        return cap

    @property
    def memory_kind(self) -> str:
        return "hbm" if self.compute_device == "cuda" else "ddr"

    @property
    def memory_bw(self) -> float:
        """Bandwidth of the memory tables live in, bytes/ms."""
        return self.hbm_mem_bw if self.compute_device == "cuda" else self.ddr_mem_bw

    def comm_bw(self, num_ranks: int) -> float:
        """Bandwidth of a collective among ``num_ranks`` consecutive ranks starting at a host's
        first: the intra-host links if they are all on one host, else the inter-host ones."""
        return self.intra_host_bw if num_ranks <= self.intra_group_size else self.inter_host_bw


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ParameterConstraints:
    """Limits and input statistics for one table, keyed by table name in the planner's
    ``constraints`` dict (TorchRec's fields and meaning).

    Args:
        sharding_types: the only sharding types the planner may use for the table
            (`ShardingType` or their values, e.g. ``[ShardingType.ROW_WISE.value]``).
        compute_kernels: the only kernels it may use (``"fused"``, ``"batched_dense"``...).
        min_partition: narrowest column-wise shard, in columns (default 32).
        pooling_factors: average ids per example, one per feature of the table (default 1.0
            for each feature).
        num_poolings: bags per example, one per feature (default 1.0).
        batch_sizes: examples per rank per step, one per feature (default: the planner's).
        is_weighted: the features carry a weight per id.
        feature_names: the features the statistics above are for, in order (documentation:
            the planner takes the table's features in its config's order).
        cache_params, enforce_hbm, stochastic_rounding, bounds_check_mode, output_dtype,
            device_group, key_value_params, use_virtual_table: TorchRec's FBGEMM kernel
            settings; refused unless at their defaults (see `ParameterSharding`).

    Example::

        ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value], pooling_factors=[20.0])
    """

    sharding_types: Sequence[ShardingType | str] | None = None
    compute_kernels: Sequence[EmbeddingComputeKernel | str] | None = None
    min_partition: int | None = None
    pooling_factors: Sequence[float] | None = None
    num_poolings: Sequence[float] | None = None
    batch_sizes: Sequence[int] | None = None
    is_weighted: bool = False
    cache_params: Any = None
    enforce_hbm: bool | None = None
    stochastic_rounding: bool | None = None
    bounds_check_mode: Any = None
    feature_names: Sequence[str] | None = None
    output_dtype: Any = None
    device_group: str | None = None
    key_value_params: Any = None
    use_virtual_table: bool = False

    def __post_init__(self) -> None:
        self._refuse_kernel_settings()
        if self.sharding_types is not None:
            types = _parsed("sharding_types", self.sharding_types, ShardingType.parse)
            object.__setattr__(self, "sharding_types", types)
        if self.compute_kernels is not None:
            kernels = _parsed("compute_kernels", self.compute_kernels, EmbeddingComputeKernel.parse)
            object.__setattr__(self, "compute_kernels", kernels)
        if self.min_partition is not None and (
            not isinstance(self.min_partition, int) or self.min_partition < 1
        ):
            raise ValueError(
                f"min_partition must be an int >= 1 column, got {self.min_partition!r}"
            )
        self._check_statistics()
        if self.feature_names is not None:
            object.__setattr__(self, "feature_names", tuple(self.feature_names))

    def _check_statistics(self) -> None:
        lengths = {}
        for name in ("pooling_factors", "num_poolings", "batch_sizes"):
            values = getattr(self, name)
            if values is None:
                continue
            values = tuple(values)
            bad = [v for v in values if not (isinstance(v, int | float) and math.isfinite(v))]
            low_ok = all(v > 0 for v in values if v not in bad)
            if bad or not low_ok or not values:
                raise ValueError(
                    f"{name} must be a non-empty list of finite numbers > 0, got {list(values)}"
                )
            if name == "batch_sizes" and any(not isinstance(v, int) for v in values):
                raise ValueError(f"batch_sizes must be ints, got {list(values)}")
            lengths[name] = len(values)
            object.__setattr__(self, name, values)
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"pooling_factors, num_poolings and batch_sizes give one value per feature and "
                f"must have the same length; got lengths {lengths}"
            )

    def _refuse_kernel_settings(self) -> None:
        refuse_kernel_settings(
            "ParameterConstraints",
            cache_params=self.cache_params,
            key_value_params=self.key_value_params,
            stochastic_rounding=self.stochastic_rounding,
            bounds_check_mode=self.bounds_check_mode,
            output_dtype=self.output_dtype,
        )
        if self.use_virtual_table:
            raise ValueError(
                "ParameterConstraints: use_virtual_table=True: virtual (SSD/key-value) tables "
                "are FBGEMM kernels, not in shardkit; leave it False"
            )
        if self.device_group not in (None, "cuda", "cpu"):
            raise ValueError(
                f"ParameterConstraints: device_group={self.device_group!r}: shardkit places a "
                "table's shards on the compute device; leave device_group None"
            )

    def num_inputs(self) -> int | None:
        """Features these statistics describe (None when no list is given)."""
        for name in ("pooling_factors", "num_poolings", "batch_sizes"):
            values = getattr(self, name)
            if values is not None:
                return len(values)
        return None


def _parsed(name: str, values: Sequence[object], parse: object) -> tuple:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list, got {values!r}")
    if not values:
        raise ValueError(f"{name} is empty: it would allow nothing; leave it None to allow all")
    parsed = tuple(parse(v) for v in values)  # type: ignore[operator]
    return tuple(dict.fromkeys(parsed))


@dataclass(frozen=True)
class Reservation:
    """Each rank's memory: ``capacity = margin + dense + kjt + available`` (bytes)."""

    capacity: int
    margin: int
    dense: int
    kjt: int

    @property
    def available(self) -> int:
        """Bytes left for table shards on each rank."""
        return self.capacity - self.margin - self.dense - self.kjt


@dataclass(frozen=True)
class HeuristicalStorageReservation:
    """Reserves, on every rank, a margin and room for what the planner does not place
    (TorchRec's policy and name).

    Args:
        percentage: fraction of each rank's memory kept as a margin (default 0.15).
        parameter_multiplier: the dense part of the model (the module's parameters that are not
            tables) takes this many times its parameter bytes: parameters, optimizer state,
            gradients and communication buckets (default 6).
        dense_tensor_estimate: bytes of the dense part, replacing that heuristic (needed when
            planning from table configs alone, where there is no module to measure).
    """

    percentage: float = STORAGE_RESERVE_PERCENTAGE
    parameter_multiplier: float = DENSE_PARAMETER_MULTIPLIER
    dense_tensor_estimate: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.percentage < 1.0:
            raise ValueError(f"percentage must be in [0, 1), got {self.percentage}")
        if not self.parameter_multiplier >= 0:
            raise ValueError(f"parameter_multiplier must be >= 0, got {self.parameter_multiplier}")
        if self.dense_tensor_estimate is not None and self.dense_tensor_estimate < 0:
            raise ValueError(
                f"dense_tensor_estimate must be >= 0 bytes, got {self.dense_tensor_estimate}"
            )

    def reserve(
        self, topology: Topology, *, input_bytes: float, dense_parameter_bytes: int
    ) -> Reservation:
        """What each rank keeps back, given the bytes of one rank's input batch (ids and
        weights, all tables) and of the dense model's parameters; raises `PlannerError` if
        nothing is left for tables."""
        capacity = topology.memory_per_rank
        dense = self.dense_tensor_estimate
        if dense is None:
            dense = math.ceil(dense_parameter_bytes * self.parameter_multiplier)
        kjt = math.ceil(input_bytes) * KJT_BUFFER_COPIES
        reservation = Reservation(capacity, math.floor(capacity * self.percentage), dense, kjt)
        if reservation.available <= 0:
            raise PlannerError(
                f"no {topology.memory_kind} memory is left for embedding tables: each rank has "
                f"{format_bytes(capacity)}, minus a {self.percentage:.0%} margin "
                f"({format_bytes(reservation.margin)}), the dense model "
                f"({format_bytes(dense)}) and {KJT_BUFFER_COPIES} input batches "
                f"({format_bytes(kjt)}); give the ranks more memory (hbm_cap/ddr_cap), a smaller "
                "percentage or dense_tensor_estimate, or a smaller batch_size",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            )
        return reservation
