"""``FullyShardedDataParallel``: the wrapper API of torch's FSDP1 (seed 004), on shardkit's units.

Example (seed 004, on CPUs with gloo)::

    from shardkit.fsdp import FullyShardedDataParallel as FSDP
    from shardkit.fsdp.fully_sharded_data_parallel import CPUOffload, BackwardPrefetch
    from shardkit.fsdp.wrap import size_based_auto_wrap_policy

    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=20000)
    model = FSDP(Net(), auto_wrap_policy=policy, cpu_offload=CPUOffload(offload_params=True))
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)

The wrapper holds the module as ``_fsdp_wrapped_module``; state dict keys are those of the
unwrapped module. ``use_orig_params`` and ``limit_all_gathers`` are accepted for compatibility:
shardkit always keeps the original parameters (as shards of their rows, plain tensors as in
FSDP1, not DTensors) and always bounds the number of gathered units.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from shardkit.fsdp._clip import clip_grad_norm_
from shardkit.fsdp._config import Precision, Prefetch, SaveForm, StateDictForm
from shardkit.fsdp._init import UnitSettings, build_unit
from shardkit.fsdp._materialize import has_meta, materialize
from shardkit.fsdp._mesh_info import compute_device, make_mesh_info
from shardkit.fsdp._module import (
    apply_keeping_shards,
    check_type,
    require_process_group,
    unit_of,
)
from shardkit.fsdp._optim_state_dict import (
    OptimStateKeyType,
    optim_state_dict,
    optim_state_dict_to_load,
    rekey_optim_state_dict,
)
from shardkit.fsdp._refused import refuse
from shardkit.fsdp._state_dict import (
    get_state_dict_type,
    install_state_dict_hooks,
    set_state_dict_type,
    state_dict_type,
)
from shardkit.fsdp._summon import summon_full_params
from shardkit.fsdp.api import (  # noqa: F401 (torch's module offers these names here too)
    BackwardPrefetch,
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    MixedPrecision,
    OptimStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from shardkit.fsdp.wrap import CustomPolicy, ModuleWrapPolicy, recursive_wrap  # noqa: F401

__all__ = ["FullyShardedDataParallel", "OptimStateKeyType"]

logger = logging.getLogger(__name__)

WRAPPED = "_fsdp_wrapped_module"


class FullyShardedDataParallel(nn.Module):
    """Shard ``module``'s parameters over the ranks; gather them for each forward and backward.

    Args (all but ``module`` keyword-only; names and defaults of torch's FSDP1):
        module: the module to shard.
        process_group: ranks to shard over (default: all); for HYBRID_SHARD a pair
            ``(intra_host_group, inter_host_group)``.
        sharding_strategy: see `ShardingStrategy` (default FULL_SHARD).
        cpu_offload: see `CPUOffload`.
        auto_wrap_policy: makes units of submodules (see `shardkit.fsdp.wrap`);
            ``fsdp_auto_wrap_policy`` is its older name.
        backward_prefetch: see `BackwardPrefetch`; None turns backward prefetch off.
        mixed_precision: see `MixedPrecision`.
        ignored_modules / ignored_states: modules or parameters left alone.
        param_init_fn: initialises a module built on the meta device, one module at a time
            (default: ``reset_parameters()``). See [Note: materialising].
        device_id: the compute device (default: the rank's device).
        sync_module_states: start from rank 0's parameters and buffers.
        forward_prefetch: gather the next unit while this one computes its forward.
        device_mesh: a DeviceMesh instead of ``process_group`` (2-D for HYBRID_SHARD).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        process_group: Any = None,
        sharding_strategy: ShardingStrategy | None = None,
        cpu_offload: CPUOffload | None = None,
        auto_wrap_policy: Callable[..., bool] | None = None,
        backward_prefetch: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE,
        mixed_precision: MixedPrecision | None = None,
        ignored_modules: Iterable[nn.Module] | None = None,
        param_init_fn: Callable[[nn.Module], None] | None = None,
        device_id: int | torch.device | None = None,
        sync_module_states: bool = False,
        forward_prefetch: bool = False,
        limit_all_gathers: bool = True,
        use_orig_params: bool = False,
        ignored_states: Iterable[nn.Parameter | nn.Module] | None = None,
        device_mesh: Any = None,
        fsdp_auto_wrap_policy: Callable[..., bool] | None = None,
    ) -> None:
        require_process_group("FullyShardedDataParallel")
        if not isinstance(module, nn.Module):
            raise TypeError(f"FullyShardedDataParallel wraps an nn.Module, got {type(module)}")
        policy = _one_policy(auto_wrap_policy, fsdp_auto_wrap_policy)
        strategy = ShardingStrategy.FULL_SHARD if sharding_strategy is None else sharding_strategy
        mp = MixedPrecision() if mixed_precision is None else mixed_precision
        offload = CPUOffload() if cpu_offload is None else cpu_offload
        check_type("mixed_precision", mp, MixedPrecision, "MixedPrecision(torch.bfloat16)")
        check_type("cpu_offload", offload, CPUOffload, "CPUOffload(offload_params=True)")
        prefetch = Prefetch(forward=forward_prefetch, backward=backward_prefetch)
        mesh_info = make_mesh_info(
            strategy,
            process_group=process_group,
            device_mesh=device_mesh,
            device=compute_device(device_id),
        )
        ignored_mods, ignored_params = _ignored(ignored_modules, ignored_states)
        resharding = (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)
        settings = UnitSettings(
            mesh_info=mesh_info,
            layout=strategy.name,
            precision=Precision.of(mp),
            prefetch=prefetch,
            reshard_after_forward=None if strategy in resharding else False,
            offload=offload.offload_params,
            ignored_params=ignored_params,
            ignored_modules=ignored_mods,
            sync_module_states=sync_module_states,
        )
        super().__init__()
        self._setup(module, settings, policy=policy, param_init_fn=param_init_fn, child=False)

    @classmethod
    def _child(
        cls, module: nn.Module, settings: UnitSettings, name: str, init: Callable | None
    ) -> FullyShardedDataParallel:
        """A unit made by auto-wrap: same settings, materialised later by the outermost one."""
        wrapper = cls.__new__(cls)
        nn.Module.__init__(wrapper)
        wrapper._setup(module, settings, policy=None, param_init_fn=init, child=True, name=name)
        return wrapper

    def _setup(
        self,
        module: nn.Module,
        settings: UnitSettings,
        *,
        policy: Callable[..., bool] | None,
        param_init_fn: Callable[[nn.Module], None] | None,
        child: bool,
        name: str = "",
    ) -> None:
        self._fsdp_wrapped_module = module
        if policy is not None:
            _auto_wrap(module, policy, settings, param_init_fn)
        state = build_unit(self, module, settings, name=name)
        state.context.state_dict_form = StateDictForm(form=SaveForm.FULL)  # FSDP1's default
        # keys are the unwrapped module's: added back before the unit reads them on load,
        # stripped after the unit wrote them on save
        self.register_load_state_dict_pre_hook(_add_prefix)
        install_state_dict_hooks(self, state, inner_prefix=f"{WRAPPED}.")
        self.register_state_dict_post_hook(_strip_prefix)
        if not child and has_meta(self):
            materialize(self, init_fn=param_init_fn, sync_module_states=settings.sync_module_states)

    @property
    def module(self) -> nn.Module:
        """The wrapped module."""
        return self._fsdp_wrapped_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._fsdp_wrapped_module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == WRAPPED:
                raise
            return getattr(self._fsdp_wrapped_module, name)

    def __getitem__(self, key: Any) -> Any:
        return self._fsdp_wrapped_module.__getitem__(key)  # type: ignore[operator]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward inside the block keeps full local gradients (no
        communication); the first backward after it reduces their sum. For every unit of the
        tree."""
        units = unit_of(self).context.units
        previous = [unit.reduce_grads_enabled for unit in units]
        for unit in units:
            unit.reduce_grads_enabled = False
        try:
            yield
        finally:
            for unit, enabled in zip(units, previous):
                unit.reduce_grads_enabled = enabled

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip gradients by the unsharded model's total norm; returns that norm (call it on the
        outermost wrapper, on every rank: torch's ``clip_grad_norm_`` sees only this rank's
        plain shards, as with torch's FSDP1)."""
        return clip_grad_norm_(self, max_norm, norm_type)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        return apply_keeping_shards(
            self, fn, lambda: super(FullyShardedDataParallel, self)._apply(fn, recurse)
        )

    @staticmethod
    def fsdp_modules(module: nn.Module, root_only: bool = False) -> list[FullyShardedDataParallel]:
        """The wrappers in ``module`` (only the outermost ones with ``root_only``)."""
        found = [m for m in module.modules() if isinstance(m, FullyShardedDataParallel)]
        if root_only:
            found = [m for m in found if unit_of(m).is_root]
        return found

    # FSDP1's static methods, usable on any module with fully sharded units.
    state_dict_type = staticmethod(state_dict_type)
    set_state_dict_type = staticmethod(set_state_dict_type)
    get_state_dict_type = staticmethod(get_state_dict_type)
    summon_full_params = staticmethod(summon_full_params)
    optim_state_dict = staticmethod(optim_state_dict)
    optim_state_dict_to_load = staticmethod(optim_state_dict_to_load)
    rekey_optim_state_dict = staticmethod(rekey_optim_state_dict)


