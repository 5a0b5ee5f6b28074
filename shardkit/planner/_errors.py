"""`PlannerError`: no plan fits, or the constraints allow none; the message says why and what
would work."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["PlannerError", "PlannerErrorType", "format_bytes"]


@enum.unique
class PlannerErrorType(enum.Enum):
    """Why planning failed (TorchRec's classification)."""

    INSUFFICIENT_STORAGE = "insufficient_storage"
    STRICT_CONSTRAINTS = "strict_constraints"
    PARTITION = "partition"
    OTHER = "other"


class PlannerError(Exception):
    """Planning failed. ``error_type`` classifies it; the message names the tables, what they
    need, what the ranks have, and what would fit."""

    def __init__(self, message: str, error_type: PlannerErrorType = PlannerErrorType.OTHER) -> None:
        super().__init__(message)
        self.error_type = error_type

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep error_type when the error is pickled (collective_plan sends it to every rank).
        return (PlannerError, (str(self), self.error_type))


def format_bytes(num_bytes: float) -> str:
    """``1536`` -> ``"1.5 KiB"``: B, KiB, MiB or GiB, about three significant digits."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B" or abs(value) >= 100:
        return f"{value:.0f} {unit}"
    return f"{value:.3g} {unit}"
