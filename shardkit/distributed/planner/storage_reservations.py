"""``torchrec.distributed.planner.storage_reservations``: what each rank keeps back."""

from shardkit.planner import HeuristicalStorageReservation

__all__ = ["HeuristicalStorageReservation"]
