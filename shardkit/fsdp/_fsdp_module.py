"""`FSDPModule`: what a module sharded by ``fully_shard`` can do, with FSDP2's names and semantics.

Every method acts on the module's own unit, or with ``recurse`` on every unit under it. The FSDP1
wrapper has FSDP1's methods instead (``no_sync``, ``clip_grad_norm_``, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import torch
from torch import nn

from shardkit.fsdp._materialize import materialize
from shardkit.fsdp._module import apply_keeping_shards, unit_of
from shardkit.fsdp._param_group import ParamGroup
from shardkit.fsdp._state import FSDPState, get_state

__all__ = ["FSDPModule", "UnshardHandle", "register_fsdp_forward_method", "share_comm_ctx"]


class UnshardHandle:
    """What ``FSDPModule.unshard(async_op=True)`` returns: `wait` finishes the gather and puts the
    gathered parameters into the modules (the unit's next forward also waits for it)."""

    def __init__(self, group: ParamGroup | None = None) -> None:
        self._group = group

    def wait(self) -> None:
        if self._group is not None:
            self._group.unshard()
            self._group = None


class FSDPModule:
    """Mixed into the class of every module ``fully_shard`` was applied to (see
    [Note: class swap]): ``FSDP<Class>(FSDPModule, Class)``.

    Example (gradient accumulation over 4 micro-batches, one reduction)::

        for i, batch in enumerate(micro_batches):
            model.set_requires_gradient_sync(i == 3)
            loss_fn(model(batch)).backward()
        optimizer.step()
    """

    _orig_cls_mro_index = 2  # See [Note: class swap]

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is FSDPModule:
            raise TypeError("FSDPModule is not built directly: call fully_shard(module)")
        original = cls.__mro__[cls._orig_cls_mro_index]  # See [Note: class swap]
        assert issubclass(original, nn.Module)  # fully_shard swaps the class of a module
        instance = original.__new__(original)
        original.__init__(instance, *args, **kwargs)
        return instance

    def __deepcopy__(self, memo: Any) -> NoReturn:
        raise TypeError(
            f"{type(self).__name__} is fully sharded and cannot be deep-copied (its parameters "
            "are shards tied to collectives); copy the model before fully_shard, or save and "
            "load its state_dict"
        )

    def _units(self, recurse: bool) -> list[FSDPState]:
        module = self
        assert isinstance(module, nn.Module)  # See [Note: class swap]
        modules = module.modules() if recurse else [module]
        return [state for m in modules if isinstance(m, FSDPModule) and (state := get_state(m))]

    def reshard(self) -> None:
        """Free this unit's gathered parameters; its modules hold the shards again (not
        recursive)."""
        unit = unit_of(self)  # type: ignore[arg-type]
        unit.context.finish_pending_reduce()
        unit.group.reshard()

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        """Gather this unit's parameters (in ``param_dtype``) into its modules (not recursive).
        With ``async_op`` the gather is started and an `UnshardHandle` returned; the unit's next
        forward waits for it if `UnshardHandle.wait` was not called."""
        unit = unit_of(self)  # type: ignore[arg-type]
        unit.context.finish_pending_reduce()
        unit.group.start_unshard()
        handle = UnshardHandle(unit.group)
        if async_op:
            return handle
        handle.wait()
        return None

    def reset_iter_state(self) -> None:
        """After a forward or backward raised: free what it gathered and drop its reductions
        (its gradients are lost), so the next iteration starts clean."""
        unit_of(self).context.reset()  # type: ignore[arg-type]

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """False: the next backward leaves its last reduction in flight (micro-batching); the
        next forward, backward or optimizer step waits for it. True (default): backward ends
        with every gradient reduced."""
        unit_of(self).context.is_last_backward = bool(is_last_backward)  # type: ignore[arg-type]

    def set_requires_gradient_sync(
        self, requires_gradient_sync: bool, *, recurse: bool = True
    ) -> None:
        """False: backward keeps full local gradients on the gathered parameters (summed in the
        reduce dtype, no communication) until a backward with True reduces the sum."""
        for unit in self._units(recurse):
            unit.reduce_grads_enabled = bool(requires_gradient_sync)

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        """Whether units free their gathered parameters after forward (gathering them again for
        backward); e.g. False for evaluation, True again for training."""
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward must be a bool, got {reshard_after_forward!r}")
        for unit in self._units(recurse):
            unit.config = dataclasses.replace(
                unit.config, reshard_after_forward=reshard_after_forward
            )

    def set_reshard_after_backward(
        self, reshard_after_backward: bool, *, recurse: bool = True
    ) -> None:
        """False: units keep their gathered parameters after backward, so the next forward does
        not gather them again (gradient accumulation); an optimizer step in between makes the
        next use gather again."""
        for unit in self._units(recurse):
            unit.reshard_after_backward = bool(reshard_after_backward)

    def set_modules_to_forward_prefetch(self, modules: list[FSDPModule]) -> None:
        """The units whose gathers this unit starts when its forward starts, replacing the
        default (the next unit of the previous iteration)."""
        unit_of(self).forward_prefetch = _units_of(modules)  # type: ignore[arg-type]

    def set_modules_to_backward_prefetch(self, modules: list[FSDPModule]) -> None:
        """The units whose gathers this unit starts when its backward starts, replacing the
        default (the unit before it in forward order)."""
        unit_of(self).backward_prefetch = _units_of(modules)  # type: ignore[arg-type]

    def materialize(
        self,
        *,
        init_fn: Callable[[nn.Module], None] | None = None,
        sync_module_states: bool = False,
    ) -> None:
        """shardkit's meta-device init: give meta shards and buffers real values, one module at
        a time, each initialised in full by ``init_fn(module)`` (default
        ``module.reset_parameters()``), keeping this rank's rows: the values the unsharded model
        gets from the same seed. See [Note: materialising]."""
        materialize(self, init_fn=init_fn, sync_module_states=sync_module_states)  # type: ignore[arg-type]

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        parent = super()._apply  # type: ignore[misc]
        return apply_keeping_shards(self, fn, lambda: parent(fn, recurse))  # type: ignore[arg-type]


def _not_offered(name: str, why: str) -> Callable[..., NoReturn]:
    def method(self: FSDPModule, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"FSDPModule.{name} is not offered by shardkit: {why}")

    method.__name__ = name
    method.__doc__ = f"Not offered by shardkit: {why}"
    return method


_COMM = "units gather and reduce with shardkit.comm's checked collectives; use the defaults"
_STREAMS = "shardkit's FSDP uses no CUDA streams of its own; leave it out"
for _name, _why in {
    "set_custom_all_gather": _COMM,
    "set_custom_reduce_scatter": _COMM,
    "set_all_reduce_hook": _COMM,
    "set_requires_all_reduce": "HSDP always all-reduces with the reduce-scatter; use "
    "set_requires_gradient_sync(False) to accumulate without communication",
    "set_gradient_divide_factor": "gradients are always averaged over the ranks; scale the loss",
    "set_reduce_scatter_divide_factor": "gradients are always averaged; scale the loss",
    "set_force_sum_reduction_for_comms": _COMM,
    "set_reduce_scatter_unused_params": "every rank must use the same parameters in an iteration",
    "set_reduce_scatter_max_input_buffers": "one reduction is in flight at a time; leave it out",
    "set_separate_reduce_scatter_group": _COMM,
    "set_unshard_in_backward": "every unit gathers its parameters for backward",
    "set_post_optim_event": _STREAMS,
    "set_allocate_memory_from_process_group_for_comm": _STREAMS,
    "set_symm_mem_for_comm": _STREAMS,
}.items():
    setattr(FSDPModule, _name, _not_offered(_name, _why))


def _units_of(modules: Iterable[Any]) -> list[FSDPState]:
    out = []
    for module in modules:
        unit = isinstance(module, nn.Module) and isinstance(module, FSDPModule)
        state = get_state(module) if unit else None
        if state is None:
            raise ValueError(
                f"expected modules that fully_shard was applied to, got {type(module).__name__}; "
                "pass FSDPModules (e.g. the blocks after fully_shard(block))"
            )
        out.append(state)
    return out


def register_fsdp_forward_method(module: nn.Module, method_name: str) -> None:
    """Make ``module.<method_name>`` (e.g. ``generate``) gather and free the unit's parameters
    as ``forward`` does. No-op for a module that is not an `FSDPModule`."""
    if not isinstance(module, FSDPModule):
        return
    if not hasattr(module, method_name):
        raise ValueError(f"{type(module).__name__} has no method {method_name!r} to register")
    original = getattr(module, method_name)

    @functools.wraps(original)
    def wrapped(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        state = unit_of(self)
        args, kwargs = state._pre_forward(self, args, kwargs)
        return state._post_forward(self, args, original(*args, **kwargs))

    setattr(module, method_name, types.MethodType(wrapped, module))


def share_comm_ctx(modules: list[FSDPModule]) -> None:
    """FSDP2 shares CUDA streams between roots (pipeline stages); shardkit's units use none of
    their own, so there is nothing to share: this checks ``modules`` and returns."""
    _units_of(modules)
