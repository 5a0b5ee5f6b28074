"""Parameters that wrapping replaced, and the optimizer check that catches them.

Wrapping replaces every managed parameter with a new ``nn.Parameter`` holding only this rank's
shard. An optimizer built before wrapping still holds the old ones: it would step tensors the
model no longer uses while the shards never change. Each replaced parameter is marked, and a
global optimizer step pre-hook (installed on first wrap) refuses to step a marked parameter. Every
rank builds its optimizer the same way, so every rank raises. The same look at an optimizer's
parameters finds those that hold shards: they get the iteration's step hooks
(`hook_optimizer`); optimizers over other parameters get none.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from shardkit.fsdp._state import hook_optimizer

__all__ = ["REPLACED_ATTR", "mark_replaced"]

REPLACED_ATTR = "_shardkit_fsdp_replaced"
SHARD_ATTR = "_shardkit_fsdp_shard"  # on every shard (see _param.py)

_hook_installed = False


def mark_replaced(param: torch.nn.Parameter, description: str) -> None:
    """Mark ``param`` as replaced by its shard (``description`` names it in the error)."""
    global _hook_installed
    setattr(param, REPLACED_ATTR, description)
    if not _hook_installed:
        register_optimizer_step_pre_hook(_refuse_replaced)
        _hook_installed = True


def _refuse_replaced(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    holds_shards = False
    for group in optimizer.param_groups:
        for param in group["params"]:
            holds_shards = holds_shards or getattr(param, SHARD_ATTR, False)
            description = getattr(param, REPLACED_ATTR, None)
            if description is not None:
                name = type(optimizer).__name__
                raise ValueError(
                    f"{name} holds parameter {description}, which shardkit.fsdp replaced with "
                    "its shard when it wrapped the module: this optimizer was built before "
                    f"wrapping and would update tensors the model no longer uses. Build it "
                    f"after wrapping, over the shards: optimizer = {name}(model.parameters(), ...)"
                )
    if holds_shards:
        hook_optimizer(optimizer)