def __getattr__(name: str) -> Any:
    raise refuse(__name__, name)


def _one_policy(
    auto_wrap_policy: Callable[..., bool] | None, fsdp_auto_wrap_policy: Callable[..., bool] | None
) -> Callable[..., bool] | None:
    if auto_wrap_policy is not None and fsdp_auto_wrap_policy is not None:
        raise ValueError(
            "both auto_wrap_policy and fsdp_auto_wrap_policy were given; they are the new and "
            "the old name of the same argument: pass only auto_wrap_policy"
        )
    return auto_wrap_policy if auto_wrap_policy is not None else fsdp_auto_wrap_policy


def _ignored(
    modules: Iterable[nn.Module] | None, states: Iterable[nn.Parameter | nn.Module] | None
) -> tuple[frozenset[nn.Module], frozenset[nn.Parameter]]:
    ignored_modules = set(modules or ())
    ignored_params: set[nn.Parameter] = set()
    for state in states or ():
        if isinstance(state, nn.Module):
            ignored_modules.add(state)
        elif isinstance(state, nn.Parameter):
            ignored_params.add(state)
        else:
            raise TypeError(
                f"ignored_states takes parameters or modules, got {type(state).__name__}"
            )
    for ignored in list(ignored_modules):
        ignored_params.update(ignored.parameters())
    return frozenset(ignored_modules), frozenset(ignored_params)


