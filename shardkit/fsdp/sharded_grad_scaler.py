"""``ShardedGradScaler``: loss scaling for fully sharded models (torch's name and arguments).

A rank holds only its shards' gradients, so one rank may see an inf or NaN that the others do
not; every rank must then skip the same step and back off the same way. This scaler unscales
each rank's local gradients (plain shards, or the local tensors of DTensor gradients) and takes
the maximum of the ranks' "found inf" before the optimizer step.

Example::

    scaler = ShardedGradScaler("cpu")
    scaler.scale(loss).backward()
    scaler.step(optimizer)        # skipped on every rank if any rank found an inf or NaN
    scaler.update()
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.fsdp._param import local_of

__all__ = ["ShardedGradScaler"]


class ShardedGradScaler(torch.amp.GradScaler):
    """`torch.amp.GradScaler` whose inf/NaN check agrees across the ranks of
    ``process_group`` (default: all ranks). Arguments as torch's ``ShardedGradScaler``."""

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        backoff_factor: float = 0.5,
        growth_factor: float = 2.0,
        growth_interval: int = 2000,
        enabled: bool = True,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(
            device,
            init_scale=init_scale,
            backoff_factor=backoff_factor,
            growth_factor=growth_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )
        self.process_group = process_group

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = local_of(param.grad)
                if not allow_fp16 and grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                by_kind.setdefault((grad.device, grad.dtype), []).append(grad)
        found: dict[torch.device, torch.Tensor] = {}
        with torch.no_grad():
            for (device, _), grads in by_kind.items():
                if device not in found:
                    found[device] = found_inf.to(device, copy=True)
                torch._amp_foreach_non_finite_check_and_unscale_(
                    grads, found[device], inv_scale.to(device)
                )
        return found

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale this rank's gradients; every rank then knows whether any rank found an inf
        or NaN (a collective: call it, or `step`, on every rank)."""
        if not self._enabled:
            return
        super().unscale_(optimizer)
        state: Any = self._per_optimizer_states[id(optimizer)]
        local = torch.zeros(1, dtype=torch.float32)
        for value in state["found_inf_per_device"].values():
            local += value.detach().to("cpu", torch.float32).reshape(1)
        device = self._scale.device if self._scale is not None else local.device
        agreed = comm.all_reduce(local.to(device), op=dist.ReduceOp.MAX, group=self.process_group)
        assert isinstance(agreed, torch.Tensor)
        state["found_inf_per_device"] = {agreed.device: agreed}
