"""Data-dependent checks behind ``validate()``: each reads tensors, so each may sync with the device.

Constructors never call these (see [Note: free checks] in `_checks`). A check names the first
offending position, and through ``where`` the key it belongs to, so that the message points at
the bag to fix.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "check_bags",
    "check_lengths_match_offsets",
    "check_total",
    "first_true",
]

Where = Callable[[int], str]  # bag index -> "key 'user': " (KJT) or "" (JT)


def first_true(mask: torch.Tensor) -> int | None:
    """Index of the first True in a 1-D mask, or None (one device->host sync)."""
    hits = torch.nonzero(mask)
    return None if hits.numel() == 0 else int(hits[0, 0])


def check_bags(
    owner: str, lengths: torch.Tensor | None, offsets: torch.Tensor | None, where: Where
) -> None:
    """Lengths >= 0; offsets start at 0 and never go down."""
    if lengths is not None:
        bad = first_true(lengths < 0)
        if bad is not None:
            raise ValueError(
                f"{owner}: {where(bad)}lengths[{bad}] = {int(lengths[bad])} is negative; "
                "a bag holds 0 or more ids"
            )
    if offsets is None or offsets.numel() == 0:
        return
    if int(offsets[0]) != 0:
        raise ValueError(
            f"{owner}: offsets start at {int(offsets[0])}, not 0; offsets[i] is where bag i "
            "starts in values, so the first is 0 (subtract offsets[0] to rebase them)"
        )
    bad = first_true(torch.diff(offsets) < 0)
    if bad is not None:
        raise ValueError(
            f"{owner}: {where(bad)}offsets go down from offsets[{bad}] = {int(offsets[bad])} to "
            f"offsets[{bad + 1}] = {int(offsets[bad + 1])}; offsets must be non-decreasing "
            "(the cumulative sum of lengths)"
        )


def check_lengths_match_offsets(
    owner: str, lengths: torch.Tensor | None, offsets: torch.Tensor | None, where: Where
) -> None:
    """When both are given, ``lengths == diff(offsets)`` bag by bag."""
    if lengths is None or offsets is None or offsets.numel() == 0:
        return
    steps = torch.diff(offsets)
    bad = first_true(steps != lengths)
    if bad is not None:
        raise ValueError(
            f"{owner}: {where(bad)}lengths[{bad}] = {int(lengths[bad])} but offsets[{bad + 1}] - "
            f"offsets[{bad}] = {int(steps[bad])}; pass lengths and offsets of the same bags, or "
            "only one of them"
        )


def check_total(
    owner: str,
    lengths: torch.Tensor | None,
    offsets: torch.Tensor | None,
    num_values: int,
    detail: str = "",
) -> None:
    """The bags cover ``values`` exactly: ``sum(lengths) == offsets[-1] == len(values)``."""
    if lengths is not None:
        total = int(lengths.sum())
        if total != num_values:
            raise ValueError(
                f"{owner}: lengths sum to {total}{detail} but values have {num_values} entries; "
                "each id belongs to exactly one bag, so sum(lengths) must equal len(values)"
            )
        return
    assert offsets is not None
    end = int(offsets[-1]) if offsets.numel() else 0
    if end != num_values:
        raise ValueError(
            f"{owner}: offsets end at {end}{detail} but values have {num_values} entries; "
            "the last offset must equal len(values)"
        )
