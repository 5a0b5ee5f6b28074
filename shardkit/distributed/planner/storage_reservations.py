"""``torchrec.distributed.planner.storage_reservations``: what each rank keeps back."""

from shardkit.planner import (
    FixedAbsoluteStorageReservation,
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
    InferenceStorageReservation,
    StorageReservationType,
)

__all__ = [
    "FixedAbsoluteStorageReservation",
    "FixedPercentageStorageReservation",
    "HeuristicalStorageReservation",
    "InferenceStorageReservation",
    "StorageReservationType",
]
