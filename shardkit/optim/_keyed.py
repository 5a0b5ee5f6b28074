"""`KeyedOptimizer`: an optimizer whose state dict is keyed by parameter name (TorchRec's base).

[Note: keyed optimizer state]
torch's ``Optimizer.state_dict()`` keys state by each parameter's position, which means nothing
once a model is sharded differently. A keyed optimizer holds ``params`` (``{name: parameter}``)
and writes ``{"state": {name: {"momentum1": tensor, ...}}}``; param groups are left out unless
``save_param_groups(True)`` (they are usually set up again by the training script, and in a
sharded model not every rank holds every group's parameters). Loading is strict and in place: the
saved state must name the same parameters with the same state entries (so an optimizer whose state
is still empty cannot take a saved state, nor the other way round: run one step, or
``init_state()``, first), and tensors are copied into the live ones, so code holding them (a fused
kernel) keeps working.
"""

from __future__ import annotations

import copy
import sys
from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any

import torch

__all__ = ["KeyedOptimizer", "init_optimizer_hooks"]


def init_optimizer_hooks(optimizer: torch.optim.Optimizer) -> None:
    """The hook tables and step patch ``torch.optim.Optimizer.__init__`` would set up, for
    optimizers that do not call it (their state and groups live elsewhere)."""
    for name in (
        "_optimizer_step_pre_hooks",
        "_optimizer_step_post_hooks",
        "_optimizer_state_dict_pre_hooks",
        "_optimizer_state_dict_post_hooks",
        "_optimizer_load_state_dict_pre_hooks",
        "_optimizer_load_state_dict_post_hooks",
    ):
        setattr(optimizer, name, OrderedDict())
    optimizer._patch_step_function()


class KeyedOptimizer(torch.optim.Optimizer):
    """An optimizer over ``params`` whose ``state_dict`` is keyed by their names.

    See [Note: keyed optimizer state]. Subclasses implement ``step`` (and usually
    ``zero_grad``); `KeyedOptimizerWrapper` makes one from any torch optimizer.

    Args:
        params: ``{name: parameter}``.
        state: ``{parameter: {state name: value}}`` (may be filled lazily by ``step``).
        param_groups: the groups, each ``{"params": [parameter, ...], "lr": ..., ...}``.
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        state: Mapping[Any, Any],
        param_groups: Collection[Mapping[str, Any]],
    ) -> None:
        init_optimizer_hooks(self)
        self.state = state  # type: ignore[assignment]
        self.param_groups = param_groups  # type: ignore[assignment]
        self.params = params
        self.defaults: dict[str, Any] = {"_save_param_groups": False}
        known = {id(p) for p in params.values()}
        strangers = [key for key in self.state if id(key) not in known]
        if strangers:
            raise ValueError(
                f"{type(self).__name__}: {len(strangers)} state key(s) are not among params "
                f"({sorted(params)[:5]}...); every state key must be one of the named parameters"
            )

    def _key_of(self) -> dict[int, str]:
        return {id(param): key for key, param in self.params.items()}

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {name: state}}``, plus ``"param_groups"`` (parameters by name) when
        ``save_param_groups(True)``. See [Note: keyed optimizer state]."""
        key_of = self._key_of()
        state = {key_of[id(p)]: _plain(s) for p, s in self.state.items()}
        result: dict[str, Any] = {"state": state}
        if self.defaults["_save_param_groups"]:
            result["param_groups"] = [
                {
                    "params": sorted(key_of[id(p)] for p in group["params"]),
                    **{k: copy.deepcopy(v) for k, v in group.items() if k != "params"},
                }
                for group in self.param_groups
            ]
        return result

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Copy ``state_dict`` into the live state, strictly (see [Note: keyed optimizer
        state]); then ``post_load_state_dict()``."""
        saved = state_dict["state"]
        if len(self.state) != len(saved):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the optimizer holds state for "
                f"{len(self.state)} parameter(s), the saved state for {len(saved)}; run a step "
                "(or init_state()) first so that both are initialised"
            )
        for key, param in self.params.items():
            if param not in self.state:
                continue
            if key not in saved:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: no saved state for {key!r}"
                )
            live = self.state[param]
            # a fused table's dict from TorchRec (or shardkit before step counts were state)
            # has no step count ("step", or "<table>.step" in TorchRec's layout): the live
            # count stays (`FusedOptimizer.load_state_dict` does the same)
            live = {k: v for k, v in live.items() if not _is_step(k) or k in saved[key]}
            if len(live) != len(saved[key]):
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: {key!r} has state "
                    f"{sorted(live)}, the saved one {sorted(saved[key])}"
                )
            _copy_into(live, saved[key], [key])
        if self.defaults["_save_param_groups"]:
            self._load_groups(state_dict["param_groups"])
        self.post_load_state_dict()

    def _load_groups(self, saved_groups: list[Mapping[str, Any]]) -> None:
        if len(self.param_groups) != len(saved_groups):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: {len(self.param_groups)} param groups, "
                f"the saved state has {len(saved_groups)}"
            )
        key_of = self._key_of()
        by_names = {"/".join(sorted(g["params"])): g for g in saved_groups}
        for group in self.param_groups:
            names = "/".join(sorted(key_of[id(p)] for p in group["params"]))
            if names not in by_names:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: no saved param group for {names!r}"
                )
            missing = sorted(set(group) - set(by_names[names]))
            if missing:
                raise ValueError(f"the saved param group {names!r} lacks {missing}")
            for k in group:
                if k != "params":
                    group[k] = copy.deepcopy(by_names[names][k])

    def post_load_state_dict(self) -> None:
        """Called after ``load_state_dict`` (warm-up optimizers re-derive their rate here)."""

    def add_param_group(self, param_group: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} has a fixed set of named parameters; build a new one "
            "(e.g. KeyedOptimizerWrapper) with every parameter instead"
        )

    def init_state(self, sparse_grad_parameter_names: set[str] | None = None) -> None:
        """Give every trainable parameter a zero gradient and step once, so that lazily created
        state exists before a checkpoint is loaded into it in place."""
        for key, param in self.params.items():
            if param.requires_grad:
                grad = torch.zeros_like(param)
                if sparse_grad_parameter_names is not None and key in sparse_grad_parameter_names:
                    grad = grad.to_sparse()
                param.grad = grad
        self.step(closure=None)

    def save_param_groups(self, save: bool) -> None:
        """Whether ``state_dict`` includes the param groups (default False)."""
        self.defaults["_save_param_groups"] = save

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__


def _plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter's state with nested stateful objects replaced by their ``state_dict()``."""
    result = {}
    for key, value in state.items():
        if isinstance(value, dict):
            result[key] = _plain(value)
        elif callable(getattr(value, "state_dict", None)):
            result[key] = value.state_dict()
        else:
            result[key] = value
    return result


