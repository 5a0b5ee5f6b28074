"""``fully_shard``: shard a module in place, with FSDP2's arguments and semantics.

Call it on the layers first, then on the whole model::

    for block in model.blocks:
        fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    fully_shard(model)                       # the outermost unit: its forward starts iterations
    optimizer = torch.optim.AdamW(model.parameters())   # over DTensor shards

[Note: class swap]
``fully_shard`` keeps the module object (the caller's references stay valid) and gives it
`FSDPModule`'s methods by changing its class in place to ``FSDP<Class>(FSDPModule, Class)``, a
class made once per original class and cached. Its method resolution order is
``[FSDP<Class>, FSDPModule, Class, ...]``, so ``cls.__mro__[2]`` is the original class: FSDPModule
must stay a plain mixin with no base class of its own, or that index moves. Containers build new
instances of their own class (``Sequential[1:]`` calls ``type(self)(...)``); those are plain
modules, not units, so ``FSDPModule.__new__`` constructs ``cls.__mro__[2]`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from shardkit.fsdp._config import Precision, Prefetch
from shardkit.fsdp._fsdp_module import FSDPModule
from shardkit.fsdp._init import UnitSettings, build_unit, is_managed
from shardkit.fsdp._mesh_info import compute_device, default_mesh, mesh_info_of
from shardkit.fsdp._module import check_type, require_process_group
from shardkit.fsdp._policies import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from shardkit.fsdp._state_dict import install_state_dict_hooks

__all__ = ["fully_shard"]

_NO_MIXED_PRECISION = MixedPrecisionPolicy()
_NO_OFFLOAD = OffloadPolicy()


def fully_shard(
    module: nn.Module,
    *,
    mesh: Any = None,
    reshard_after_forward: bool | None = None,
    shard_placement_fn: Callable[[nn.Parameter], Any] | None = None,
    mp_policy: MixedPrecisionPolicy = _NO_MIXED_PRECISION,
    offload_policy: OffloadPolicy = _NO_OFFLOAD,
    ignored_params: Iterable[nn.Parameter] | None = None,
    dp_mesh_dims: Any = None,
) -> nn.Module:
    """Shard ``module``'s parameters (minus those of units already inside it) over the mesh.

    Args:
        module: sharded in place (it becomes an `FSDPModule`) and returned.
        mesh: a 1-D DeviceMesh to shard over (default: every rank), or a 2-D (replicate, shard)
            mesh: hybrid sharding, placements ``(Replicate(), Shard(0))``.
        reshard_after_forward: True frees the gathered parameters after forward and gathers
            them again in backward; False keeps them; None (default): True except for the unit
            whose forward starts the iteration. An int (resharding to a smaller group) is refused.
        shard_placement_fn: may return None or ``Shard(0)`` for each parameter; other placements
            are refused.
        mp_policy: see `MixedPrecisionPolicy`.
        offload_policy: `OffloadPolicy` (none) or `CPUOffloadPolicy`.
        ignored_params: parameters left alone (not sharded, not reduced).
        dp_mesh_dims: refused (DTensor parameters from tensor parallelism are not sharded).

    Afterwards the module's parameters are DTensors holding this rank's rows
    (see [Note: DTensor parameters]). A module on the meta device is sharded on the meta
    device: ``model.to_empty(device=...)`` and an init, or `FSDPModule.materialize`.
    """
    require_process_group("fully_shard")
    _check_arguments(module, reshard_after_forward, dp_mesh_dims)
    check_type("mp_policy", mp_policy, MixedPrecisionPolicy, "MixedPrecisionPolicy(torch.bfloat16)")
    check_type("offload_policy", offload_policy, OffloadPolicy, "CPUOffloadPolicy()")
    _check_placements(module, shard_placement_fn)
    mesh_info = mesh_info_of(mesh if mesh is not None else default_mesh(compute_device().type))
    settings = UnitSettings(
        mesh_info=mesh_info,
        # logs and the cross-rank check name the layout in FSDP2's words (the log adds the
        # mesh: "over N rank(s) x M replica(s)")
        layout=f"fully_shard(reshard_after_forward={reshard_after_forward})",
        precision=Precision.of(mp_policy),
        prefetch=Prefetch(),
        reshard_after_forward=reshard_after_forward,
        offload=isinstance(offload_policy, CPUOffloadPolicy),
        pin_memory=isinstance(offload_policy, CPUOffloadPolicy) and offload_policy.pin_memory,
        dtensor=True,
        ignored_params=frozenset(ignored_params or ()),
    )
    state = build_unit(module, module, settings, name=type(module).__name__)
    # the tree's state dicts keep their default form: DTensor shards (see StateDictForm)
    install_state_dict_hooks(module, state, inner_prefix="")
    _swap_class(module)
    return module


def _check_arguments(module: Any, reshard_after_forward: Any, dp_mesh_dims: Any) -> None:
    if isinstance(module, (list, tuple)):
        raise ValueError(
            f"fully_shard got a list of {len(module)} modules; shardkit shards one module per "
            "call: give the modules a common parent and shard that, or shard each one"
        )
    if not isinstance(module, nn.Module):
        raise TypeError(f"fully_shard shards an nn.Module, got {type(module).__name__}")
    if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
        raise ValueError(
            f"reshard_after_forward={reshard_after_forward!r}: shardkit takes True, False or "
            "None; resharding to a smaller group after forward (an int) is not offered"
        )
    if dp_mesh_dims is not None:
        raise ValueError(
            f"dp_mesh_dims={dp_mesh_dims!r}: shardkit's fully_shard shards plain parameters on "
            "a data-parallel mesh; pass that mesh (1-D, or 2-D replicate x shard) as mesh="
        )


def _check_placements(module: nn.Module, placement_fn: Callable | None) -> None:
    if placement_fn is None:
        return
    from torch.distributed.tensor import Shard  # See [Note: DTensor on demand]

    for name, param in module.named_parameters():
        if is_managed(param):
            continue
        placement = placement_fn(param)
        if placement is None:
            continue
        dim = getattr(placement, "dim", None)
        if not isinstance(placement, Shard) or dim not in (0, -param.dim() or 0):
            raise ValueError(
                f"shard_placement_fn gave {placement!r} for parameter {name!r}; shardkit shards "
                "every parameter along dim 0: return None or Shard(0)"
            )


_CLASSES: dict[type, type] = {}


def _swap_class(module: nn.Module) -> None:
    """Make ``module`` an instance of ``FSDP<Class>(FSDPModule, Class)``. See
    [Note: class swap]."""
    cls = type(module)
    if issubclass(cls, FSDPModule):
        return
    if cls not in _CLASSES:
        swapped = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
        assert swapped.__mro__[FSDPModule._orig_cls_mro_index] is cls
        _CLASSES[cls] = swapped
    module.__class__ = _CLASSES[cls]
