"""Flag values with units: sizes in bytes (``80G``) and bandwidths in bytes per ms (``230G``)."""

from __future__ import annotations

import argparse

__all__ = ["rate", "size"]

_SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_RATE_UNITS = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def size(text: str) -> int:
    """``"80G"``, ``"1.5T"``, ``"512MiB"``, ``"1024"`` -> bytes."""
    clean = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if clean and clean[-1] in _SIZE_UNITS:
            return int(float(clean[:-1]) * _SIZE_UNITS[clean[-1]])
        return int(clean)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (e.g. 80G, 512M, 1.5T, 1024)"
        ) from None


def rate(text: str) -> float:
    """``"230G"`` (bytes per second) -> bytes/ms."""
    clean = text.strip().upper().removesuffix("/S").removesuffix("B")
    try:
        if clean and clean[-1] in _RATE_UNITS:
            return float(clean[:-1]) * _RATE_UNITS[clean[-1]] / 1e3
        return float(clean) / 1e3
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a bandwidth: {text!r} (bytes per second, e.g. 230G, 25G, 800M)"
        ) from None
