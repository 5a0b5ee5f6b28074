"""A learning-rate schedule in stages (``torchrec.optim.warmup``).

[Note: warm-up stages]
Stages run one after another; stage ``i`` lasts until iteration ``stages[i].max_iters`` (counted
from the start of training, not of the stage), and a final stage keeps the rate at ``lr`` for
ever. At iteration ``t`` (0 before the first step) every param group's rate is
``lr * multiplier(stage, t) * stage.lr_scale``, where the multiplier is, by policy:

    LINEAR      value + (1 - value) * t / max_iters       (value -> 1 over the stage)
    CONSTANT    value
    POLY        (1 - t / decay_iters) ** value
    STEP        value ** (t // decay_iters)
    INVSQRT     1 / sqrt(max(t, 1))
    COSINE_ANNEALING_WARM_RESTARTS   value + (1 - value) * (1 + cos(pi * (t % sgdr_period) /
                sgdr_period)) / 2
    INTERPOLATE value + (end_value - value) * (t - start_interpolating_iters) /
                (max_iters - start_interpolating_iters)
    NONE        1

``decay_iters`` <= 0 means ``max_iters`` (1 for STEP). The iteration and stage are optimizer
state (``"__warmup"``), so a checkpoint resumes the schedule where it was.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from shardkit.optim._keyed import KeyedOptimizer
from shardkit.optim._wrappers import OptimizerWrapper

__all__ = ["WarmupOptimizer", "WarmupPolicy", "WarmupStage"]

logger = logging.getLogger(__name__)


@enum.unique
class WarmupPolicy(enum.Enum):
    """How the multiplier moves within a stage; see [Note: warm-up stages]."""

    NONE = "none"
    LINEAR = "linear"
    CONSTANT = "constant"
    POLY = "poly"
    STEP = "step"
    INVSQRT = "inv_sqrt"
    COSINE_ANNEALING_WARM_RESTARTS = "cosine_annealing_warm_restarts"
    INTERPOLATE = "interpolate"


@dataclasses.dataclass(frozen=True)
class WarmupStage:
    """One stage of the schedule; see [Note: warm-up stages] for each field's use."""

    policy: WarmupPolicy = WarmupPolicy.LINEAR
    max_iters: int = 1
    value: float = 1.0
    lr_scale: float = 1.0
    decay_iters: int = -1
    sgdr_period: int = 1
    start_interpolating_iters: int | None = None
    end_value: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.policy, WarmupPolicy):
            object.__setattr__(self, "policy", WarmupPolicy(self.policy))
        if self.policy == WarmupPolicy.INTERPOLATE:
            if self.start_interpolating_iters is None or self.end_value is None:
                raise ValueError(
                    "WarmupStage(policy=INTERPOLATE) needs start_interpolating_iters and end_value"
                )
            if self.max_iters <= self.start_interpolating_iters:
                raise ValueError(
                    f"WarmupStage(policy=INTERPOLATE): max_iters ({self.max_iters}) must be "
                    f"greater than start_interpolating_iters ({self.start_interpolating_iters})"
                )
        if self.policy == WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS and self.sgdr_period < 1:
            raise ValueError(f"WarmupStage: sgdr_period must be >= 1, got {self.sgdr_period}")

    def multiplier(self, iteration: int) -> float:
        """The learning-rate multiplier at ``iteration``, ``lr_scale`` included."""
        t, v = iteration, self.value
        p = self.policy
        if p == WarmupPolicy.LINEAR:
            m = v + (1.0 - v) * t / self.max_iters
        elif p == WarmupPolicy.CONSTANT:
            m = v
        elif p == WarmupPolicy.POLY:
            m = math.pow(1 - t / self._decay_iters(), v)
        elif p == WarmupPolicy.STEP:
            m = math.pow(v, t // self._decay_iters())
        elif p == WarmupPolicy.INVSQRT:
            m = 1.0 / math.sqrt(max(t, 1))  # TorchRec divides by zero at t = 0
        elif p == WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS:
            m = v + (1.0 - v) * 0.5 * (
                1 + math.cos(math.pi * (t % self.sgdr_period) / self.sgdr_period)
            )
        elif p == WarmupPolicy.INTERPOLATE:
            start = float(self.start_interpolating_iters)  # type: ignore[arg-type]
            m = v + (float(self.end_value) - v) * (t - start) / (self.max_iters - start)  # type: ignore[arg-type]
        else:
            m = 1.0
        return m * self.lr_scale

    def _decay_iters(self) -> int:
        if self.decay_iters > 0:
            return self.decay_iters
        return 1 if self.policy == WarmupPolicy.STEP else self.max_iters


def _stages(stages: Sequence[WarmupStage]) -> list[WarmupStage]:
    """The stages, checked to end at increasing iterations, and the final constant stage."""
    start = 0
    for index, stage in enumerate(stages):
        if stage.max_iters <= start:
            raise ValueError(
                f"WarmupOptimizer: stage {index} ends at max_iters={stage.max_iters}, not after "
                f"the previous stage's end ({start}); max_iters counts from the start of training"
            )
        start = stage.max_iters
    return [*stages, WarmupStage(policy=WarmupPolicy.NONE, max_iters=1 << 63, value=1.0)]


class WarmupOptimizer(OptimizerWrapper):
    """Sets every param group's learning rate by a schedule of stages, then steps the wrapped
    optimizer. See [Note: warm-up stages].

    Args:
        optimizer: the keyed optimizer to wrap.
        stages: the stages, in order.
        lr: the base learning rate the multipliers scale.
        lr_param: the param-group key to set.
        param_name: the key of the schedule's state in ``state_dict()``.
    """

    def __init__(
        self,
        optimizer: KeyedOptimizer,
        stages: Sequence[WarmupStage],
        lr: float = 0.1,
        lr_param: str = "lr",
        param_name: str = "__warmup",
    ) -> None:
        super().__init__(optimizer)
        self._stages = _stages(stages)
        self._lr_param = lr_param
        self._lr = lr
        self._param_name = param_name
        self._warmup_param = torch.nn.Parameter(torch.empty(0))
        self.params = {**optimizer.params, param_name: self._warmup_param}
        self._iteration, self._stage = 0, 0
        self._set_lr()  # a fused optimizer steps in the first backward, before step()

    @property  # type: ignore[override]  # read-only here: the inner state plus the warm-up's
    def state(self) -> dict[Any, Any]:
        warmup = torch.tensor([self._iteration, self._stage], dtype=torch.long)
        return {**self._optimizer.state, self._warmup_param: {"warmup": warmup}}

    @state.setter
    def state(self, value: Any) -> None:  # OptimizerWrapper assigns the inner state
        pass

    def _set_lr(self) -> None:
        lr = self._lr * self._stages[self._stage].multiplier(self._iteration)
        for group in self.param_groups:
            group[self._lr_param] = lr

    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        self._iteration += 1
        stage = self._stages[self._stage]
        if self._iteration > stage.max_iters and self._stage + 1 < len(self._stages):
            self._stage += 1
            logger.info(
                "warm-up: stage %d done, now %s", self._stage - 1, self._stages[self._stage]
            )
        self._set_lr()
        return loss

    def state_dict(self) -> dict[str, Any]:
        result = self._optimizer.state_dict()
        warmup = torch.tensor([self._iteration, self._stage], dtype=torch.long)
        result["state"] = {**result["state"], self._param_name: {"warmup": warmup}}
        return result

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        state = dict(state_dict["state"])
        saved = state.pop(self._param_name, None)
        self._optimizer.load_state_dict({**state_dict, "state": state})
        if saved is not None:
            self._iteration, self._stage = (int(v) for v in saved["warmup"].tolist())
        self.post_load_state_dict()

    def post_load_state_dict(self) -> None:
        logger.info("warm-up resumes at iteration %d (stage %d)", self._iteration, self._stage)
        self._set_lr()