def _copy_into(live: dict[str, Any], saved: Mapping[str, Any], path: list[Any]) -> None:
    """Copy ``saved`` into ``live`` in place: tensors and shards by ``copy_``, stateful objects
    by ``load_state_dict``, anything else replaced."""
    for key, value in live.items():
        if key not in saved:
            raise ValueError(f"the saved optimizer state lacks {'.'.join(map(str, [*path, key]))}")
        new = saved[key]
        if isinstance(value, dict):
            _copy_into(value, new, [*path, key])
        elif callable(getattr(value, "load_state_dict", None)):
            value.load_state_dict(new)
        elif _is_sharded_tensor(value):
            _copy_shards(value, new, [*path, key])
        elif isinstance(value, torch.Tensor):
            value.detach().copy_(new)
        else:
            live[key] = copy.deepcopy(new)


def _is_sharded_tensor(value: Any) -> bool:
    """Without importing the (slow) sharded-tensor module: none exists unless it is imported."""
    module = sys.modules.get("torch.distributed._shard.sharded_tensor")
    return module is not None and isinstance(value, module.ShardedTensor)


def _is_step(key: str) -> bool:
    return key == "step" or key.endswith(".step")


def _copy_shards(live: Any, saved: Any, path: list[Any]) -> None:
    """Copy into each local shard of ``live``: the saved ShardedTensor's local shard at the
    same offsets (what a load through torch.distributed.checkpoint into this optimizer's own
    ``state_dict()`` gives), or its block of a whole tensor of the same global shape."""
    where = ".".join(map(str, path))
    if isinstance(saved, torch.Tensor) and not _is_sharded_tensor(saved):
        if tuple(saved.shape) != tuple(live.size()):
            raise ValueError(
                f"{where}: the saved tensor has shape {tuple(saved.shape)}, this rank's state "
                f"is a ShardedTensor of shape {tuple(live.size())}; load a state of this "
                "table's shape (a column-split row-wise state has one accumulator per column "
                "block: rows x blocks)"
            )
        for shard in live.local_shards():
            block = saved
            for dim, (start, size) in enumerate(
                zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes)
            ):
                block = block.narrow(dim, start, size)
            shard.tensor.detach().copy_(block)
        return
    if not _is_sharded_tensor(saved):
        raise ValueError(f"{where}: a ShardedTensor, saved as {type(saved).__name__}")
    theirs = {_shard_place(s): s.tensor for s in saved.local_shards()}
    for shard in live.local_shards():
        place = _shard_place(shard)
        if place not in theirs:
            raise ValueError(
                f"{where}: the saved ShardedTensor has no local shard at offsets {place[0]} "
                f"with sizes {place[1]} (it has {sorted(theirs)}), this rank's shard: it was "
                "sharded by another plan; load the checkpoint with torch.distributed.checkpoint "
                "into this optimizer's state_dict(), which reshards, and pass that"
            )
        shard.tensor.detach().copy_(theirs[place])


def _shard_place(shard: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(shard.metadata.shard_offsets), tuple(shard.metadata.shard_sizes)
