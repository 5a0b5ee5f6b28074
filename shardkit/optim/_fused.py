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

from shardkit.optim._config import EmbOptimType, FusedOptimizerConfig
from shardkit.optim._keyed import KeyedOptimizer
from shardkit.optim._rules import apply_rule, new_state, reset_state

__all__ = ["FusedOptimizer", "FusedTable", "RowOptimizer"]

# FBGEMM's names of a rule's state buffers, by position, as TorchRec's fused optimizers show
# them (TorchRec renames the first momentum1)
_TORCHREC_NAMES = ("momentum1", "exp_avg_sq")
# rules whose update does not read the step count: their state is exactly TorchRec's
_STEP_FREE = (
    EmbOptimType.EXACT_SGD,
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
)


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

    @property
    def reads_step(self) -> bool:
        """Whether the rule's update reads the step count (Adam's bias correction does; SGD
        and the Adagrads do not, and TorchRec's state of them has no count)."""
        return self.kind not in _STEP_FREE

    def torchrec_state_names(self) -> dict[str, str]:
        """``{state buffer name: TorchRec's}`` (e.g. Adam's ``exp_avg`` is ``momentum1``)."""
        names = list(self.state)
        if len(names) > len(_TORCHREC_NAMES):
            raise ValueError(
                f"the fused rule {self.kind.name} has {len(names)} state buffers {names}; "
                f"TorchRec's layout names at most {len(_TORCHREC_NAMES)}"
            )
        return dict(zip(names, _TORCHREC_NAMES))

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
    LR scheduler) to change the learning rate. ``state_dict()`` is keyed by parameter name in
    TorchRec's layout (a sharded collection's, see `state_dict`). ``state[param]`` holds the
    table's rows of each state buffer by its own name (Adam's ``exp_avg``) and ``"step"``, the
    live step counter, so wrappers that read ``state`` (`CombinedOptimizer`,
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
        """TorchRec's layout, as a sharded collection's fused optimizer saves it (so
        ``torch.distributed.checkpoint`` loads one into the other): ``{"state": {name:
        {"<table>.momentum1": ..., "<table>.exp_avg_sq": ..., "<table>.step": ...}}}``, the
        buffers named by position, the step count only for rules that read it, and
        ``"param_groups"`` (parameters by name) when ``save_param_groups(True)``."""
        state = {}
        for name, table in self._tables.items():
            live = self.state[table.param]
            renamed = table.optimizer.torchrec_state_names()
            entry = {f"{table.table}.{renamed[k]}": v for k, v in live.items() if k != "step"}
            if table.optimizer.reads_step:
                entry[f"{table.table}.step"] = live["step"]
            state[name] = entry
        if not self.defaults["_save_param_groups"]:
            return {"state": state}
        groups = []
        for group in self.param_groups:
            names = [
                n for n, t in self._tables.items() if any(t.param is p for p in group["params"])
            ]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": names})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Copy saved state into the live buffers (in place: the kernel keeps its references).
        Takes TorchRec's names or the buffers' own (``exp_avg``; shardkit before the layout
        was TorchRec's); a state without step counts (TorchRec's) keeps the live ones."""
        saved_state = state_dict["state"]
        missing = sorted(set(self._tables) - set(saved_state))
        if missing:
            raise ValueError(f"fused optimizer state has no entry for {missing}")
        for name, table in self._tables.items():
            saved = saved_state[name]
            renamed = table.optimizer.torchrec_state_names()
            for key, live in self.state[table.param].items():
                keys = [f"{table.table}.{n}" for n in (renamed.get(key, key), key)]
                found = next((k for k in keys if k in saved), None)
                if found is None and key == "step":
                    continue
                if found is None:
                    raise ValueError(
                        f"fused optimizer state of {name!r} lacks {keys[0]!r} (it has "
                        f"{sorted(saved)}): load a state dict saved from a collection with the "
                        "same tables and optimizer"
                    )
                live.copy_(saved[found])
        for group, saved_group in zip(self.param_groups, state_dict.get("param_groups", [])):
            group.update({k: v for k, v in saved_group.items() if k != "params"})
