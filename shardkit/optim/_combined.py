"""`CombinedOptimizer`: several optimizers seen as one (TorchRec's name), keyed by prefix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["CombinedOptimizer"]


class CombinedOptimizer(torch.optim.Optimizer):
    """``step``, ``zero_grad``, ``param_groups`` (the same dicts, so LR schedulers work) and a
    ``state_dict`` whose keys are the inner optimizers' keys under ``"<prefix>."``."""

    def __init__(self, optimizers: Sequence[tuple[str, torch.optim.Optimizer]]) -> None:
        self._optimizers = list(optimizers)
        super().__init__([{"params": []}], defaults={})
        self.param_groups = [g for _, opt in self._optimizers for g in opt.param_groups]
        for _, opt in self._optimizers:
            self.state.update(opt.state)

    @property
    def optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        return list(self._optimizers)

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for _, opt in self._optimizers:
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, opt in self._optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        groups: list[dict[str, Any]] = []
        for prefix, opt in self._optimizers:
            inner = opt.state_dict()
            state.update({_join(prefix, k): v for k, v in inner["state"].items()})
            for group in inner["param_groups"]:
                names = [_join(prefix, p) if isinstance(p, str) else p for p in group["params"]]
                groups.append({**group, "params": names})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        groups = list(state_dict["param_groups"])
        for prefix, opt in self._optimizers:
            lead = f"{prefix}." if prefix else ""
            inner_state = {
                k[len(lead) :]: v for k, v in state_dict["state"].items() if k.startswith(lead)
            }
            count = len(opt.param_groups)
            inner_groups = [
                {**g, "params": [p[len(lead) :] if isinstance(p, str) else p for p in g["params"]]}
                for g in groups[:count]
            ]
            groups = groups[count:]
            opt.load_state_dict({"state": inner_state, "param_groups": inner_groups})


def _join(prefix: str, key: Any) -> Any:
    return f"{prefix}.{key}" if prefix else key
