"""The life of a unit in one iteration: hooks that gather, free and reduce at the right moments.

[Note: one iteration]
Forward: a unit's pre-forward hook gathers its parameters (waiting for a prefetch if one was
started) and starts gathering the units it prefetches: those ``set_modules_to_forward_prefetch``
named, else (forward prefetch) the unit that came next in the previous iteration. Its post-forward
hook frees them again when it reshards after forward (FSDP2's default: every unit but the one
whose forward started the iteration, whose backward comes first) and registers a hook on the
output's gradient.
Backward: that hook (pre-backward) gathers the parameters again and, with BACKWARD_PRE, starts
gathering the units whose backward comes next (``set_modules_to_backward_prefetch``'s, else the
previous one in forward order). When the last parameter of the unit has its gradient accumulated
(post-backward), the gradients are reduce-scattered asynchronously (at most one unit's reduction
in flight, waited for when the next starts) and the parameters freed (unless the unit keeps them:
``set_reshard_after_backward(False)``). Without gradient sync the gradients stay on the gathered
parameters, summed in the reduce dtype, until a backward with sync reduces them all.
A callback queued at the first pre-backward runs when autograd finishes: it reduces what is left
(parameters that got no gradient trigger no post-backward), waits for every reduction and frees
every gathered parameter, so that after ``backward()`` each shard holds its averaged gradient.
After a backward that ``set_is_last_backward(False)`` announced, the last reduction is left in
flight: the next forward, backward, optimizer step, state dict or clipping waits for it.
Every decision depends only on the program, never on one rank's data, so all ranks issue the same
collectives in the same order.

[Note: training state]
A tree is in one `TrainingState` at a time: IDLE between iterations, FORWARD from the pre-forward
of the unit that starts the forward (the "forward root") to its post-forward, BACKWARD from the
first pre-backward (or gradient) to the callback that ends backward, and RE_FORWARD while
activation checkpointing runs a unit's forward again inside backward. A re-forward is not a new
forward: it leaves the recorded forward order and the forward root alone (both still steer
backward prefetch and the next iteration's forward prefetch), starts no forward prefetch, keeps
what it gathers for the backward that follows (no reshard after forward, no new pre-backward
hooks), and returns to BACKWARD when the unit that started it finishes. A forward that starts in
BACKWARD outside autograd means the previous backward raised: the tree is reset first.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import weakref
from typing import Any

import torch
from torch import nn
from torch.autograd import Variable

from shardkit.fsdp._config import Precision, Prefetch, StateDictForm
from shardkit.fsdp._memory import UNSHARDED_POOL, BufferPool, FreedMemory
from shardkit.fsdp._nested import cast_floats, tensors_in
from shardkit.fsdp._param_group import ParamGroup
from shardkit.fsdp.api import BackwardPrefetch

__all__ = [
    "FSDPState",
    "TrainingState",
    "TreeContext",
    "UnitConfig",
    "finish_lingering",
    "get_state",
    "hook_optimizer",
]

logger = logging.getLogger(__name__)

STATE_ATTR = "_shardkit_fsdp_state"


@enum.unique
class TrainingState(enum.Enum):
    """Where a tree is in an iteration. See [Note: training state]."""

    IDLE = "idle"
    FORWARD = "forward"
    BACKWARD = "backward"
    RE_FORWARD = "re_forward"  # inside BACKWARD: activation checkpointing's recomputation


@dataclasses.dataclass(frozen=True)
class UnitConfig:
    """How one unit behaves. ``reshard_after_forward=None``: every unit but the one whose
    forward started the iteration (FSDP2's default for the root)."""

    reshard_after_forward: bool | None
    precision: Precision
    prefetch: Prefetch


def get_state(module: nn.Module) -> FSDPState | None:
    """The unit whose hooks live on ``module``, if any."""
    return module.__dict__.get(STATE_ATTR)


# Every tree, and those whose last reduction is still in flight (see [Note: one iteration]):
# weak registries, so a tree lives only as long as its modules. An optimizer that holds shards
# waits for the lingering reductions before its step and afterwards marks what is gathered
# outside an iteration as stale (see [Note: unsharded storage]): see `hook_optimizer`.
_TREES: weakref.WeakSet[TreeContext] = weakref.WeakSet()
_LINGERING: weakref.WeakSet[TreeContext] = weakref.WeakSet()
_HOOKED_ATTR = "_shardkit_fsdp_step_hooks"


def finish_lingering() -> None:
    """Wait for every reduction left in flight after a backward that was not the last."""
    for ctx in list(_LINGERING):
        ctx.finish_pending_reduce()


def _before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    finish_lingering()


def _after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for ctx in list(_TREES):
        if ctx.state is TrainingState.IDLE:
            for unit in ctx.units:
                unit.group.mark_stale()


def hook_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Give ``optimizer``, which holds shards, its step hooks (once): before each step it waits
    for the reductions still in flight, after it the gathered parameters are stale. Optimizers
    over other parameters get none. Called by the stale-parameter check (``_stale.py``) on the
    first step, before the step itself: that step waits here."""
    if optimizer.__dict__.get(_HOOKED_ATTR):
        return
    optimizer.__dict__[_HOOKED_ATTR] = (
        optimizer.register_step_pre_hook(_before_step),
        optimizer.register_step_post_hook(_after_step),
    )
    finish_lingering()  # this step's pre-hooks may already be chosen


class TreeContext:
    """What the units of one tree share: execution order, pending reductions, settings."""

    def __init__(self, root: FSDPState) -> None:
        self.units: list[FSDPState] = [root]
        self.forward_order: list[FSDPState] = []
        self._recording: list[FSDPState] = []
        self.state = TrainingState.IDLE
        self.forward_root: FSDPState | None = None  # the unit whose forward started the last one
        self._re_forward_root: FSDPState | None = None
        self.is_last_backward = True
        self._pending_reduce: list[FSDPState] = []
        self.reduce_buffers = BufferPool()
        self.freed = FreedMemory()
        self.state_dict_form = StateDictForm()  # fully_shard's; FSDP1's wrapper sets FULL
        _TREES.add(self)

    # ---- order --------------------------------------------------------------------------------

    def enter_forward(self, unit: FSDPState) -> None:
        """``unit``'s forward starts. See [Note: training state]."""
        if self.state is TrainingState.BACKWARD and _graph_task_id() == -1:
            logger.warning("the previous backward did not finish (it raised); resetting units")
            self.reset()
        if self.state is TrainingState.IDLE:
            self.finish_pending_reduce()
            self.state = TrainingState.FORWARD
            self.forward_root = unit
            self._recording = []
        elif self.state is TrainingState.BACKWARD:
            self.state = TrainingState.RE_FORWARD
            self._re_forward_root = unit

    def exit_forward(self, unit: FSDPState) -> None:
        """``unit``'s forward ended: the forward (or re-forward) ends with the unit that began it."""
        if self.state is TrainingState.FORWARD and unit is self.forward_root:
            self.forward_order = self._recording
            self.state = TrainingState.IDLE
        elif self.state is TrainingState.RE_FORWARD and unit is self._re_forward_root:
            self._re_forward_root = None
            self.state = TrainingState.BACKWARD

    def record(self, unit: FSDPState) -> bool:
        """Note that ``unit`` runs now in a forward; False if it already ran in this forward (or
        this is a re-forward, which does not change the recorded order)."""
        if self.state is not TrainingState.FORWARD or unit in self._recording:
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
        return None if target is unit else target

    # ---- backward -----------------------------------------------------------------------------

    def begin_backward(self) -> None:
        if self.state in (TrainingState.BACKWARD, TrainingState.RE_FORWARD):
            return
        self.state = TrainingState.BACKWARD
        Variable._execution_engine.queue_callback(self.finish_backward)

    def add_pending_reduce(self, unit: FSDPState) -> None:
        """Keep at most one unit's reduction in flight: wait for the previous one first."""
        self.finish_pending_reduce()
        self._pending_reduce.append(unit)

    def finish_pending_reduce(self) -> None:
        while self._pending_reduce:
            group = self._pending_reduce.pop(0).group
            released = group.finish_reduce(self.reduce_buffers)
            if group.on_cpu:
                self.freed.add(released)  # See [Note: returning memory]
        _LINGERING.discard(self)
        if self.state is not TrainingState.BACKWARD:
            self.reduce_buffers.clear()  # hold reduction buffers only while reducing

    def finish_backward(self) -> None:
        """Runs once autograd is done. See [Note: one iteration]."""
        for unit in reversed(self.units):
            if not unit._post_backward_done:
                unit.post_backward(prefetch=False)
            else:
                unit.reduce_grads()  # gradients that arrived after the unit's post-backward
        if self.is_last_backward:
            self.finish_pending_reduce()
        elif self._pending_reduce:
            _linger(self)
        for unit in self.units:
            if unit.reshard_after_backward:
                unit.group.reshard()
            unit.reset_iteration()
        self.state = TrainingState.IDLE
        if not self._pending_reduce:
            self.reduce_buffers.clear()
        UNSHARDED_POOL.clear()  # See [Note: unsharded memory pool]

    def reset(self) -> None:
        """Forget a forward or backward that raised: free everything, drop its reductions."""
        for unit in self.units:
            unit.group.reshard()
            unit.reset_iteration()
        self._pending_reduce.clear()
        _LINGERING.discard(self)
        self.reduce_buffers.clear()
        self._re_forward_root = None
        self.state = TrainingState.IDLE


def _linger(ctx: TreeContext) -> None:
    _LINGERING.add(ctx)


def _graph_task_id() -> int:
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current() if current is not None else -1


class FSDPState:
    """One unit: its parameters and the hooks on the module whose forward uses them.

    See [Note: one iteration]. ``name`` is the module's path for messages and logs. The
    attributes after ``config`` are FSDP2's run-time controls (``FSDPModule.set_*``).
    """

    def __init__(
        self, module: nn.Module, group: ParamGroup, config: UnitConfig, *, name: str
    ) -> None:
        self.module = module
        self.group = group
        self.config = config
        self.reduce_grads_enabled = True
        self.reshard_after_backward = True
        self.forward_prefetch: list[FSDPState] | None = None
        self.backward_prefetch: list[FSDPState] | None = None
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
        ctx.enter_forward(self)
        precision = self.config.precision
        if precision.param_dtype is not None and (
            precision.cast_forward_inputs
            or (precision.cast_root_forward_inputs and ctx.forward_root is self)
        ):
            args, kwargs = cast_floats((args, kwargs), precision.param_dtype)
        first = ctx.record(self)
        if any(p.local.is_meta for p in self.group.params):
            raise ValueError(
                f"unit {self.name!r} still has parameters on the meta device; initialise them "
                "first: model.materialize() after fully_shard, or param_init_fn= when wrapping "
                "with FullyShardedDataParallel"
            )
        self._num_expected = self.group.num_grad_params
        self.group.start_unshard()
        if first:  # a re-forward prefetches nothing: backward prefetch is under way
            for unit in self._forward_targets():
                unit.group.start_unshard()
        self.group.unshard()
        return args, kwargs

    def _forward_targets(self) -> list[FSDPState]:
        if self.forward_prefetch is not None:
            return self.forward_prefetch
        upcoming = self.context.next_in_forward(self) if self.config.prefetch.forward else None
        return [upcoming] if upcoming is not None else []

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> Any:
        ctx = self.context
        grad_enabled = torch.is_grad_enabled()
        if self.config.precision.output_dtype is not None:
            output = cast_floats(output, self.config.precision.output_dtype)
        if ctx.state is TrainingState.FORWARD:  # a re-forward keeps its parameters for backward
            if grad_enabled:
                for tensor in tensors_in(output):
                    if tensor.requires_grad:
                        tensor.register_hook(self._pre_backward_hook)
            if not grad_enabled or self._reshards_after_forward():
                self.group.reshard(keep_memory=True)  # See [Note: unsharded memory pool]
        ctx.exit_forward(self)
        return output

    def _reshards_after_forward(self) -> bool:
        flag = self.config.reshard_after_forward
        return self.context.forward_root is not self if flag is None else flag

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
        if self.backward_prefetch is not None:
            targets = self.backward_prefetch
        else:
            upcoming = self.context.next_in_backward(self)
            targets = [upcoming] if upcoming is not None else []
        for unit in targets:
            if not unit._post_backward_done:
                unit.group.start_unshard()

    def _on_grad_ready(self, _param: Any) -> None:
        self.context.begin_backward()
        self._num_ready += 1
        if self._num_ready >= self._num_expected:
            self.post_backward(prefetch=True)

    def post_backward(self, *, prefetch: bool) -> None:
        """Reduce this unit's gradients (unless gradient sync is off) and free its gathered
        parameters (unless it keeps them after backward)."""
        if self._post_backward_done:
            return
        self._post_backward_done = True
        if prefetch and self.config.prefetch.backward is BackwardPrefetch.BACKWARD_POST:
            self._prefetch_backward()
        freed = self.group.new_grad_bytes() if self.reduce_grads_enabled else 0
        self.reduce_grads()
        if self.reshard_after_backward:
            self.group.reshard()
        if self.group.on_cpu:
            self.context.freed.add(freed)  # See [Note: returning memory]

    def reduce_grads(self) -> None:
        ctx = self.context
        if not self.reduce_grads_enabled:
            self.group.stash_grads()
        elif self.group.has_grads():
            ctx.add_pending_reduce(self)
            self.group.start_reduce(ctx.reduce_buffers)

    def reset_iteration(self) -> None:
        self._pre_backward_done = False
        self._post_backward_done = False
        self._num_ready = 0
