"""Debug mode: every rank checks that all ranks issue the same collective with matching sizes.

Off by default (it costs one small all-gather per collective). Turn it on with
``shardkit.comm.set_debug(True)``, the environment variable ``SHARDKIT_DEBUG=1``, or
``spawn(..., debug=True)`` (which also turns on torch's own check of raw torch.distributed calls).
A mismatch raises the same `CollectiveMismatchError` on every rank, before the collective runs.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from shardkit.comm._objects import all_gather_object

__all__ = ["CollectiveMismatchError", "check", "enabled", "set_debug"]


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives, or the same one with incompatible arguments."""


_enabled = os.environ.get("SHARDKIT_DEBUG", "0") not in ("", "0")
_calls = 0


def set_debug(enable: bool) -> None:
    """Turn the cross-rank check of every shardkit collective on or off in this process."""
    global _enabled
    _enabled = bool(enable)


def enabled() -> bool:
    return _enabled


def check(op: Any, x: torch.Tensor) -> None:
    """Exchange a fingerprint of this call with all ranks of the op's group; raise on mismatch."""
    global _calls
    _calls += 1
    mine = _fingerprint(op, x, _calls)
    everyone = all_gather_object(mine, group=op.group)
    problem = _compare(everyone)
    if problem:
        raise CollectiveMismatchError(
            f"collective #{_calls} of rank {dist.get_rank()}: {problem}. Every rank must call the "
            "same collectives in the same order with matching sizes"
        )


def _fingerprint(op: Any, x: torch.Tensor, call: int) -> dict[str, Any]:
    same = {"op": op.name, "dtype": str(x.dtype), "row_shape": tuple(x.shape[1:])}
    local: dict[str, Any] = {"rows": x.shape[0] if x.dim() else None}
    for field in ("input_split_sizes", "output_split_sizes", "src", "dst", "op"):
        value = getattr(op, field, None)
        if value is None:
            continue
        if field in ("input_split_sizes", "output_split_sizes"):
            local[field] = tuple(value)
        else:
            same["reduce_op" if field == "op" else field] = str(value).split(".")[-1]
    if op.name in ("all_reduce", "broadcast", "reduce"):
        same["shape"] = tuple(x.shape)
    return {"call": call, "same": same, "local": local}


def _compare(prints: list[dict[str, Any]]) -> str | None:
    first = prints[0]["same"]
    for fp in prints:
        keys = first.keys() | fp["same"].keys()
        for key in ["op", *sorted(keys - {"op"})]:
            if first.get(key) != fp["same"].get(key):
                values = ", ".join(f"rank {r}: {p['same'].get(key)}" for r, p in enumerate(prints))
                return f"ranks disagree on {key} ({values})"
    name = first["op"]
    local = [fp["local"] for fp in prints]
    if name == "all_to_all_single":
        return _compare_all_to_all(local)
    if name == "all_gather_into_tensor":
        return _compare_gather(local, "output_split_sizes")
    if name == "reduce_scatter_tensor":
        return _compare_reduce_scatter(local)
    return None


def _compare_all_to_all(local: list[dict[str, Any]]) -> str | None:
    for i, sender in enumerate(local):
        for j, receiver in enumerate(local):
            sent = sender["input_split_sizes"][j]
            expected = receiver["output_split_sizes"][i]
            if sent != expected:
                return (
                    f"all_to_all_single: rank {i} sends {sent} rows to rank {j}, which expects "
                    f"{expected} (input_split_sizes[{j}] of rank {i} must equal "
                    f"output_split_sizes[{i}] of rank {j})"
                )
    return None


def _compare_gather(local: list[dict[str, Any]], field: str) -> str | None:
    sizes = local[0][field]
    rows = [entry["rows"] for entry in local]
    for rank, entry in enumerate(local):
        if entry[field] != sizes:
            return (
                f"all_gather_into_tensor: ranks disagree on {field} (rank 0: {list(sizes)}, "
                f"rank {rank}: {list(entry[field])}) while they give {rows} rows; pass "
                f"{field}={rows} on every rank (all_gather_sizes learns them)"
            )
        if entry["rows"] != sizes[rank]:
            return (
                f"all_gather_into_tensor: rank {rank} gives {entry['rows']} rows but "
                f"output_split_sizes[{rank}] is {sizes[rank]}"
            )
    return None


def _compare_reduce_scatter(local: list[dict[str, Any]]) -> str | None:
    sizes = local[0]["input_split_sizes"]
    for rank, entry in enumerate(local):
        if entry["input_split_sizes"] != sizes or entry["rows"] != local[0]["rows"]:
            return (
                f"reduce_scatter_tensor: rank 0 splits {local[0]['rows']} rows as {list(sizes)}, "
                f"rank {rank} splits {entry['rows']} rows as {list(entry['input_split_sizes'])}"
            )
    return None
