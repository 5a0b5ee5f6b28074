"""TorchRec's other storage reservations (``torchrec.distributed.planner.storage_reservations``):
a fixed share of each rank's memory, a fixed number of GPU bytes, and inference's (a share plus
the dense model and inputs)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from shardkit.planner._errors import PlannerError, PlannerErrorType, format_bytes
from shardkit.planner._inputs import (
    Reservation,
    Topology,
)

__all__ = [
    "FixedAbsoluteStorageReservation",
    "FixedPercentageStorageReservation",
    "InferenceStorageReservation",
    "StorageReservationType",
]


class StorageReservationType(str, enum.Enum):
    HEURISTIC = "heuristic"
    FIXED_PERCENTAGE = "fixed_percentage"
    FIXED_ABSOLUTE = "fixed_absolute"


def _checked(reservation: Reservation, topology: Topology) -> Reservation:
    if reservation.available <= 0:
        raise PlannerError(
            f"no {topology.memory_kind} memory is left for embedding tables: each rank has "
            f"{format_bytes(reservation.capacity)} and keeps back "
            f"{format_bytes(reservation.capacity - reservation.available)}; reserve less or give "
            "the ranks more memory",
            PlannerErrorType.INSUFFICIENT_STORAGE,
        )
    return reservation


@dataclass(frozen=True)
class FixedPercentageStorageReservation:
    """Keeps ``percentage`` of each rank's memory back, nothing else."""

    percentage: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.percentage <= 1.0:
            raise ValueError(f"percentage must be in [0, 1], got {self.percentage}")

    def reserve(
        self, topology: Topology, *, input_bytes: float = 0, dense_parameter_bytes: int = 0
    ) -> Reservation:
        capacity = topology.memory_per_rank
        return _checked(
            Reservation(capacity, math.floor(capacity * self.percentage), 0, 0), topology
        )


@dataclass(frozen=True)
class FixedAbsoluteStorageReservation:
    """Keeps ``hbm_reserved_bytes`` of each GPU's memory back (nothing on CPUs, whose tables
    live in host memory)."""

    hbm_reserved_bytes: int

    def __post_init__(self) -> None:
        if self.hbm_reserved_bytes < 0:
            raise ValueError(f"hbm_reserved_bytes must be >= 0, got {self.hbm_reserved_bytes}")

    def reserve(
        self, topology: Topology, *, input_bytes: float = 0, dense_parameter_bytes: int = 0
    ) -> Reservation:
        capacity = topology.memory_per_rank
        kept = self.hbm_reserved_bytes if topology.compute_device == "cuda" else 0
        return _checked(Reservation(capacity, kept, 0, 0), topology)


@dataclass(frozen=True)
class InferenceStorageReservation:
    """Keeps ``percentage`` back, plus the dense model (``dense_tensor_estimate`` bytes, else
    its parameters once: no gradients or optimizer state) and one input batch."""

    percentage: float
    dense_tensor_estimate: int | None = None

    def reserve(
        self, topology: Topology, *, input_bytes: float = 0, dense_parameter_bytes: int = 0
    ) -> Reservation:
        capacity = topology.memory_per_rank
        dense = self.dense_tensor_estimate
        dense = dense_parameter_bytes if dense is None else dense
        reservation = Reservation(
            capacity, math.floor(capacity * self.percentage), dense, math.ceil(input_bytes)
        )
        return _checked(reservation, topology)
