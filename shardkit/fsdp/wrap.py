"""Auto-wrap policies and manual wrapping, with the names and semantics of torch's FSDP.

A policy is called as ``policy(module=m, recurse=..., nonwrapped_numel=n)``: with
``recurse=True`` it says whether to look inside ``m`` for units, with ``recurse=False`` whether
``m`` itself becomes a unit, ``n`` being the parameters of ``m`` not yet in a unit. Wrapping
goes bottom-up, so a module becomes a unit with what its wrapped children left over.

Example (seed 004: only ``fc1``, 1.18 M parameters, reaches 20 000)::

    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=20000)
    model = FullyShardedDataParallel(Net(), auto_wrap_policy=policy)
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import nn

from shardkit.fsdp._init import is_managed

__all__ = [
    "CustomPolicy",
    "ModuleWrapPolicy",
    "always_wrap_policy",
    "enable_wrap",
    "lambda_auto_wrap_policy",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "wrap",
]

logger = logging.getLogger(__name__)

Policy = Callable[..., bool]


def always_wrap_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
    """Every module becomes a unit."""
    return True


def size_based_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    nonwrapped_numel: int,
    min_num_params: int = int(1e8),
    force_leaf_modules: set[type[nn.Module]] | None = None,
    exclude_wrap_modules: set[type[nn.Module]] | None = None,
) -> bool:
    """A module becomes a unit once it holds ``min_num_params`` parameters not yet in a unit.

    ``force_leaf_modules`` (default: MultiheadAttention) are not looked into;
    ``exclude_wrap_modules`` (default: ModuleList, ModuleDict) never become units themselves.
    """
    leaves = size_based_auto_wrap_policy.FORCE_LEAF_MODULES  # type: ignore[attr-defined]
    excluded = size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES  # type: ignore[attr-defined]
    leaves = leaves if force_leaf_modules is None else force_leaf_modules
    excluded = excluded if exclude_wrap_modules is None else exclude_wrap_modules
    is_large = nonwrapped_numel >= min_num_params
    if recurse:
        return is_large and not isinstance(module, tuple(leaves))
    return is_large and not isinstance(module, tuple(excluded))


size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}  # type: ignore[attr-defined]
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}  # type: ignore[attr-defined]


def lambda_auto_wrap_policy(
    module: nn.Module, recurse: bool, nonwrapped_numel: int, lambda_fn: Callable[[nn.Module], bool]
) -> bool:
    """A module becomes a unit when ``lambda_fn(module)`` is true."""
    return True if recurse else bool(lambda_fn(module))


def transformer_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    nonwrapped_numel: int,
    transformer_layer_cls: Iterable[type[nn.Module]],
) -> bool:
    """Every instance of ``transformer_layer_cls`` (e.g. ``{Block}``) becomes a unit."""
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


class ModuleWrapPolicy:
    """Every instance of the given module classes becomes a unit.

    Example::

        FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
    """

    def __init__(self, module_classes: Iterable[type[nn.Module]]) -> None:
        self._module_classes = tuple(module_classes)
        for cls in self._module_classes:
            if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
                raise TypeError(
                    f"ModuleWrapPolicy takes nn.Module subclasses, got {cls!r}; pass classes "
                    "such as {nn.TransformerEncoderLayer}"
                )

    def __call__(self, module: nn.Module, recurse: bool, *args: Any, **kwargs: Any) -> bool:
        return True if recurse else isinstance(module, self._module_classes)

    def __repr__(self) -> str:
        names = ", ".join(cls.__name__ for cls in self._module_classes)
        return f"ModuleWrapPolicy({{{names}}})"


class CustomPolicy:
    """``lambda_fn(module)`` says whether ``module`` becomes a unit: False (or ``{}``) no, True
    with the outermost wrapper's arguments, a dict with those arguments overridden for this unit
    (``mixed_precision``, ``cpu_offload``, ``backward_prefetch``, ``forward_prefetch``).

    Example::

        def lambda_fn(module):
            if module is model.head:
                return {"mixed_precision": MixedPrecision(param_dtype=torch.float32)}
            return isinstance(module, Block)

        FullyShardedDataParallel(model, auto_wrap_policy=CustomPolicy(lambda_fn))
    """

    def __init__(self, lambda_fn: Callable[[nn.Module], bool | dict[str, Any]]) -> None:
        self._lambda_fn = lambda_fn

    def overrides(self, module: nn.Module) -> dict[str, Any] | None:
        """None: not a unit; else the arguments this unit overrides."""
        result = self._lambda_fn(module)
        if not isinstance(result, (bool, dict)):
            raise ValueError(
                f"CustomPolicy's lambda_fn must return True, False or a dict of arguments, got "
                f"{result!r} for {type(module).__name__}"
            )
        return (result if isinstance(result, dict) else {}) if result else None

    def __call__(self, module: nn.Module, recurse: bool, *args: Any, **kwargs: Any) -> bool:
        return True if recurse else self.overrides(module) is not None


def recursive_wrap(
    module: nn.Module,
    policy: Policy,
    wrap_fn: Callable[[nn.Module, str], nn.Module],
    *,
    ignored_modules: frozenset[nn.Module],
    ignored_params: frozenset[nn.Parameter],
    only_wrap_children: bool = False,
    prefix: str = "",
) -> tuple[nn.Module, int]:
    """Replace, bottom-up, the submodules ``policy`` selects by ``wrap_fn(submodule, path)``.

    Returns the (possibly wrapped) module and the number of parameters now in units.
    """
    nonwrapped = sum(
        p.numel() for p in module.parameters() if p not in ignored_params and not is_managed(p)
    )
    if not policy(module=module, recurse=True, nonwrapped_numel=nonwrapped):
        return module, 0
    total = 0
    for name, child in module.named_children():
        if child in ignored_modules:
            continue
        wrapped, num_wrapped = recursive_wrap(
            child,
            policy,
            wrap_fn,
            ignored_modules=ignored_modules,
            ignored_params=ignored_params,
            prefix=f"{prefix}{name}.",
        )
        if wrapped is not child:
            setattr(module, name, wrapped)
        total += num_wrapped
    if not only_wrap_children and policy(
        module=module, recurse=False, nonwrapped_numel=nonwrapped - total
    ):
        return wrap_fn(module, prefix.rstrip(".")), nonwrapped
    return module, total


# What `enable_wrap` set for the block that runs now (a context variable: per thread and task)
_WRAP_CONTEXT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "shardkit_fsdp_wrap_context", default=None
)


@contextlib.contextmanager
def enable_wrap(*, wrapper_cls: type[nn.Module], **wrapper_kwargs: Any) -> Iterator[None]:
    """Inside the block, `wrap` wraps with ``wrapper_cls(module, **wrapper_kwargs)``.

    Example::

        with enable_wrap(wrapper_cls=FullyShardedDataParallel, sharding_strategy=...):
            layer = wrap(nn.Linear(8, 8))     # a unit
        model = FullyShardedDataParallel(nn.Sequential(layer, nn.ReLU()))
    """
    token = _WRAP_CONTEXT.set({"wrapper_cls": wrapper_cls, **wrapper_kwargs})
    try:
        yield
    finally:
        _WRAP_CONTEXT.reset(token)


def wrap(module: nn.Module, **wrap_overrides: Any) -> nn.Module:
    """Wrap ``module`` with the `enable_wrap` settings (``wrap_overrides`` win); outside
    `enable_wrap` return it unchanged."""
    context = _WRAP_CONTEXT.get()
    if context is None:
        return module
    kwargs = {**context, **wrap_overrides}
    wrapper_cls = kwargs.pop("wrapper_cls")
    return wrapper_cls(module, **kwargs)
