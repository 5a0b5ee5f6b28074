"""`KeyedOptimizerWrapper` (a torch optimizer made keyed) and `OptimizerWrapper` (the base of
optimizers that change how another keyed optimizer steps: warm-up, gradient clipping)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from shardkit.optim._keyed import KeyedOptimizer, init_optimizer_hooks

__all__ = ["KeyedOptimizerWrapper", "OptimizerWrapper"]

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


class KeyedOptimizerWrapper(KeyedOptimizer):
    """A torch optimizer over named parameters, checkpointed by name::

        dense = KeyedOptimizerWrapper(dict(model.named_parameters()),
                                      lambda params: torch.optim.Adam(params, lr=1e-3))

    Args:
        params: ``{name: parameter}``.
        optim_factory: builds the optimizer from the parameters (a list of them, or the dict
            itself with ``pass_params_dict=True``).
        pass_params_dict: hand ``optim_factory`` the dict instead of a list.
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        optim_factory: OptimizerFactory,
        pass_params_dict: bool = False,
    ) -> None:
        given = params if pass_params_dict else list(params.values())
        self._optimizer: torch.optim.Optimizer = optim_factory(given)
        super().__init__(params, self._optimizer.state, self._optimizer.param_groups)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        return self._optimizer.step(closure=closure)

    def set_optimizer_step(self, step: int) -> None:
        if hasattr(self._optimizer, "set_optimizer_step"):
            self._optimizer.set_optimizer_step(step)

    def update_hyper_parameters(self, params_dict: dict[str, Any]) -> None:
        if hasattr(self._optimizer, "update_hyper_parameters"):
            self._optimizer.update_hyper_parameters(params_dict)


class OptimizerWrapper(KeyedOptimizer):
    """A keyed optimizer that delegates to another one; subclasses change ``step``.

    ``params``, ``state`` and ``param_groups`` are the wrapped optimizer's (the same objects), so
    an LR scheduler on the wrapper changes the wrapped optimizer's rates.

    Args:
        optimizer: the keyed optimizer to wrap.
    """

    def __init__(self, optimizer: KeyedOptimizer) -> None:
        if not isinstance(optimizer, KeyedOptimizer):
            raise TypeError(
                f"{type(self).__name__} wraps a KeyedOptimizer, got {type(optimizer).__name__}; "
                "wrap a torch optimizer first: KeyedOptimizerWrapper(dict(model.named_parameters()"
                "), lambda params: torch.optim.SGD(params, lr=0.1))"
            )
        init_optimizer_hooks(self)
        self._optimizer = optimizer
        self.params = optimizer.params
        self.state = optimizer.state
        self.param_groups = optimizer.param_groups
        self.defaults: dict[str, Any] = {"_save_param_groups": False}

    def __repr__(self) -> str:
        return repr(self._optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        return self._optimizer.step(closure=closure)

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)
        self.state = self._optimizer.state
        self.param_groups = self._optimizer.param_groups
        self.post_load_state_dict()

    def post_load_state_dict(self) -> None:
        self._optimizer.post_load_state_dict()

    def save_param_groups(self, save: bool) -> None:
        self._optimizer.save_param_groups(save)

    def set_optimizer_step(self, step: int) -> None:
        if hasattr(self._optimizer, "set_optimizer_step"):
            self._optimizer.set_optimizer_step(step)

    def update_hyper_parameters(self, params_dict: dict[str, Any]) -> None:
        if hasattr(self._optimizer, "update_hyper_parameters"):
            self._optimizer.update_hyper_parameters(params_dict)
