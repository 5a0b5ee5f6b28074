"""The parameters of one unit, gathered, swapped into their modules, freed and reduced together.

[Note: which tensor a module sees]
Outside forward and backward, every module attribute of a managed parameter holds the shard
(``ShardedParam.sharded``), so ``model.parameters()`` gives the optimizer the shards. From a
unit's gather until it reshards, the attributes hold the gathered parameters instead. Aliased
parameters (whole parameters in their own dtype, e.g. NO_SHARD) are the same tensor in both roles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardkit.fsdp._api import MixedPrecision
from shardkit.fsdp._param import ShardedParam, set_param

__all__ = ["BufferInfo", "ParamGroup"]


@dataclass(frozen=True)
class BufferInfo:
    """A buffer of a unit's own modules, and its dtype before mixed precision cast it."""

    fqn: str
    module: torch.nn.Module
    name: str
    dtype: torch.dtype


class ParamGroup:
    """All parameters one unit manages. See [Note: which tensor a module sees].

    Args:
        params: the unit's parameters, in registration order.
        buffers: the buffers of the unit's own modules (not sharded; kept on the compute device).
        mp: mixed precision policy (dtype of the gradient reduction).
    """

    def __init__(
        self, params: list[ShardedParam], buffers: list[BufferInfo], mp: MixedPrecision
    ) -> None:
        self.params = params
        self.buffers = buffers
        self.reduce_dtype = mp.effective_reduce_dtype

    @property
    def is_unsharded(self) -> bool:
        """Whether any gathered (non-aliased) parameter holds memory or is being gathered."""
        return any(not p.aliased and (p.is_unsharded or p._gather is not None) for p in self.params)

    @property
    def num_grad_params(self) -> int:
        return sum(1 for p in self.params if p.sharded.requires_grad)

    def start_unshard(self) -> None:
        """Launch the all-gathers of every parameter (asynchronous)."""
        for param in self.params:
            param.start_unshard()

    def unshard(self, *, in_place: bool) -> None:
        """Finish the gathers and point the modules at the gathered parameters."""
        self.start_unshard()
        for param in self.params:
            if param.aliased:
                param.ensure_grad_hook()
                continue
            param.finish_unshard(in_place=in_place)
            assert param.unsharded is not None
            for slot in param.slots:
                set_param(slot.module, slot.attr, param.unsharded)

    def reshard(self) -> None:
        """Point the modules back at the shards and free the gathered parameters."""
        for param in self.params:
            if param.aliased:
                continue
            for slot in param.slots:
                set_param(slot.module, slot.attr, param.sharded)
            param.free()

    def has_grads(self) -> bool:
        """Whether any parameter has a gradient that was not reduced yet."""
        return any(p.has_new_grad() for p in self.params)

    def start_reduce(self) -> None:
        for param in self.params:
            param.start_reduce(self.reduce_dtype)

    def finish_reduce(self) -> None:
        for param in self.params:
            param.finish_reduce()
