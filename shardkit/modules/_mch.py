"""`MCHManagedCollisionModule`: TorchRec's zero-collision remapper, state laid out in buckets."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from shardkit.modules._mc_base import MAX_BUCKETS, ManagedCollisionModule
from shardkit.modules._mc_policies import MCHEvictionPolicy
from shardkit.modules._mc_slots import SENTINEL, Slots, Window, bucket_bounds, bucket_of, evict
from shardkit.sparse import JaggedTensor

__all__ = ["MCHManagedCollisionModule"]

logger = logging.getLogger(__name__)

HashFunc = Callable[[torch.Tensor, int], torch.Tensor]


class MCHManagedCollisionModule(ManagedCollisionModule):
    """Zero-collision remapping of one table: the most valuable raw ids each get their own row.

    In training, every forward is one iteration: its ids are recorded, and every
    ``eviction_interval`` iterations the ids recorded since the last eviction compete with the
    kept ids for the rows (the policy scores them; ties keep the kept id). An id that holds no
    row is looked up in its bucket's reserved last row. In eval mode ids are only remapped.
    See [Note: managed-collision slots] for the state and how it shards.

    Args:
        zch_size: rows of the table (its ``num_embeddings``); up to ``zch_size - buckets`` ids
            are kept.
        device: where the state lives.
        eviction_policy: which ids keep their rows (`LFU_EvictionPolicy`, ...).
        eviction_interval: training iterations between evictions (an eviction happens at every
            iteration that is a multiple of it).
        input_hash_size: range of the ids after ``input_hash_func``.
        input_hash_func: optional ``f(ids, input_hash_size) -> ids``, applied first.
        mch_size, mch_hash_func: ignored (deprecated in TorchRec too).
        name: the table's name, for messages.
        output_global_offset: first row of this module's range in the table (a rank's shard).
        output_segments: row bounds of all the table's buckets (a rank's shard); default:
            ``buckets`` buckets over ``[output_global_offset, output_global_offset + zch_size)``.
        buckets: how many buckets (row ranges) the rows are split into; row-wise sharding over
            ``W`` ranks needs ``buckets`` divisible by ``W``, or 1 (then the sharder gives each
            rank one bucket, as TorchRec does).
    """

    _mch_sorted_raw_ids: torch.Tensor  # buffers, registered in __init__
    _mch_remapped_ids_mapping: torch.Tensor

    def __init__(
        self,
        zch_size: int,
        device: torch.device | str | None,
        eviction_policy: MCHEvictionPolicy,
        eviction_interval: int,
        *,
        input_hash_size: int = (2**63) - 1,
        input_hash_func: HashFunc | None = None,
        mch_size: int | None = None,
        mch_hash_func: HashFunc | None = None,
        name: str | None = None,
        output_global_offset: int = 0,
        output_segments: Sequence[int] | None = None,
        buckets: int = 1,
    ) -> None:
        if not isinstance(eviction_policy, MCHEvictionPolicy):
            raise TypeError(
                f"table {name!r}: eviction_policy must be an MCHEvictionPolicy (e.g. "
                f"LFU_EvictionPolicy()), got {type(eviction_policy).__name__}"
            )
        if mch_size is not None or mch_hash_func is not None:
            logger.warning("mch_size and mch_hash_func are deprecated (as in TorchRec): ignored")
        if output_segments is None:
            output_segments = bucket_bounds(zch_size, buckets, output_global_offset)
        segments = [int(s) for s in output_segments]
        local = _local_bounds(name, segments, output_global_offset, zch_size)
        _check_layout(name, eviction_interval, segments)
        super().__init__(device, segments)
        self._name = name
        self._zch_size = zch_size
        self._eviction_policy = eviction_policy
        self._eviction_interval = eviction_interval
        self._input_hash_size = input_hash_size
        self._input_hash_func = input_hash_func
        self._output_global_offset = output_global_offset
        self._segments = segments
        self._local_bounds = local
        self._init_state()

    def _init_state(self) -> None:
        def slots() -> torch.Tensor:
            return torch.zeros(self._zch_size, dtype=torch.int64, device=self.device)

        self.register_buffer("_mch_sorted_raw_ids", slots())
        self.register_buffer("_mch_remapped_ids_mapping", slots())
        for name in self._eviction_policy.metadata_names:
            self.register_buffer(f"_mch_{name}", slots())
        self._current_iter = -1  # _current_iter_tensor, cached (-1: read it first)
        self._last_eviction_iter = -1  # set with _current_iter
        self._window: list[torch.Tensor] = []  # ids seen since the last eviction ...
        self._window_iters: list[int] = []  # ... and the iteration of each batch of them
        self._evicted_rows: list[torch.Tensor] = []
        self._build_slots()
        self._slots.reset()

    def _build_slots(self) -> None:
        names = self._eviction_policy.metadata_names
        self._slots = Slots(
            raw_ids=self._mch_sorted_raw_ids,
            rows=self._mch_remapped_ids_mapping,
            metadata={name: getattr(self, f"_mch_{name}") for name in names},
            bounds=self._local_bounds,
            first_bucket=self._segments.index(self._output_global_offset),
            num_buckets=len(self._segments) - 1,
            input_size=self._input_hash_size,
        )

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        super()._apply(fn, recurse)
        self._build_slots()  # the buffers may be new tensors (.to(device))
        self._window = [fn(ids) for ids in self._window]
        self._evicted_rows = [fn(rows) for rows in self._evicted_rows]
        return self

    def preprocess(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        if self._input_hash_func is None:
            return features
        return {
            name: _with_values(jt, self._input_hash_func(jt.values(), self._input_hash_size))
            for name, jt in features.items()
        }

    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """In training, record the ids and, every ``eviction_interval`` iterations, evict. The
        count starts at the iteration the module starts (or resumes) at, as TorchRec's: a
        module loaded at iteration 5 with interval 2 evicts at 7, 9, ... (the ids recorded
        since the last eviction before the save are not in the checkpoint)."""
        if not self.training:
            return features
        if self._current_iter < 0:
            self._current_iter = int(self._current_iter_tensor.item())
            self._last_eviction_iter = self._current_iter
        self._current_iter += 1
        self._current_iter_tensor.fill_(self._current_iter)
        for jt in features.values():
            self._window.append(jt.values().detach().to(torch.int64))
            self._window_iters.append(self._current_iter)
        if self._current_iter - self._last_eviction_iter == self._eviction_interval:
            self._evict_window()
            self._last_eviction_iter = self._current_iter
        return features

    def _evict_window(self) -> None:
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        window = Window.coalesce(
            self._window or [empty], self._window_iters or [self._current_iter]
        )
        self._window, self._window_iters = [], []
        changed = evict(self._slots, self._eviction_policy, self._current_iter, window)
        self._evicted_rows.append(changed)
        logger.debug(
            "table %s, iteration %d: %d rows changed id",
            self._name, self._current_iter, changed.numel(),
        )  # fmt: skip

    def remap(
        self, features: dict[str, JaggedTensor], mutate_miss_lengths: bool = True
    ) -> dict[str, JaggedTensor]:
        """Each id -> its row (ids without a row -> their bucket's reserved row)."""
        for jt in features.values():
            self._slots.check_buckets(jt.values())
        return self._remap(features)

    def _remap(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        index = None
        if torch.compiler.is_exporting():  # see [Note: managed collision in an exported program]
            index = self._slots.search_index_of(
                self._mch_sorted_raw_ids, self._mch_remapped_ids_mapping
            )
        out = {}
        for name, jt in features.items():
            rows = self._slots.remap(jt.values().to(torch.int64), index)
            out[name] = _with_values(jt, rows.to(jt.values().dtype))
        return out

    def forward(
        self, features: dict[str, JaggedTensor], mutate_miss_lengths: bool = True
    ) -> dict[str, JaggedTensor]:
        """``{name: JaggedTensor of raw ids}`` -> the same with rows as values."""
        features = self.preprocess(features)
        for jt in features.values():
            self._slots.check_buckets(jt.values())  # before profile records anything
        features = self.profile(features)
        return self._remap(features)

    @torch.no_grad()
    def evict(self) -> torch.Tensor | None:
        """``[E]`` rows whose id changed (refilled or freed) since the last call, or None."""
        if not self._evicted_rows:
            return None
        rows = torch.unique(torch.cat(self._evicted_rows))
        self._evicted_rows = []
        return rows

    def output_size(self) -> int:
        return self._zch_size

    def input_size(self) -> int:
        return self._input_hash_size

    def buckets(self) -> int:
        return self._slots.num_buckets

    def output_segments(self) -> list[int]:
        """Row bounds of all the table's buckets (``buckets() + 1`` values)."""
        return list(self._segments)

    def bucket_of(self, ids: torch.Tensor) -> torch.Tensor:
        """``[N]`` the bucket (of all ``buckets()``) of each id, after `preprocess`: a sharded
        table sends each id to the rank that owns its bucket."""
        return bucket_of(ids.to(torch.int64), self._slots.num_buckets, self._input_hash_size)

    def open_slots(self) -> torch.Tensor:
        empty = (self._mch_sorted_raw_ids == SENTINEL).sum() - (len(self._local_bounds) - 1)
        return empty.reshape(1)

    def reset_inference_mode(self) -> None:
        """Forget the ids recorded since the last eviction (TorchRec's name)."""
        self._window, self._window_iters = [], []

    def validate_state(self) -> None:
        """After ``load_state_dict``: same buckets, rows a per-bucket permutation; re-sorted."""
        saved = [int(s) for s in self._output_segments_tensor.tolist() if s >= 0]
        if saved != self._segments:
            raise ValueError(
                f"managed-collision state of table {self._name!r} was saved with bucket bounds "
                f"{saved}; this module has {self._segments}: build it with the zch_size and "
                "buckets of the saved one"
            )
        self._build_slots()
        _check_rows(self._slots, self._name)
        self._slots.sort_buckets()
        _check_pinned(self._slots, self._name)
        _check_id_buckets(self._slots, self._name)
        self._current_iter = -1
        self.reset_inference_mode()

    def rebuild_with_output_id_range(
        self,
        output_id_range: tuple[int, int],
        output_segments: Sequence[int] | None = None,
        device: torch.device | str | None = None,
    ) -> MCHManagedCollisionModule:
        """A fresh module for rows ``[start, end)`` (whole buckets) of this module's table; its
        state is slots ``[start, end)`` of the table's ``state_dict`` (buffers ``_mch_*``)."""
        start, end = output_id_range
        return type(self)(
            end - start,
            device or self.device,
            self._eviction_policy,
            self._eviction_interval,
            input_hash_size=self._input_hash_size,
            input_hash_func=self._input_hash_func,
            name=self._name,
            output_global_offset=start,
            output_segments=output_segments or self._segments,
        )

    def rebuild_with_buckets(self, buckets: int) -> MCHManagedCollisionModule:
        """A fresh module for the same table with ``buckets`` buckets (no state)."""
        return type(self)(
            self._zch_size,
            self.device,
            self._eviction_policy,
            self._eviction_interval,
            input_hash_size=self._input_hash_size,
            input_hash_func=self._input_hash_func,
            name=self._name,
            output_global_offset=self._output_global_offset,
            buckets=buckets,
        )

    def holds_ids(self) -> bool:
        """Whether any slot holds an id, or ids wait for the next eviction (the module has
        been trained or loaded)."""
        return bool(self._window) or bool((self._mch_sorted_raw_ids != SENTINEL).any())

    def extra_repr(self) -> str:
        return (
            f"zch_size={self._zch_size}, buckets={self.buckets()}, "
            f"eviction_policy={type(self._eviction_policy).__name__}, "
            f"eviction_interval={self._eviction_interval}"
        )


def _local_bounds(name: str | None, segments: list[int], offset: int, size: int) -> list[int]:
    end = offset + size
    if segments != sorted(segments) or offset not in segments or end not in segments:
        raise ValueError(
            f"table {name!r}: rows [{offset}, {end}) must start and end on the bucket bounds "
            f"{segments} (increasing): a module holds whole buckets"
        )
    return segments[segments.index(offset) : segments.index(end) + 1]


def _check_layout(name: str | None, eviction_interval: int, segments: list[int]) -> None:
    buckets = len(segments) - 1
    if eviction_interval < 1:
        raise ValueError(
            f"table {name!r}: eviction_interval must be >= 1 iteration, got {eviction_interval}"
        )
    if not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"table {name!r}: buckets must be in [1, {MAX_BUCKETS}], got {buckets}")
    smallest = min(end - start for start, end in itertools.pairwise(segments))
    if smallest < 2:
        raise ValueError(
            f"table {name!r}: rows {segments[0]}..{segments[-1]} in {buckets} buckets give a "
            f"bucket of {smallest} row(s); each bucket needs >= 2 rows (its last row takes the "
            f"ids it does not hold): use zch_size >= {2 * buckets} or fewer buckets"
        )


def _with_values(jt: JaggedTensor, values: torch.Tensor) -> JaggedTensor:
    return JaggedTensor(
        values=values, lengths=jt.lengths(), offsets=jt.offsets(), weights=jt.weights_or_none()
    )


def _check_rows(slots: Slots, name: str | None) -> None:
    """Each bucket's slots map to distinct rows of that bucket."""
    start, end = slots.bounds[0], slots.bounds[-1]
    rows = slots.rows
    upper = torch.tensor(slots.bounds[1:], device=rows.device)
    bucket_of_row = torch.bucketize(rows, upper, right=True)
    distinct = torch.equal(torch.sort(rows).values, torch.arange(start, end, device=rows.device))
    if not distinct or not torch.equal(bucket_of_row, slots.slot_bucket):
        raise ValueError(
            f"managed-collision state of table {name!r} is damaged: _mch_remapped_ids_mapping "
            f"must give each slot a distinct row of its own bucket in [{start}, {end}); load a "
            "state_dict saved by a module with the same zch_size and buckets"
        )


def _check_id_buckets(slots: Slots, name: str | None) -> None:
    """Each saved id sits in the slots of its own bucket under `bucket_of`'s rule. A state
    saved with several buckets by shardkit before the block bucketization (a hash of the id
    chose its bucket) breaks it, and would remap ids silently wrong: refused."""
    held = slots.raw_ids != SENTINEL
    if slots.num_buckets == 1 or not bool(held.any()):
        return
    ids = slots.raw_ids[held]
    expected = bucket_of(ids, slots.num_buckets, slots.input_size)
    found = slots.slot_bucket[held] + slots.first_bucket
    wrong = (expected != found).nonzero()
    if wrong.numel():
        at = int(wrong[0])
        raise ValueError(
            f"managed-collision state of table {name!r}: raw id {int(ids[at])} is saved in "
            f"bucket {int(found[at])} of {slots.num_buckets}, but belongs to bucket "
            f"{int(expected[at])} (TorchRec's block bucketization: ids in blocks of "
            f"ceil(input_hash_size / buckets) = {-(-slots.input_size // slots.num_buckets)}); "
            "the state was saved with another bucket rule (shardkit before the block "
            "bucketization hashed ids to buckets) or another input_hash_size; load it with the "
            "shardkit and input_hash_size that saved it, or start the remapper afresh (load the "
            "checkpoint without its _mch_* buffers)"
        )


def _check_pinned(slots: Slots, name: str | None) -> None:
    """The last slot of each bucket is empty and keeps the bucket's last row."""
    pinned = slots.pinned
    empty = bool((slots.raw_ids[pinned] == SENTINEL).all())
    if not empty or not torch.equal(slots.rows[pinned], slots.miss_rows):
        raise ValueError(
            f"managed-collision state of table {name!r} is damaged: the last slot of each bucket "
            "must stay empty and keep the bucket's last row; load a state_dict saved by a module "
            "with the same zch_size and buckets"
        )
