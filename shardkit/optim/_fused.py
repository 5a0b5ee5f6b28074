"""Optimizer state for tables updated inside backward, and the optimizer object users see.

A `RowOptimizer` serves one batched weight buffer ``[R, D]`` (several tables stacked): it owns
the state buffers and a param-group dict of hyperparameters that it re-reads on every update,
so learning-rate changes (by hand or by a torch LR scheduler) take effect at the next backward.
`FusedOptimizer` is the `torch.optim.Optimizer` over the tables' parameters that shows those
param groups and that state by table name (TorchRec's ``model.fused_optimizer``); its ``step`` and
``zero_grad`` do nothing because the kernel has already stepped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from shardkit.optim._config import FusedOptimizerConfig
from shardkit.optim._keyed import KeyedOptimizer
from shardkit.optim._rules import apply_rule, new_state, reset_state

__all__ = ["FusedOptimizer", "FusedTable", "RowOptimizer"]


class RowOptimizer:
    """The fused optimizer of one ``[rows, dim]`` weight buffer."""

    def __init__(
        self,
        config: FusedOptimizerConfig,
        rows: int,
        dim: int,
        device: torch.device,
        *,
        prepare: Callable[[torch.Tensor], object] | None = None,
    ) -> None:
        self.config = config
        self.kind = config.optimizer
        self.param_group: dict[str, Any] = config.hyperparameters()
        self.state = new_state(
            self.kind, rows, dim, device, config.initial_accumulator_value, prepare=prepare
        )
        # the step counter is a live CPU tensor so that optimizer views (`FusedOptimizer`,
        # TorchRec-style ``dmp.fused_optimizer``) save and load it with the rest of the state
        self.step_count = torch.zeros((), dtype=torch.int64)

    @property
    def step(self) -> int:
        """Optimizer steps taken (Adam's and LAMB's bias correction count them)."""
        return int(self.step_count)

    @step.setter
    def step(self, value: int) -> None:
        self.step_count.fill_(int(value))

    def begin_step(self) -> None:
        """Count one optimizer step (once per backward of the buffer)."""
        self.step_count += 1

    def update(self, weight: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """Apply the rule to ``weight[rows]`` with summed gradients ``grads`` ``[len(rows), D]``."""
        apply_rule(self.kind, weight, self.state, rows, grads, self.param_group, self.step)

    def to_(self, fn: Any) -> None:
        """Apply a tensor conversion (``Module._apply``'s ``fn``) to the state buffers."""
        self.state = {name: fn(t) for name, t in self.state.items()}

    def reset_state(self) -> None:
        """The state's starting values again, and no step taken (e.g. after ``to_empty``)."""
        reset_state(self.kind, self.state, self.config.initial_accumulator_value)
        self.step = 0

    def state_rows(self, start: int, end: int) -> dict[str, torch.Tensor]:
        """Views of the state of rows ``[start, end)`` (one table of the buffer)."""
        return {name: t[start:end] for name, t in self.state.items()}


@dataclass(frozen=True)
class FusedTable:
    """One table as the optimizer shows it: its parameter and its rows in a `RowOptimizer`."""

    name: str  # the parameter's key, e.g. "embedding_bags.user_table.weight"
    table: str  # the table's name, e.g. "user_table"
    param: torch.nn.Parameter
    optimizer: RowOptimizer
    row_start: int
    row_end: int


def _state_view(table: FusedTable) -> dict[str, torch.Tensor]:
    """The table's rows of the state buffers, and the buffer's live step counter (0-d int64;
    shared by the tables stacked in one buffer)."""
    return {
        **table.optimizer.state_rows(table.row_start, table.row_end),
        "step": table.optimizer.step_count,
    }


class FusedOptimizer(KeyedOptimizer):
    """The optimizer of embedding tables whose update runs fused into backward.

    One param group per distinct `RowOptimizer`; change ``param_groups[i]["lr"]`` (or attach an
    LR scheduler) to change the learning rate. ``state_dict()`` is keyed by parameter name:
    ``{"state": {name: {"<table>.momentum1": tensor, ..., "<table>.step": tensor}},
    "param_groups": [...]}``. ``state[param]`` holds the table's rows of each state buffer and
    ``"step"``, the live step counter, so wrappers that read ``state`` (`CombinedOptimizer`,
    ``dmp.fused_optimizer``) save and restore the step count too.
    """

    def __init__(self, tables: Sequence[FusedTable]) -> None:
        self._tables = {t.name: t for t in tables}
        groups: list[dict[str, Any]] = []
        for table in tables:
            group = table.optimizer.param_group
            if all(g is not group for g in groups):
                group["params"] = []
                groups.append(group)
            group["params"].append(table.param)
        if not groups:
            groups = [{"params": [], "lr": 0.0}]
        super().__init__(
            {t.name: t.param for t in tables},
            {t.param: _state_view(t) for t in tables},
            groups,
        )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Nothing to do: the tables were updated during backward."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: fused tables never hold a gradient."""

    def state_dict(self) -> dict[str, Any]:
        state = {}
        for name, table in self._tables.items():
            state[name] = {f"{table.table}.{k}": v for k, v in self.state[table.param].items()}
        groups = []
        for group in self.param_groups:
            names = [
                n for n, t in self._tables.items() if any(t.param is p for p in group["params"])
            ]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": names})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Copy saved state into the live buffers (in place: the kernel keeps its references)."""
        saved_state = state_dict["state"]
        missing = sorted(set(self._tables) - set(saved_state))
        if missing:
            raise ValueError(f"fused optimizer state has no entry for {missing}")
        for name, table in self._tables.items():
            saved = saved_state[name]
            for key, live in self.state[table.param].items():
                full_key = f"{table.table}.{key}"
                if full_key not in saved and key == "step":
                    continue  # a state dict without step counts (TorchRec's): keep ours
                if full_key not in saved:
                    raise ValueError(
                        f"fused optimizer state of {name!r} lacks {full_key!r} (it has "
                        f"{sorted(saved)}): load a state dict saved from a collection with the "
                        "same tables and optimizer"
                    )
                live.copy_(saved[full_key])
        for group, saved_group in zip(self.param_groups, state_dict["param_groups"]):
            group.update({k: v for k, v in saved_group.items() if k != "params"})
