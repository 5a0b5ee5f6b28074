"""How TorchRec's pipelines describe a sharded module's arguments in terms of the batch
(`ArgInfo`: steps applied to the batch, `CallArgs`: a call's args and kwargs) and its fx
`Tracer` that keeps sharded modules as leaves. shardkit's pipelines find the KJTs of a batch
without tracing (see [Note: pipelined input dist]); these are for code that builds its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from shardkit.types import ShardedModule

__all__ = ["ArgInfo", "ArgInfoStepFactory", "CallArgs", "Tracer"]


@dataclass
class _Step:
    """One transformation of the input: ``process(arg)``."""

    apply: Callable[[Any], Any]
    description: str

    def process(self, arg: Any) -> Any:
        return self.apply(arg)

    def __repr__(self) -> str:
        return self.description


class ArgInfoStepFactory:
    """The steps an `ArgInfo` chains: attribute, item, constant, list or dict of `ArgInfo`s."""

    @classmethod
    def noop(cls) -> _Step:
        return _Step(lambda arg: arg, "noop")

    @classmethod
    def get_attr(cls, name: str) -> _Step:
        return _Step(lambda arg: getattr(arg, name), f"getattr({name!r})")

    @classmethod
    def get_item(cls, index: str | int) -> _Step:
        return _Step(lambda arg: arg[index], f"getitem({index!r})")

    @classmethod
    def postproc(cls, pipelined_postproc_module: Any) -> _Step:
        return _Step(lambda arg: pipelined_postproc_module(arg), "postproc")

    @classmethod
    def from_scalar(cls, value: object) -> _Step:
        return _Step(lambda arg: value, f"scalar({value!r})")

    @classmethod
    def from_list(cls, value: list[Any]) -> _Step:
        return _Step(lambda arg: [v.process_steps(arg) for v in value], "list")

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> _Step:
        return _Step(lambda arg: {k: v.process_steps(arg) for k, v in value.items()}, "dict")


@dataclass
class ArgInfo:
    """An argument as ``steps[-1](...steps[0](batch))``; None without steps."""

    steps: list[Any] = field(default_factory=list)

    def add_step(self, step: Any) -> ArgInfo:
        self.steps.insert(0, step)
        return self

    def append_step(self, step: Any) -> ArgInfo:
        self.steps.append(step)
        return self

    def process_steps(self, arg: Any) -> Any:
        if not self.steps:
            return None
        for step in self.steps:
            arg = step.process(arg)
        return arg


@dataclass
class CallArgs:
    """The positional and keyword arguments of a call, each an `ArgInfo` of the batch."""

    args: list[ArgInfo]
    kwargs: dict[str, ArgInfo]

    def build_args_kwargs(self, initial_input: Any) -> tuple[list[Any], dict[str, Any]]:
        args = [arg.process_steps(initial_input) for arg in self.args]
        kwargs = {key: arg.process_steps(initial_input) for key, arg in self.kwargs.items()}
        return args, kwargs


class Tracer(torch.fx.Tracer):
    """torch.fx's tracer with sharded modules, the modules named in ``leaf_modules`` (and,
    with ``extend_leaf_fqn``, their submodules) as leaves."""

    proxy_buffer_attributes = False

    def __init__(self, leaf_modules: list[str] | None = None, extend_leaf_fqn: bool = False):
        super().__init__()
        self._leaf_modules = list(leaf_modules or [])
        self._extend_leaf_fqn = extend_leaf_fqn

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, ShardedModule) or module_qualified_name in self._leaf_modules:
            return True
        if self._extend_leaf_fqn and any(
            module_qualified_name.startswith(f"{leaf}.") for leaf in self._leaf_modules
        ):
            return True
        return super().is_leaf_module(m, module_qualified_name)
