"""The life of a unit in one iteration: hooks that gather, free and reduce at the right moments.

[Note: one iteration]
Forward: a unit's pre-forward hook gathers its parameters (waiting for a prefetch if one was
started) and, with forward prefetch, starts gathering the unit that came next in the previous
iteration. Its post-forward hook frees them again (FULL_SHARD; not the outermost unit, whose
backward comes first) and registers a hook on the output's gradient.
Backward: that hook (pre-backward) gathers the parameters again and, with BACKWARD_PRE, starts
gathering the unit whose backward comes next. When the last parameter of the unit has its
gradient accumulated (post-backward), the gradients are reduce-scattered asynchronously (at
most one unit's reduction in flight, waited for when the next starts) and the parameters freed.
A callback queued at the first pre-backward runs when autograd finishes: it reduces what is left
(parameters that got no gradient trigger no post-backward), waits for every reduction and frees
every gathered parameter, so that after ``backward()`` each shard holds its averaged gradient.
Every decision depends only on the program, never on one rank's data, so all ranks issue the same
collectives in the same order.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd import Variable

from shardkit.fsdp._api import (
    BackwardPrefetch,
    FullStateDictConfig,
    MixedPrecision,
    PrefetchPolicy,
    ShardedStateDictConfig,
    StateDictType,
)
from shardkit.fsdp._memory import BufferPool, FreedMemory
from shardkit.fsdp._param_group import ParamGroup

__all__ = ["FSDPState", "TreeContext", "UnitConfig", "get_state"]

logger = logging.getLogger(__name__)

STATE_ATTR = "_shardkit_fsdp_state"


@dataclasses.dataclass(frozen=True)
class UnitConfig:
    """How one unit behaves (derived from the strategy and policies)."""

    reshard_after_forward: bool
    mp: MixedPrecision
    prefetch: PrefetchPolicy


def get_state(module: nn.Module) -> FSDPState | None:
    """The unit whose hooks live on ``module``, if any."""
    return module.__dict__.get(STATE_ATTR)


class TreeContext:
    """What the units of one tree share: execution order, pending reductions, settings."""

    def __init__(self, root: FSDPState) -> None:
        self.units: list[FSDPState] = [root]
        self.forward_order: list[FSDPState] = []
        self._recording: list[FSDPState] = []
        self.active_root: FSDPState | None = None
        self.in_backward = False
        self.requires_grad_sync = True
        self._pending_reduce: list[FSDPState] = []
        self.reduce_buffers = BufferPool()
        self.freed = FreedMemory()
        self.state_dict_type = StateDictType.FULL_STATE_DICT
        self.state_dict_config: FullStateDictConfig | ShardedStateDictConfig = FullStateDictConfig()
        self.optim_state_dict_config: FullStateDictConfig | ShardedStateDictConfig = (
            FullStateDictConfig()
        )

    # ---- order --------------------------------------------------------------------------------

    def begin_forward(self, root: FSDPState) -> None:
        if self.in_backward and _graph_task_id() == -1:
            logger.warning("the previous backward did not finish (it raised); resetting units")
            self._reset_after_backward()
        self.active_root = root
        self._recording = []

    def end_forward(self) -> None:
        self.forward_order = self._recording
        self.active_root = None

    def record(self, unit: FSDPState) -> bool:
        """Note that ``unit`` runs now; False if it already ran in this forward."""
        if unit in self._recording:
            return False
        self._recording.append(unit)
        return True

    def next_in_forward(self, unit: FSDPState) -> FSDPState | None:
        """The unit that ran after ``unit`` last iteration, if this one follows the same order."""
        pos = len(self._recording) - 1
        order = self.forward_order
        if pos + 1 < len(order) and order[pos] is unit:
            return order[pos + 1]
        return None

    def next_in_backward(self, unit: FSDPState) -> FSDPState | None:
        """The unit whose backward is expected next: the reverse of forward order, the outermost
        unit first."""
        order = self.forward_order
        if unit not in order:
            return None
        pos = order.index(unit)
        target = order[-1] if pos == 0 else order[pos - 1]
        if target is unit or target._post_backward_done:
            return None
        return target

    # ---- backward -----------------------------------------------------------------------------

    def begin_backward(self) -> None:
        if self.in_backward:
            return
        self.in_backward = True
        Variable._execution_engine.queue_callback(self.finish_backward)

    def add_pending_reduce(self, unit: FSDPState) -> None:
        """Keep at most one unit's reduction in flight: wait for the previous one first."""
        self.finish_pending_reduce()
        self._pending_reduce.append(unit)

    def finish_pending_reduce(self) -> None:
        while self._pending_reduce:
            self._pending_reduce.pop(0).group.finish_reduce(self.reduce_buffers)

    def finish_backward(self) -> None:
        """Runs once autograd is done. See [Note: one iteration]."""
        for unit in reversed(self.units):
            if not unit._post_backward_done:
                unit.post_backward(prefetch=False)
            else:
                unit.reduce_grads()  # gradients that arrived after the unit's post-backward
        self.finish_pending_reduce()
        self._reset_after_backward()
        self.freed.flush()

    def _reset_after_backward(self) -> None:
        for unit in self.units:
            unit.group.reshard()
            unit.reset_iteration()
        self._pending_reduce.clear()
        self.reduce_buffers.clear()
        self.in_backward = False


