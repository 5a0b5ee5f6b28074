"""`CombinedOptimizer`: several keyed optimizers seen as one (TorchRec's name and semantics)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from shardkit.optim._keyed import KeyedOptimizer, init_optimizer_hooks

__all__ = ["CombinedOptimizer"]


class CombinedOptimizer(KeyedOptimizer):
    """Steps, zeroes and checkpoints several optimizers as one, e.g. the fused optimizer of the
    sharded tables and the dense parameters' optimizer::

        dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                      lambda params: torch.optim.Adam(params, lr=1e-3))
        optimizer = CombinedOptimizer([model.fused_optimizer, dense])

    ``params`` and ``state_dict()`` keys are the inner optimizers' keys, behind ``"<name>."`` for
    optimizers given as ``(name, optimizer)``. ``param_groups`` are the inner optimizers' own group
    dicts, so an LR scheduler on the combination changes every inner learning rate.

    Args:
        optims: keyed optimizers, or ``(name, optimizer)`` pairs, or a mix. A plain
            ``torch.optim.Optimizer`` is accepted too (a shardkit extension): its parameters are
            keyed by position (``"0"``, ``"1"``, ...), as torch's own ``state_dict`` does.
    """

    def __init__(
        self,
        optims: Sequence[
            KeyedOptimizer | torch.optim.Optimizer | tuple[str, torch.optim.Optimizer]
        ],
    ) -> None:
        self.defaults: dict[str, Any] = {}
        self._optims: list[tuple[str, KeyedOptimizer]] = [_named(item) for item in optims]
        saves = {opt.defaults["_save_param_groups"] for _, opt in self._optims}
        if len(saves) > 1:
            raise ValueError(
                "CombinedOptimizer: the optimizers disagree on save_param_groups; call "
                "save_param_groups() with one value on each (or on the combination)"
            )
        self.defaults["_save_param_groups"] = saves.pop() if saves else False
        seen: set[str] = set()
        for prefix, opt in self._optims:
            for key in opt.params:
                full = self.prepend_opt_key(key, prefix)
                if full in seen:
                    raise ValueError(
                        f"CombinedOptimizer: parameter key {full!r} appears in two optimizers; "
                        "give them distinct names with (name, optimizer) pairs"
                    )
                seen.add(full)
        init_optimizer_hooks(self)

    def __repr__(self) -> str:
        return ",".join(f"{key}: {opt!r}" for key, opt in self._optims)

    @property
    def optimizers(self) -> list[tuple[str, KeyedOptimizer]]:
        """The ``(name, optimizer)`` pairs (name ``""`` for those given without one)."""
        return self._optims

    @staticmethod
    def prepend_opt_key(name: str, opt_key: str) -> str:
        """``"<opt_key>.<name>"``, without a dot where either is empty."""
        if not name:
            return opt_key
        return opt_key + ("." if opt_key else "") + name

    @property
    def param_groups(self) -> list[Mapping[str, Any]]:  # type: ignore[override]
        return [group for _, opt in self._optims for group in opt.param_groups]

    @property
    def params(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {
            self.prepend_opt_key(key, prefix): param
            for prefix, opt in self._optims
            for key, param in opt.params.items()
        }

    @property
    def state(self) -> dict[Any, Any]:  # type: ignore[override]
        return {param: state for _, opt in self._optims for param, state in opt.state.items()}

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for _, opt in self._optims:
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, opt in self._optims:
            opt.zero_grad(set_to_none=set_to_none)

    def post_load_state_dict(self) -> None:
        for _, opt in self._optims:
            opt.post_load_state_dict()

    def save_param_groups(self, save: bool) -> None:
        self.defaults["_save_param_groups"] = save
        for _, opt in self._optims:
            opt.save_param_groups(save)

    def set_optimizer_step(self, step: int) -> None:
        for _, opt in self._optims:
            if hasattr(opt, "set_optimizer_step"):
                opt.set_optimizer_step(step)

    def update_hyper_parameters(self, params_dict: dict[str, Any]) -> None:
        for _, opt in self._optims:
            if hasattr(opt, "update_hyper_parameters"):
                opt.update_hyper_parameters(params_dict)


def _named(item: Any) -> tuple[str, KeyedOptimizer]:
    name, opt = item if isinstance(item, tuple) else ("", item)
    if not isinstance(name, str):
        raise TypeError(f"CombinedOptimizer: a pair's name must be a str, got {name!r}")
    if isinstance(opt, KeyedOptimizer):
        return name, opt
    if isinstance(opt, torch.optim.Optimizer):
        return name, _PositionallyKeyed(opt)
    raise TypeError(
        f"CombinedOptimizer takes optimizers or (name, optimizer) pairs, got {type(opt).__name__}"
    )


class _PositionallyKeyed(KeyedOptimizer):
    """A plain torch optimizer, its parameters keyed by position (``"0"``, ``"1"``, ...)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        ordered = [p for group in optimizer.param_groups for p in group["params"]]
        super().__init__(
            {str(i): p for i, p in enumerate(ordered)}, optimizer.state, optimizer.param_groups
        )
        self.defaults["_save_param_groups"] = False

    def __repr__(self) -> str:
        return repr(self._optimizer)

    def step(self, closure: Any = None) -> Any:
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)