def _auto_wrap(
    module: nn.Module,
    policy: Callable[..., bool],
    settings: UnitSettings,
    init: Callable[[nn.Module], None] | None,
) -> None:
    units: list[str] = []

    def wrap_fn(child: nn.Module, path: str) -> nn.Module:
        units.append(path)
        overrides = policy.overrides(child) if isinstance(policy, CustomPolicy) else None
        own = _overridden(settings, overrides or {})
        return FullyShardedDataParallel._child(child, own, path, init)

    recursive_wrap(
        module,
        policy,
        wrap_fn,
        ignored_modules=settings.ignored_modules,
        ignored_params=settings.ignored_params,
        only_wrap_children=True,
    )
    logger.info(
        "auto-wrap with %s: %d unit(s) inside %s: %s",
        getattr(getattr(policy, "func", policy), "__name__", repr(policy)),
        len(units),
        type(module).__name__,
        ", ".join(units) or "none",
    )


_OVERRIDABLE = ("mixed_precision", "cpu_offload", "backward_prefetch", "forward_prefetch")


def _overridden(settings: UnitSettings, overrides: dict[str, Any]) -> UnitSettings:
    """``settings`` with a `CustomPolicy`'s per-unit arguments."""
    unknown = sorted(set(overrides) - set(_OVERRIDABLE))
    if unknown:
        raise ValueError(
            f"CustomPolicy overrides {unknown} for a unit; shardkit takes per-unit "
            f"{', '.join(_OVERRIDABLE)} (one process group and strategy for the whole tree)"
        )
    changes: dict[str, Any] = {}
    if "mixed_precision" in overrides:
        mp = overrides["mixed_precision"] or MixedPrecision()
        check_type("mixed_precision", mp, MixedPrecision, "MixedPrecision(torch.bfloat16)")
        changes["precision"] = Precision.of(mp)
    if "cpu_offload" in overrides:
        offload = overrides["cpu_offload"] or CPUOffload()
        check_type("cpu_offload", offload, CPUOffload, "CPUOffload(offload_params=True)")
        changes["offload"] = offload.offload_params
    if "backward_prefetch" in overrides or "forward_prefetch" in overrides:
        changes["prefetch"] = Prefetch(
            forward=overrides.get("forward_prefetch", settings.prefetch.forward),
            backward=overrides.get("backward_prefetch", settings.prefetch.backward),
        )
    return dataclasses.replace(settings, **changes)


def _strip_prefix(module: nn.Module, sd: dict[str, Any], prefix: str, _meta: Any) -> None:
    """``<prefix>_fsdp_wrapped_module.x`` -> ``<prefix>x``, keeping the order of entries."""
    inner = f"{prefix}{WRAPPED}."
    items = list(sd.items())
    sd.clear()
    for key, value in items:
        sd[prefix + key[len(inner) :] if key.startswith(inner) else key] = value
    metadata = getattr(sd, "_metadata", None) or {}  # None or empty: nothing to rename
    for key in list(metadata):
        if key == f"{prefix}{WRAPPED}":
            del metadata[key]
        elif key.startswith(inner):
            metadata[prefix + key[len(inner) :]] = metadata.pop(key)


def _add_prefix(module: nn.Module, sd: dict[str, Any], prefix: str, *_args: Any) -> None:
    inner = f"{prefix}{WRAPPED}."
    for key in [k for k in sd if k.startswith(prefix) and not k.startswith(inner)]:
        sd[inner + key[len(prefix) :]] = sd.pop(key)
