"""`RecMetricComputation`: one metric's states for one or several tasks, lifetime and window,
combined across ranks when computed (TorchRec's class, without torchmetrics).

[Note: metric states across ranks]
A computation's states are tensors ``[n_tasks]`` (sums) or lists of ``[n_tasks, B]`` tensors
(kept examples, e.g. for AUC). ``update`` changes only this rank's states. ``compute()`` is a
collective when a process group is up (every rank of ``process_group`` must call it, in the same
order): it replaces each state by its value over all ranks (sums all-reduced, kept examples
gathered in rank order, by `shardkit.metrics._ranks`), computes, and puts the local states back,
so later updates and computes do not count other ranks twice. Ranks other than 0 get no values
unless ``compute_on_all_ranks``. ``local_compute()`` computes from this rank's states alone.

Each sum also has a window twin (``window_<name>``) over about the last ``window_size`` examples
of this rank: `WindowBuffer` keeps each update's contribution and subtracts the oldest once the
window is full.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.metrics._ranks import gather_rows, sum_over_ranks
from shardkit.metrics.metrics_config import RecComputeMode
from shardkit.metrics.metrics_namespace import MetricNameBase, MetricPrefix

__all__ = [
    "MAX_BUFFER_COUNT",
    "MetricComputationReport",
    "RecMetricComputation",
    "RecMetricException",
    "WindowBuffer",
]

logger = logging.getLogger(__name__)

MAX_BUFFER_COUNT = 1000


class RecMetricException(Exception):
    """A metric got inputs it cannot use."""


@dataclass(frozen=True)
class MetricComputationReport:
    """One computed value: its name, its prefix (lifetime or window) and the value per task."""

    name: MetricNameBase
    metric_prefix: MetricPrefix
    value: torch.Tensor
    description: str | None = None


class WindowBuffer:
    """The contributions of the latest updates to one window state, at most ``max_size``
    examples (and ``max_buffer_count`` updates) of them."""

    def __init__(self, max_size: int, max_buffer_count: int) -> None:
        self._max_size = max_size
        self._buffers: deque[torch.Tensor] = deque(maxlen=max_buffer_count)
        self._used_sizes: deque[int] = deque(maxlen=max_buffer_count)
        self._window_used_size = 0

    def aggregate_state(self, window_state: torch.Tensor, curr_state: torch.Tensor,
                        size: int) -> None:  # fmt: skip
        """Add ``curr_state`` (from ``size`` examples) to ``window_state`` in place, dropping
        the oldest contributions that no longer fit."""
        if len(self._buffers) == self._buffers.maxlen:
            self._drop_oldest(window_state)
        self._buffers.append(curr_state.clone())
        self._used_sizes.append(size)
        window_state += curr_state
        self._window_used_size += size
        while self._window_used_size > self._max_size:
            self._drop_oldest(window_state)

    def _drop_oldest(self, window_state: torch.Tensor) -> None:
        window_state -= self._buffers.popleft()
        self._window_used_size -= self._used_sizes.popleft()

    @property
    def buffers(self) -> deque[torch.Tensor]:
        return self._buffers


Reduction = str | Callable[[torch.Tensor], torch.Tensor]


class RecMetricComputation(nn.Module, abc.ABC):
    """The states and arithmetic of one metric. See [Note: metric states across ranks].

    Args:
        my_rank: this rank (only rank 0 reports, unless ``compute_on_all_ranks``).
        batch_size: examples per update and rank.
        n_tasks: tasks computed together (1 unless the tasks are fused).
        window_size: this rank's window, in examples (0: no window states).
        compute_on_all_ranks: every rank reports the values.
        should_validate_update: track whether a task ever had a non-zero weight.
        compute_mode: `RecComputeMode` (kept for subclasses).
        process_group: the ranks to combine (default: the world).
        fused_update_limit: kept for subclasses (updates are fused by `RecMetric`).
        allow_missing_label_with_zero_weight: kept for subclasses (NE uses it).
        enable_pt2_compile: accepted; shardkit does not compile metric updates.
    """

    has_valid_update: torch.Tensor  # [n_tasks] uint8, a state when should_validate_update

    def __init__(self, my_rank: int, batch_size: int, n_tasks: int, window_size: int,
                 compute_on_all_ranks: bool = False, should_validate_update: bool = False,
                 compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION,
                 process_group: dist.ProcessGroup | None = None, fused_update_limit: int = 0,
                 allow_missing_label_with_zero_weight: bool = False,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__()
        kwargs.pop("enable_pt2_compile", None)
        kwargs.pop("should_clone_update_inputs", None)
        if kwargs:
            raise TypeError(
                f"{type(self).__name__} got unknown argument(s) {sorted(kwargs)} (from the "
                "metric's RecMetricDef.arguments?); see its class for the ones it takes"
            )
        self._my_rank, self._n_tasks, self._batch_size = my_rank, n_tasks, batch_size
        self._window_size = window_size
        self._compute_on_all_ranks = compute_on_all_ranks
        self._should_validate_update = should_validate_update
        self._compute_mode = compute_mode
        self._process_group = process_group
        self._fused_update_limit = fused_update_limit
        self._allow_missing_label_with_zero_weight = allow_missing_label_with_zero_weight
        self._reductions: dict[str, Reduction] = {}
        self._defaults: dict[str, Any] = {}
        self._batch_window_buffers: dict[str, WindowBuffer] | None = {} if window_size > 0 else None
        self._local_states: dict[str, Any] | None = None
        if should_validate_update:
            self._add_state("has_valid_update", torch.zeros(n_tasks, dtype=torch.uint8),
                            add_window_state=False, persistent=True,
                            dist_reduce_fx=lambda x: torch.any(x, dim=0).byte())  # fmt: skip

    @staticmethod
    def get_window_state_name(state_name: str) -> str:
        return f"window_{state_name}"

    def get_window_state(self, state_name: str) -> torch.Tensor:
        return getattr(self, self.get_window_state_name(state_name))

    def _add_state(self, name: str, default: Any, add_window_state: bool,
                   dist_reduce_fx: Reduction = "sum", persistent: bool = False) -> None:  # fmt: skip
        """A state: a tensor (a buffer: moves with ``.to``, in ``state_dict`` if ``persistent``)
        or a list of tensors (kept examples, concatenated across ranks)."""
        self._reductions[name] = dist_reduce_fx
        self._defaults[name] = default
        if isinstance(default, torch.Tensor):
            self.register_buffer(name, default.detach().clone(), persistent=persistent)
        else:
            setattr(self, name, list(default))
        if add_window_state:
            if self._batch_window_buffers is None:
                raise RuntimeError(f"{type(self).__name__}: window state {name!r} with window 0")
            self._add_state(self.get_window_state_name(name), default, add_window_state=False,
                            dist_reduce_fx=dist_reduce_fx, persistent=False)  # fmt: skip
            self._batch_window_buffers[self.get_window_state_name(name)] = WindowBuffer(
                self._window_size, MAX_BUFFER_COUNT
            )

    def _aggregate_window_state(self, state_name: str, state: torch.Tensor,
                                num_samples: int) -> None:  # fmt: skip
        assert self._batch_window_buffers is not None, "window states need window_size > 0"
        name = self.get_window_state_name(state_name)
        self._batch_window_buffers[name].aggregate_state(getattr(self, name), state, num_samples)

    @abc.abstractmethod
    def update(self, *, predictions: torch.Tensor | None, labels: torch.Tensor,
               weights: torch.Tensor | None, **kwargs: Any) -> None:  # fmt: skip
        """Add a batch: ``predictions``, ``labels``, ``weights`` ``[n_tasks, B]``."""

    @abc.abstractmethod
    def _compute(self) -> list[MetricComputationReport]:
        """The values from the current states."""

    def pre_compute(self) -> None:
        """Called before each compute (a hook for subclasses)."""

    def compute(self) -> list[MetricComputationReport]:
        """The values over all ranks: a collective (see [Note: metric states across ranks])."""
        with self._synced():
            if self._my_rank == 0 or self._compute_on_all_ranks:
                return self._compute()
            return []

    def local_compute(self) -> list[MetricComputationReport]:
        """The values of this rank's states alone (no collective)."""
        return self._compute()

    def sync(self) -> None:
        """Replace the states by their values over all ranks (a collective); `unsync` undoes."""
        self._local_states = {name: getattr(self, name) for name in self._reductions}
        for name, reduction in self._reductions.items():
            setattr(self, name, self._reduced(getattr(self, name), reduction))

    def unsync(self) -> None:
        """Put this rank's own states back after `sync`."""
        if self._local_states is None:
            raise RecMetricException(f"{type(self).__name__}.unsync() without sync()")
        for name, value in self._local_states.items():
            setattr(self, name, value)
        self._local_states = None

    @property
    def _is_synced(self) -> bool:
        return self._local_states is not None

    @contextlib.contextmanager
    def _synced(self) -> Iterator[None]:
        self.sync()
        try:
            yield
        finally:
            self.unsync()

    def _reduced(self, value: Any, reduction: Reduction) -> Any:
        group = self._process_group
        if isinstance(value, list):  # kept examples [n_tasks, B_i]: all ranks', in rank order
            local = torch.cat(value, dim=-1) if value else torch.zeros(self._n_tasks, 0)
            rows = gather_rows(local.transpose(0, 1).contiguous(), group)  # [total, n_tasks]
            return [rows.transpose(0, 1).to(local.device)]
        if reduction == "sum":
            return sum_over_ranks(value, group).to(device=value.device, dtype=value.dtype)
        gathered = gather_rows(value.unsqueeze(0), group)  # [world, ...]
        return reduction(gathered).to(value.device)  # type: ignore[operator]

    def reset(self) -> None:
        """Forget every update (on this rank)."""
        for name, default in self._defaults.items():
            fresh = default.detach().clone() if isinstance(default, torch.Tensor) else list(default)
            if isinstance(fresh, torch.Tensor):
                fresh = fresh.to(getattr(self, name).device)
            setattr(self, name, fresh)
        if self._batch_window_buffers is not None:
            self._batch_window_buffers = {
                name: WindowBuffer(self._window_size, MAX_BUFFER_COUNT)
                for name in self._batch_window_buffers
            }
