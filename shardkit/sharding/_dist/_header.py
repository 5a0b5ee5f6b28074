"""The input dist's first all-to-all: a header per destination, and what every rank concludes
from all of them (see [Note: input exchange] in `_input`).

A header row is ``[batch size, status, tag, ids of each slot bound for the destination, bags
of each feature]`` int64. Every rank reads every source's row before the ids' all-to-all, so a
refused input, a batch-size mismatch, a rank without a batch or ranks that sent other tags make
every rank raise the same error there, instead of leaving some waiting in a collective the
others never call. The tag is the caller's: a number every rank must send alike (the train
pipeline's mask of the collections whose input dists it starts next, [Note: prefetch mask] in
`_pipeline._feeds`; 0 elsewhere).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.sharding._layout import Layout

__all__ = [
    "BAD_INPUT",
    "EXHAUSTED",
    "HEADER_FIELDS",
    "NO_INPUT",
    "OK",
    "InputError",
    "OtherRankInputError",
    "RanksExhaustedError",
    "TagMismatchError",
    "check_headers",
    "exchange_headers",
]

# Header status codes: input sent; input refused; no batch left; a batch, but no input for
# this collection (a header alone, see `exchange_status` in `_input`).
OK, BAD_INPUT, EXHAUSTED, NO_INPUT = 0, 1, 2, 3

# A header row's fields before the ids per slot: batch size, status, tag.
HEADER_FIELDS = 3


class InputError(ValueError):
    """Some rank's input to a sharded collection was refused; raised on every rank."""


class RanksExhaustedError(RuntimeError):
    """Some ranks sent an "exhausted" header while others sent a batch; raised on every rank.

    ``ranks``: the ranks that ran out (the train pipeline names them in `DataExhaustedError`).
    """

    def __init__(self, ranks: list[int]) -> None:
        super().__init__(f"rank(s) {ranks} have no batch left while the others have one")
        self.ranks = ranks


class TagMismatchError(RuntimeError):
    """The ranks sent other tags in their headers; raised on every rank.

    ``tags``: every rank's tag, in rank order (the train pipeline names the collections in an
    `InputError`).
    """

    def __init__(self, tags: list[int]) -> None:
        super().__init__(
            f"ranks sent other tags in their input-dist headers: {tags} (rank order); every "
            "rank must pass the same tag= to input_dist/prefetch for one batch, as an "
            "overlapping train pipeline does with its prefetch mask (where they differ, it "
            "raises an InputError naming the collections instead)"
        )
        self.tags = tags


class OtherRankInputError(InputError):
    """Raised on the ranks whose own input was fine, when another rank's was refused."""

    reports_other_rank = True


def exchange_headers(
    sent_counts: list[list[int]],
    layout: Layout,
    rank: int,
    group: dist.ProcessGroup | None,
    device: torch.device,
    *,
    batch_size: int,
    strides: list[int] | None,
    status: int,
    tag: int = 0,
) -> list[list[int]]:
    """Every source's header to this rank, read on the host: ``[W][3 + S + F]``; the one
    device-to-host read of the receiver (see [Note: host-side sizes] in `_input`).

    ``sent_counts[d][k]``: ids this rank sends for the k-th slot bound for rank ``d``;
    ``strides[f]``: bags of feature ``f`` (None: ``batch_size`` each); a header whose
    ``status`` is not `OK` carries no bags; ``tag`` (``0 <= tag < 2**63``), see above.
    """
    num_features = 1 + max((u.feature_index for u in layout.units), default=-1)
    strides = strides or [batch_size] * num_features
    if status != OK:
        strides = [0] * num_features
    rows = [[batch_size, status, tag, *per_slot, *strides] for per_slot in sent_counts]
    flat = torch.tensor([v for row in rows for v in row], dtype=torch.int64)
    width = HEADER_FIELDS + len(layout.slots_to(rank)) + num_features
    got = comm.all_to_all_single(
        flat.to(device, non_blocking=True),  # See [Note: host-side sizes] in `_input`
        input_split_sizes=[len(row) for row in rows],
        output_split_sizes=[width] * layout.world_size,
        group=group,
    )
    assert isinstance(got, torch.Tensor)
    values = got.tolist()
    return [values[r * width : (r + 1) * width] for r in range(layout.world_size)]


def check_headers(headers: list[list[int]], *, error: str | None) -> None:
    """Raise the same error on every rank if any rank's input was bad or batch sizes differ,
    some ranks ran out of batches or the ranks sent other tags; return quietly where every
    rank sent a header alone. ``error``: this rank's own validation error, if any (raised as
    it is)."""
    statuses = [row[1] for row in headers]
    exhausted = [r for r, s in enumerate(statuses) if s == EXHAUSTED]
    if exhausted and len(exhausted) < len(statuses):
        raise RanksExhaustedError(exhausted)
    tags = [row[2] for row in headers]
    if len(set(tags)) > 1:
        raise TagMismatchError(tags)
    if len(set(statuses)) == 1 and statuses[0] in (EXHAUSTED, NO_INPUT):
        return
    absent = [r for r, s in enumerate(statuses) if s == NO_INPUT]
    if absent:
        raise InputError(
            f"rank(s) {absent} fed no input to this sharded collection while the others did; "
            "every rank's batches must hold the same KeyedJaggedTensor features"
        )
    bad = [r for r, s in enumerate(statuses) if s != OK]
    if bad:
        if error is not None:
            raise InputError(error)
        raise OtherRankInputError(
            f"rank(s) {bad} refused their input to the sharded collection (their error says "
            "why); every rank stops here instead of waiting for them"
        )
    sizes = [row[0] for row in headers]
    if len(set(sizes)) > 1:
        raise InputError(
            f"ranks disagree on the batch size: {dict(enumerate(sizes))} (rank: size). Every "
            "rank must feed the same batch size to a sharded collection; drop or pad the last "
            "partial batch (e.g. drop_last=True)"
        )
