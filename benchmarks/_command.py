"""The command line that re-runs a benchmark, for the first line of its report."""

from __future__ import annotations

import argparse

__all__ = ["argv"]


def argv(args: argparse.Namespace, *, skip: frozenset[str] = frozenset({"out"})) -> list[str]:
    """``--flag value`` for each parsed argument but ``skip`` (where the report goes); a list
    value is written space-separated, as ``nargs="+"`` reads it back."""
    out = []
    for key, value in vars(args).items():
        if key not in skip:
            value = " ".join(map(str, value)) if isinstance(value, list) else value
            out.append(f"--{key.replace('_', '-')} {value}")
    return out