def _graph_task_id() -> int:
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current() if current is not None else -1


class FSDPState:
    """One unit: its parameters and the hooks on the module whose forward uses them.

    See [Note: one iteration]. ``name`` is the module's path for messages and logs.
    """

    def __init__(
        self, module: nn.Module, group: ParamGroup, config: UnitConfig, *, name: str
    ) -> None:
        self.module = module
        self.group = group
        self.config = config
        self.name = name
        self.parent: FSDPState | None = None
        self.context = TreeContext(self)
        self._pre_backward_done = False
        self._post_backward_done = False
        self._num_ready = 0
        self._num_expected = group.num_grad_params
        for param in group.params:
            param.on_grad_ready = self._on_grad_ready
        module.__dict__[STATE_ATTR] = self
        module.register_forward_pre_hook(self._pre_forward, with_kwargs=True, prepend=True)
        module.register_forward_hook(self._post_forward, always_call=True)

    def adopt(self, children: list[FSDPState]) -> None:
        """Make ``children`` (units nested in this unit's module) part of this unit's tree."""
        for child in children:
            child.parent = self
            for unit in child.context.units:
                if unit not in self.context.units:
                    self.context.units.insert(len(self.context.units) - 1, unit)
        for unit in self.context.units:
            unit.context = self.context

    @property
    def is_root(self) -> bool:
        return self.parent is None

    # ---- forward ------------------------------------------------------------------------------

    def _pre_forward(self, module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
        ctx = self.context
        if ctx.active_root is None:
            ctx.begin_forward(self)
        mp = self.config.mp
        if mp.param_dtype is not None and (
            mp.cast_forward_inputs or (mp.cast_root_forward_inputs and ctx.active_root is self)
        ):
            args, kwargs = _cast_floats((args, kwargs), mp.param_dtype)
        first = ctx.record(self)
        if any(p.sharded.is_meta for p in self.group.params):
            raise ValueError(
                f"unit {self.name!r} still has parameters on the meta device; initialise them "
                "first: model.materialize() after fully_shard, or param_init_fn= when wrapping "
                "with FullyShardedDataParallel"
            )
        self._num_expected = self.group.num_grad_params
        self.group.start_unshard()
        if first and self.config.prefetch.forward and not ctx.in_backward:
            upcoming = ctx.next_in_forward(self)
            if upcoming is not None:
                upcoming.group.start_unshard()
        self.group.unshard()
        return args, kwargs

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> Any:
        ctx = self.context
        grad_enabled = torch.is_grad_enabled()
        if grad_enabled and not ctx.in_backward:
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(self._pre_backward_hook)
        reshard = not grad_enabled or (
            self.config.reshard_after_forward and ctx.active_root is not self
        )
        if reshard and not ctx.in_backward:
            self.group.reshard()
        if ctx.active_root is self:
            ctx.end_forward()
        return output

    # ---- backward -----------------------------------------------------------------------------

    def _pre_backward_hook(self, grad: torch.Tensor) -> None:
        self.pre_backward()

    def pre_backward(self) -> None:
        ctx = self.context
        ctx.begin_backward()
        if self._pre_backward_done:
            return
        self._pre_backward_done = True
        self.group.start_unshard()
        if self.config.prefetch.backward is BackwardPrefetch.BACKWARD_PRE:
            self._prefetch_backward()
        self.group.unshard()

    def _prefetch_backward(self) -> None:
        upcoming = self.context.next_in_backward(self)
        if upcoming is not None:
            upcoming.group.start_unshard()

    def _on_grad_ready(self, _param: Any) -> None:
        self.context.begin_backward()
        self._num_ready += 1
        if self._num_ready >= self._num_expected:
            self.post_backward(prefetch=True)

    def post_backward(self, *, prefetch: bool) -> None:
        """Reduce this unit's gradients (unless in no_sync) and free its gathered parameters."""
        if self._post_backward_done:
            return
        self._post_backward_done = True
        if prefetch and self.config.prefetch.backward is BackwardPrefetch.BACKWARD_POST:
            self._prefetch_backward()
        freed = self.group.new_grad_bytes() if self.context.requires_grad_sync else 0
        self.reduce_grads()
        self.group.reshard()
        if self.group.on_cpu:
            self.context.freed.add(freed)  # See [Note: returning memory]

    def reduce_grads(self) -> None:
        ctx = self.context
        if ctx.requires_grad_sync and self.group.has_grads():
            ctx.add_pending_reduce(self)
            self.group.start_reduce(ctx.reduce_buffers)

    def reset_iteration(self) -> None:
        self._pre_backward_done = False
        self._post_backward_done = False
        self._num_ready = 0


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside nested tuples, lists, dicts and dataclasses."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    return []


def _cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    cast: Callable[[Any], Any] = lambda item: _cast_floats(item, dtype)  # noqa: E731
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*map(cast, obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map(cast, obj))
    if isinstance(obj, dict):
        return {key: cast(value) for key, value in obj.items()}
    return obj
