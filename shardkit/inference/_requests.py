"""The check every rank's requests pass before a sharded quantized module's first exchange.

A request a rank cannot serve (a feature missing, an id outside its table) is known only to the
rank that sent it, while the table's owner is another rank: raising there alone would leave the
others waiting in the id exchange. So every rank checks its own request, and the batch-size
gather that every forward starts with carries the verdict (-1): all ranks raise together.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["agreed_batches"]


def agreed_batches(
    features: KeyedJaggedTensor,
    by_key: Mapping[str, JaggedTensor],
    rows: Mapping[str, int],
    *,
    group: dist.ProcessGroup | None,
    what: str,
) -> list[int]:
    """Every rank's batch size ``[W]``, gathered; the same ``ValueError`` on every rank when any
    rank's ``features`` lacks a feature of ``rows`` or holds an id outside ``[0, rows[f])``."""
    missing = [f for f in rows if f not in by_key]
    outside = [] if missing else [f for f, n in rows.items() if _outside(by_key[f].values(), n)]
    batch = torch.tensor([features.stride() if not (missing or outside) else -1])
    gathered = comm.all_gather_into_tensor(batch, group=group)
    assert isinstance(gathered, torch.Tensor)  # synchronous
    batches = gathered.tolist()
    if min(batches) < 0:
        bad = [r for r, b in enumerate(batches) if b < 0]
        mine = (
            f"this rank's lacks the features {missing}" if missing
            else f"this rank's has ids outside their tables in the features {outside}" if outside
            else f"this rank's is fine: see the error of rank(s) {bad}"
        )  # fmt: skip
        raise ValueError(
            f"rank(s) {bad} gave a KeyedJaggedTensor the {what} cannot serve ({mine}); every "
            f"rank must give all of {list(rows)}, each id in [0, num_embeddings)"
        )
    return batches


def _outside(ids: torch.Tensor, rows: int) -> bool:
    if not ids.numel():
        return False
    low, high = torch.aminmax(ids)
    return int(low) < 0 or int(high) >= rows
