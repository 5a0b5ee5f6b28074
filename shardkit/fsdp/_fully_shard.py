"""``fully_shard``: shard a module in place (FSDP2's style), and what a sharded module can do.

Call it on the layers first, then on the whole model::

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)                       # the outermost unit: its forward starts iterations
    optimizer = torch.optim.Adam(model.parameters())

The module keeps its class (and gains `FSDPModule`'s methods); its parameters become this rank's
shards. ``model.state_dict()`` gives DTensor shards (SHARDED_STATE_DICT) by default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.fsdp._api import (
    CPUOffload,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    PrefetchPolicy,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)
from shardkit.fsdp._clip import clip_grad_norm_
from shardkit.fsdp._init import UnitSettings, build_unit
from shardkit.fsdp._materialize import materialize
from shardkit.fsdp._mesh_info import compute_device, make_mesh_info
from shardkit.fsdp._state import FSDPState, get_state
from shardkit.fsdp._state_dict import install_state_dict_hooks

__all__ = ["FSDPModule", "check_type", "fully_shard", "require_process_group"]


class FSDPModule:
    """The methods every fully sharded module has (`fully_shard`'s and FullyShardedDataParallel)."""

    @property
    def _fsdp_state(self) -> FSDPState:
        state = get_state(self)  # type: ignore[arg-type]
        assert state is not None, "FSDPModule without a unit"
        return state

    def unshard(self) -> None:
        """Gather this unit's parameters into its modules now; they stay until `reshard` (or,
        once a backward ran, its end)."""
        self._fsdp_state.group.unshard()

    def reshard(self) -> None:
        """Free this unit's gathered parameters (the modules hold the shards again)."""
        self._fsdp_state.group.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """False: backward keeps full local gradients (no communication) and adds to them until
        a backward with True, which reduces the sum. Applies to the whole tree."""
        self._fsdp_state.context.requires_grad_sync = bool(requires_gradient_sync)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward inside the block skips the reduction (see
        `set_requires_gradient_sync`); the first backward after it reduces everything."""
        ctx = self._fsdp_state.context
        previous = ctx.requires_grad_sync
        ctx.requires_grad_sync = False
        try:
            yield
        finally:
            ctx.requires_grad_sync = previous

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip gradients by the unsharded model's total norm; returns that norm."""
        return clip_grad_norm_(self, max_norm, norm_type)  # type: ignore[arg-type]

    def materialize(
        self,
        *,
        init_fn: Callable[[nn.Module], None] | None = None,
        sync_module_states: bool = False,
    ) -> None:
        """Give meta-device shards and buffers real values, one module at a time: each module is
        initialised in full by ``init_fn(module)`` (default ``module.reset_parameters()``) and
        keeps this rank's rows. See [Note: materialising]."""
        materialize(self, init_fn=init_fn, sync_module_states=sync_module_states)  # type: ignore[arg-type]


def require_process_group(what: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"{what} needs an initialized process group: start ranks with "
            "shardkit.launch.spawn(fn, world_size=N), call shardkit.launch.init_from_env() under "
            "torchrun, or torch.distributed.init_process_group()"
        )


def check_type(name: str, value: Any, expected: type, example: str) -> None:
    if not isinstance(value, expected):
        raise TypeError(
            f"{name} must be a shardkit.fsdp.{expected.__name__}, got {value!r}; use e.g. {example}"
        )


_FULL_PRECISION = MixedPrecision()
_NO_OFFLOAD = CPUOffload()
_PREFETCH = PrefetchPolicy()


def fully_shard(
    module: nn.Module,
    *,
    mesh: Any = None,
    strategy: ShardingStrategy | None = None,
    mp_policy: MixedPrecision | MixedPrecisionPolicy = _FULL_PRECISION,
    offload_policy: CPUOffload | OffloadPolicy = _NO_OFFLOAD,
    prefetch_policy: PrefetchPolicy = _PREFETCH,
    ignored_params: Iterable[nn.Parameter] | None = None,
    sync_module_states: bool = False,
    device: torch.device | None = None,
    reshard_after_forward: bool | None = None,
) -> nn.Module:
    """Shard ``module``'s parameters (minus those of units already inside it) over the ranks.

    Args:
        module: sharded in place; returned for convenience.
        mesh: a 1-D DeviceMesh to shard over (default: all ranks), or a 2-D (replicate, shard)
            mesh with ``strategy=HYBRID_SHARD``.
        strategy: see `ShardingStrategy`; default FULL_SHARD, or HYBRID_SHARD with a 2-D mesh.
        mp_policy: see `MixedPrecision`.
        offload_policy: see `CPUOffload`.
        prefetch_policy: see `PrefetchPolicy`.
        ignored_params: parameters left alone (not sharded, not reduced).
        sync_module_states: start from rank 0's parameters and buffers.
        device: the compute device (default: the rank's device from shardkit.launch).
        reshard_after_forward: FSDP2's way to say the strategy: True is FULL_SHARD (with a
            2-D mesh HYBRID_SHARD), False SHARD_GRAD_OP. FSDP2's ``MixedPrecisionPolicy``,
            ``OffloadPolicy`` and ``CPUOffloadPolicy`` are taken too.

    A module on the meta device is sharded on the meta device: call `FSDPModule.materialize`.
    """
    require_process_group("fully_shard")
    strategy = _strategy(strategy, reshard_after_forward, mesh)
    if isinstance(mp_policy, MixedPrecisionPolicy):
        mp_policy = mp_policy.to_mixed_precision()
    if isinstance(offload_policy, OffloadPolicy):
        offload_policy = offload_policy.to_cpu_offload()
    check_type("mp_policy", mp_policy, MixedPrecision, "MixedPrecision(param_dtype=torch.bfloat16)")
    check_type("offload_policy", offload_policy, CPUOffload, "CPUOffload(offload_params=True)")
    check_type("prefetch_policy", prefetch_policy, PrefetchPolicy, "PrefetchPolicy(forward=True)")
    mesh_info = make_mesh_info(strategy, device_mesh=mesh, device=compute_device(device))
    settings = UnitSettings(
        mesh_info=mesh_info,
        strategy=strategy,
        mp=mp_policy,
        offload=offload_policy,
        prefetch=prefetch_policy,
        ignored_params=frozenset(ignored_params or ()),
        sync_module_states=sync_module_states,
    )
    state = build_unit(module, module, settings, name=type(module).__name__)
    state.context.state_dict_type = StateDictType.SHARDED_STATE_DICT
    state.context.state_dict_config = ShardedStateDictConfig()
    state.context.optim_state_dict_config = ShardedStateDictConfig()
    install_state_dict_hooks(module, state, inner_prefix="")
    _swap_class(module)
    return module


def _strategy(
    strategy: ShardingStrategy | None, reshard_after_forward: bool | None, mesh: Any
) -> ShardingStrategy:
    """The strategy from ``strategy`` and FSDP2's ``reshard_after_forward`` and mesh shape."""
    if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
        raise ValueError(
            f"reshard_after_forward={reshard_after_forward!r}: shardkit takes True (FULL_SHARD) "
            "or False (SHARD_GRAD_OP); resharding to a smaller group after forward is not offered"
        )
    hybrid = getattr(mesh, "ndim", 1) == 2
    if strategy is None:
        if hybrid and reshard_after_forward is False:
            raise ValueError(
                "reshard_after_forward=False on a 2-D mesh (hybrid sharding that keeps the "
                "parameters gathered between forward and backward) is not offered; use "
                "reshard_after_forward=True, or a 1-D mesh with False"
            )
        if hybrid:
            return ShardingStrategy.HYBRID_SHARD
        return (
            ShardingStrategy.SHARD_GRAD_OP
            if reshard_after_forward is False
            else ShardingStrategy.FULL_SHARD
        )
    if reshard_after_forward is None:
        return strategy
    resharding = (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)
    if (strategy in resharding) != reshard_after_forward or strategy is ShardingStrategy.NO_SHARD:
        raise ValueError(
            f"reshard_after_forward={reshard_after_forward} and strategy={strategy.name} disagree "
            "(FULL_SHARD and HYBRID_SHARD reshard after forward, SHARD_GRAD_OP does not); give "
            "one of them"
        )
    return strategy


_CLASSES: dict[type, type] = {}


def _swap_class(module: nn.Module) -> None:
    """Make ``module`` an instance of ``FSDP<Class>(FSDPModule, Class)``, keeping its state."""
    cls = type(module)
    if issubclass(cls, FSDPModule):
        return
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {"__new__": _new_original})
    module.__class__ = _CLASSES[cls]


def _new_original(cls: type, *args: Any, **kwargs: Any) -> Any:
    """Containers build new instances of their own class (``Sequential[1:]``); those are plain
    modules, not units: construct the original class."""
    original = cls.__mro__[2]
    instance = original.__new__(original)
    instance.__init__(*args, **kwargs)
    return instance
