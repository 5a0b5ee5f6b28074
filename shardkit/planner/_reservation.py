"""How much of each rank's memory the tables may use."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.planner._constants import (
    DENSE_PARAMETER_MULTIPLIER,
    KJT_BUFFER_COPIES,
    STORAGE_RESERVE_PERCENTAGE,
)
from shardkit.planner._errors import PlannerError, PlannerErrorType, format_bytes
from shardkit.planner._tables import TableSpec
from shardkit.planner._topology import Topology

__all__ = ["HeuristicalStorageReservation", "Reservation"]


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
        self, topology: Topology, tables: Sequence[TableSpec], *, dense_parameter_bytes: int
    ) -> Reservation:
        """What each rank keeps back; raises `PlannerError` if nothing is left for tables."""
        capacity = topology.memory_per_rank
        dense = self.dense_tensor_estimate
        if dense is None:
            dense = math.ceil(dense_parameter_bytes * self.parameter_multiplier)
        kjt = math.ceil(sum(t.ids_per_rank * t.id_bytes for t in tables)) * KJT_BUFFER_COPIES
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
