"""The remapper state of a managed-collision table: slots, buckets, search, eviction.

[Note: managed-collision slots]
A table of ``N`` rows managed by `MCHManagedCollisionModule` has ``N`` slots. Slot ``p`` holds a raw
id (``_mch_sorted_raw_ids[p]``), the row that id is looked up in (``_mch_remapped_ids_mapping[p]``)
and the policy's metadata (``_mch_counts[p]``, ``_mch_last_access_iter[p]``). TorchRec's buffers and
names; what shardkit adds is buckets:

- the rows are split into ``buckets`` contiguous ranges, bucket ``b`` owning rows
  ``[b * N // buckets, (b + 1) * N // buckets)`` (``_output_segments_tensor`` holds the bounds);
- raw id ``x`` (after the module's ``input_hash_func``) belongs to bucket `bucket_of` ``(x)``,
  TorchRec's rule (its sharded input dist, FBGEMM's block bucketization): the input range
  ``[0, input_hash_size)`` in ``buckets`` blocks of ``ceil(input_hash_size / buckets)`` ids, so
  ``x // block`` for ``x`` in range and ``x mod buckets`` beyond it; the id can only ever take
  a row of its bucket. (Spreading the ids over the buckets is the ``input_hash_func``'s job,
  as in TorchRec: without one, ids far below ``input_hash_size`` all fall in bucket 0.)
- slots are laid out like rows: the slots of positions ``[start_b, end_b)`` are bucket ``b``'s and
  map to rows in ``[start_b, end_b)``, sorted by raw id within the bucket; empty slots hold
  ``int64 max`` and sort last;
- the last slot of each bucket is pinned (never holds an id, never evicted): its row is where ids
  of that bucket that hold no slot are looked up (TorchRec's one such row is its last one).

With ``buckets=1`` this is exactly TorchRec's unsharded state. Every bucket evicts on its own
(its ids compete only for its rows), so any run of whole buckets is a self-contained remapper: a
rank that owns rows ``[start_b, end_b')`` of a row-wise (or the whole of a table-wise) sharded
table owns slots ``[start_b, end_b')`` and, fed the ids of its buckets, makes exactly the
decisions of the unsharded module. ``buckets`` divisible by the world size, and shard bounds on
bucket bounds (``floor(r * N / W)`` for rank ``r`` of ``W``: a group of whole buckets is again a
floor split), is all row-wise sharding needs; resharding moves whole buckets, never an id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardkit.modules._mc_policies import COUNTS, LAST_ACCESS, MCHEvictionPolicy

__all__ = ["SENTINEL", "Slots", "Window", "bucket_bounds", "bucket_of", "evict"]

SENTINEL = torch.iinfo(torch.int64).max  # an empty slot's raw id

SearchIndex = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def bucket_of(ids: torch.Tensor, num_buckets: int, input_size: int) -> torch.Tensor:
    """``[N]`` bucket of each raw id ``x`` (``>= 0``): ``x // block`` with ``block =
    ceil(input_size / num_buckets)`` where ``x < block * num_buckets``, else ``x mod
    num_buckets`` (TorchRec's row-wise routing of managed-collision ids, FBGEMM's block
    bucketization)."""
    if num_buckets == 1:
        return torch.zeros_like(ids)
    block = max(1, -(-input_size // num_buckets))
    if block * num_buckets > SENTINEL:  # every int64 id is in range
        return torch.div(ids, block, rounding_mode="floor")
    return torch.where(
        ids < block * num_buckets,
        torch.div(ids, block, rounding_mode="floor"),
        torch.remainder(ids, num_buckets),
    )


def bucket_bounds(zch_size: int, buckets: int, offset: int = 0) -> list[int]:
    """Row bounds of ``buckets`` buckets over rows ``[offset, offset + zch_size)``."""
    return [offset + b * zch_size // buckets for b in range(buckets + 1)]


@dataclass
class Slots:
    """Views of a module's slot buffers (see [Note: managed-collision slots]); updated in place.

    Args:
        raw_ids: ``[S]`` raw id per slot (``SENTINEL`` when empty), sorted within each bucket.
        rows: ``[S]`` row per slot (global row numbers).
        metadata: ``{name: [S]}`` the policy's int64 metadata per slot.
        bounds: global row bounds of this module's buckets (``len = local buckets + 1``).
        first_bucket: global index of this module's first bucket.
        num_buckets: buckets of the whole table.
        input_size: the module's ``input_hash_size`` (the range `bucket_of` splits).
    """

    raw_ids: torch.Tensor
    rows: torch.Tensor
    metadata: dict[str, torch.Tensor]
    bounds: list[int]
    first_bucket: int
    num_buckets: int
    input_size: int

    def __post_init__(self) -> None:
        device = self.raw_ids.device
        lengths = torch.tensor(self.bounds, device=device).diff()
        self.capacity = lengths - 1  # [local buckets] slots that can hold an id
        self.pinned = torch.tensor(self.bounds[1:], device=device) - 1 - self.bounds[0]
        self.miss_rows = self.pinned + self.bounds[0]  # the pinned slots' rows
        self.slot_bucket = torch.repeat_interleave(
            torch.arange(len(lengths), device=device), lengths
        )  # [S] local bucket of each slot
        self._search: SearchIndex | None = None

    def reset(self) -> None:
        """Every slot empty, slot ``p`` mapped to row ``bounds[0] + p``."""
        self.raw_ids.fill_(SENTINEL)
        torch.arange(self.bounds[0], self.bounds[-1], out=self.rows)
        for tensor in self.metadata.values():
            tensor.zero_()
        self._search = None

    def local_bucket(self, ids: torch.Tensor) -> torch.Tensor:
        """``[N]`` local bucket of each raw id (it must be one of this module's)."""
        return bucket_of(ids, self.num_buckets, self.input_size) - self.first_bucket

    def check_buckets(self, ids: torch.Tensor) -> None:
        """Raise if some id belongs to a bucket this module does not own."""
        owned = len(self.bounds) - 1
        if owned == self.num_buckets or ids.numel() == 0:
            return
        ids = ids.to(torch.int64)
        local = self.local_bucket(ids)
        if bool((local < 0).any() | (local >= owned).any()):
            at = int(((local < 0) | (local >= owned)).nonzero()[0])
            raise ValueError(
                f"raw id {int(ids[at])} is in bucket {int(local[at]) + self.first_bucket} of "
                f"{self.num_buckets}; this module owns buckets [{self.first_bucket}, "
                f"{self.first_bucket + owned}): route each id to the module of its bucket"
            )

    def search_index(self) -> SearchIndex:
        """What `remap` searches, built once (until `invalidate`): see `search_index_of`."""
        if self._search is None:
            self._search = self.search_index_of(self.raw_ids, self.rows)
        return self._search

    def search_index_of(self, raw_ids: torch.Tensor, rows: torch.Tensor) -> SearchIndex:
        """(raw ids sorted over all buckets ``[S]``, their rows ``[S]``, their slot positions
        ``[S]``, or None where that is the identity) of slot buffers laid out as this module's
        (an exported program passes its own buffers: see `MCHManagedCollisionModule._remap`)."""
        if len(self.bounds) == 2:
            return raw_ids, rows, None  # one bucket: sorted already
        order = torch.argsort(raw_ids, stable=True)
        return raw_ids[order], rows[order], order

    def invalidate(self) -> None:
        self._search = None

    def find(
        self, ids: torch.Tensor, index: SearchIndex | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(``[N]`` bool: the id holds a slot, ``[N]`` where it is (or would be) in the sorted
        ids of ``index``, by default `search_index`)."""
        sorted_ids, _, _ = self.search_index() if index is None else index
        at = torch.searchsorted(sorted_ids, ids).clamp(max=sorted_ids.numel() - 1)
        return (sorted_ids[at] == ids) & (ids != SENTINEL), at

    def remap(self, ids: torch.Tensor, index: SearchIndex | None = None) -> torch.Tensor:
        """``[N]`` raw ids -> ``[N]`` rows: the id's slot's row, else its bucket's pinned row
        (``index``: what to search, by default `search_index`)."""
        index = self.search_index() if index is None else index
        hit, at = self.find(ids, index)
        miss = self.miss_rows[self.local_bucket(ids)] if len(self.bounds) > 2 else self.miss_rows
        return torch.where(hit, index[1][at], miss)

    def sort_buckets(self) -> None:
        """Sort each bucket's slots by raw id (stable: the pinned slot stays last)."""
        order = torch.argsort(self.raw_ids, stable=True)
        if len(self.bounds) > 2:
            order = order[torch.argsort(self.slot_bucket[order], stable=True)]
        for tensor in (self.raw_ids, self.rows, *self.metadata.values()):
            tensor.copy_(tensor[order])
        self._search = None


@dataclass
class Window:
    """The ids seen since the last eviction, coalesced: unique ids with their metadata."""

    ids: torch.Tensor  # [U] unique raw ids, most frequent first (ties: smaller id first)
    counts: torch.Tensor  # [U] times seen
    last_access: torch.Tensor  # [U] last iteration seen

    @classmethod
    def coalesce(cls, batches: list[torch.Tensor], iters: list[int]) -> Window:
        values = torch.cat(batches)
        when = torch.cat([torch.full_like(b, it) for b, it in zip(batches, iters)])
        keep = values != SENTINEL
        values, when = values[keep], when[keep]
        ids, inverse, counts = torch.unique(values, return_inverse=True, return_counts=True)
        last = torch.zeros_like(counts).scatter_reduce_(
            0, inverse, when, reduce="amax", include_self=False
        )
        order = torch.argsort(counts, descending=True, stable=True)  # TorchRec's order
        return cls(ids[order], counts[order], last[order])

    def subset(self, mask: torch.Tensor) -> Window:
        return Window(self.ids[mask], self.counts[mask], self.last_access[mask])

    def metadata(self) -> dict[str, torch.Tensor]:
        return {COUNTS: self.counts, LAST_ACCESS: self.last_access}


@torch.no_grad()
def evict(
    slots: Slots, policy: MCHEvictionPolicy, current_iter: int, window: Window
) -> torch.Tensor:
    """One eviction: the window's ids and the slots compete, bucket by bucket, for the slots;
    returns the rows whose id changed (refilled or freed), for their embeddings to be reset."""
    window = _filtered(slots, policy, window)
    hit, index = slots.find(window.ids)
    _, _, order = slots.search_index()
    matched_at = index[hit] if order is None else order[index[hit]]
    matched, new = window.subset(hit), window.subset(~hit)
    meta = slots.metadata
    if COUNTS in meta:
        meta[COUNTS].index_add_(0, matched_at, matched.counts)
        meta[COUNTS][slots.pinned] = torch.iinfo(torch.int64).max
    if LAST_ACCESS in meta:
        meta[LAST_ACCESS][matched_at] = matched.last_access
        meta[LAST_ACCESS][slots.pinned] = current_iter
    free = torch.ones_like(slots.raw_ids, dtype=torch.bool).index_fill_(0, slots.pinned, False)
    candidates = free.nonzero().squeeze(1)  # [C] every slot but the pinned ones
    merged = {n: torch.cat([meta[n][candidates], new.metadata()[n]]) for n in meta}
    scores = policy.eviction_scores(current_iter, merged)
    expired = policy.expired(current_iter, merged)
    if expired is not None:
        scores = scores.masked_fill(expired, float("-inf"))
    bucket = torch.cat([slots.slot_bucket[candidates], slots.local_bucket(new.ids)])
    out, chosen = _select(bucket, scores, candidates.numel(), slots.capacity)
    out_at = candidates[out]
    changed = [slots.rows[out_at]]
    slots.raw_ids[out_at] = new.ids[chosen]
    for name, tensor in meta.items():
        tensor[out_at] = new.metadata()[name][chosen]
    if expired is not None:
        changed.append(_vacate(slots, candidates, expired, out))
    slots.sort_buckets()
    return torch.cat(changed)


def _filtered(slots: Slots, policy: MCHEvictionPolicy, window: Window) -> Window:
    """The window's ids that pass the policy's threshold filter, each bucket on its own."""
    if not policy.has_threshold_filter:
        return window
    if len(slots.bounds) == 2:
        return window.subset(_passed(policy, window.counts))
    bucket = slots.local_bucket(window.ids)
    keep = torch.zeros_like(window.ids, dtype=torch.bool)
    for b in range(len(slots.bounds) - 1):
        at = (bucket == b).nonzero().squeeze(1)
        if at.numel():
            keep[at] = _passed(policy, window.counts[at])
    return window.subset(keep)


def _passed(policy: MCHEvictionPolicy, counts: torch.Tensor) -> torch.Tensor:
    mask = policy.filter(counts)
    assert mask is not None, "called only when the policy has a threshold filter"
    return mask


def _select(
    bucket: torch.Tensor, scores: torch.Tensor, num_slots: int, capacity: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per bucket, the ``capacity[b]`` candidates with the highest scores (ties: lower index,
    so a slot's id beats a new id, as in TorchRec) keep or get a slot.

    Candidates ``[0, num_slots)`` are slots, the rest new ids. Returns (slot candidates that
    lose their id, new ids that win a slot - as offsets into the new ids), both bucket by bucket
    and best first, so the i-th winner takes the i-th loser's slot.
    """
    order = torch.argsort(scores, descending=True, stable=True)
    order = order[torch.argsort(bucket[order], stable=True)]
    sorted_bucket = bucket[order]
    per_bucket = torch.bincount(sorted_bucket, minlength=capacity.numel())
    starts = torch.cumsum(per_bucket, 0) - per_bucket
    rank = torch.arange(order.numel(), device=order.device) - starts[sorted_bucket]
    keep = rank < capacity[sorted_bucket]
    is_slot = order < num_slots
    return order[is_slot & ~keep], order[~is_slot & keep] - num_slots


def _vacate(
    slots: Slots, candidates: torch.Tensor, expired: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """Empty the slots whose id is past its ttl and was not replaced; returns their rows."""
    stale = expired[: candidates.numel()].clone()
    stale[out] = False
    at = candidates[stale]
    at = at[slots.raw_ids[at] != SENTINEL]
    slots.raw_ids[at] = SENTINEL
    for tensor in slots.metadata.values():
        tensor[at] = 0
    return slots.rows[at]
