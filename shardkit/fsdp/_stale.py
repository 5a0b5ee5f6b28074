"""Parameters that wrapping replaced, and the optimizer check that catches them.

Wrapping replaces every managed parameter with a new ``nn.Parameter`` holding only this rank's
shard. An optimizer built before wrapping still holds the old ones: it would step tensors the
model no longer uses while the shards never change. Each replaced parameter is marked, and a
global optimizer step pre-hook (installed on first wrap) refuses to step a marked parameter. Every
rank builds its optimizer the same way, so every rank raises.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

__all__ = ["REPLACED_ATTR", "mark_replaced"]

REPLACED_ATTR = "_shardkit_fsdp_replaced"

_hook_installed = False


def mark_replaced(param: torch.nn.Parameter, description: str) -> None:
    """Mark ``param`` as replaced by its shard (``description`` names it in the error)."""
    global _hook_installed
    setattr(param, REPLACED_ATTR, description)
    if not _hook_installed:
        register_optimizer_step_pre_hook(_refuse_replaced)
        _hook_installed = True


def _refuse_replaced(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            description = getattr(param, REPLACED_ATTR, None)
            if description is not None:
                name = type(optimizer).__name__
                raise ValueError(
                    f"{name} holds parameter {description}, which shardkit.fsdp replaced with "
                    "its shard when it wrapped the module: this optimizer was built before "
                    f"wrapping and would update tensors the model no longer uses. Build it "
                    f"after wrapping, over the shards: optimizer = {name}(model.parameters(), ...)"
                )
