"""The parameters of one unit, gathered, swapped into their modules, freed and reduced together.

[Note: which tensor a module sees]
Outside forward and backward, every module attribute of a managed parameter holds the shard
(``ShardedParam.sharded``), so ``model.parameters()`` gives the optimizer the shards. From a
unit's gather until it reshards, the attributes hold the gathered parameters instead. Sharded
parameters go through the unit's flat buckets (one per dtype, see [Note: flat buckets]); whole
ones (see [Note: shard layout]) through a bucket each (see [Note: one bucket protocol]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardkit.fsdp._bucket import Bucket, WholeBucket
from shardkit.fsdp._config import Precision
from shardkit.fsdp._flat import FlatBucket
from shardkit.fsdp._memory import BufferPool
from shardkit.fsdp._mesh_info import MeshInfo
from shardkit.fsdp._param import ShardedParam, local_of, set_param

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
        params: the unit's parameters, in registration order (shards not yet set).
        buffers: the buffers of the unit's own modules (not sharded; kept on the compute device).
        precision: the unit's dtypes (that of the gradient reduction).
        mesh_info: the unit's groups; storage_device: where shards live.
        meta: the parameters are on the meta device.
        pin_memory: pin CPU shards that a GPU gathers from.
    """

    def __init__(
        self,
        params: list[ShardedParam],
        buffers: list[BufferInfo],
        precision: Precision,
        *,
        mesh_info: MeshInfo,
        storage_device: torch.device,
        meta: bool,
        pin_memory: bool = True,
    ) -> None:
        self.params = params
        self.buffers = buffers
        self.on_cpu = mesh_info.device.type == "cpu"
        self.reduce_dtype = precision.reduce_dtype
        by_dtype: dict[torch.dtype, list[ShardedParam]] = {}
        for param in params:
            if not param.whole:
                by_dtype.setdefault(param.dtype, []).append(param)
        self.buckets = [
            FlatBucket(group, mesh_info, storage_device, meta=meta, pin_memory=pin_memory)
            for group in by_dtype.values()
        ]
        # every parameter's bucket, flat and whole, driven in one loop
        self._buckets: list[Bucket] = [*self.buckets, *(WholeBucket(p) for p in params if p.whole)]
        self._place = {
            id(p): (bucket, i) for bucket in self._buckets for i, p in enumerate(bucket.params)
        }

    def adopt_applied(self) -> None:
        """After ``module._apply`` (``to_empty``, ``to``) gave the registered shards new tensors:
        keep the shards in their buckets, with the new values, and the same Parameters."""
        for param in self.params:
            slot = param.slots[0]
            current = slot.module._parameters[slot.attr]
            if current is not param.sharded:  # a new Parameter: take its values, keep ours
                assert current is not None
                param.repoint(local_of(current).detach())
                for other in param.slots:
                    set_param(other.module, other.attr, param.sharded)
            bucket, index = self._place[id(param)]
            if not isinstance(bucket, FlatBucket):
                continue  # a whole parameter is its own shard
            local, flat = param.local, bucket.flat_shard
            moved = local.device != flat.device or local.is_meta != flat.is_meta
            if moved or local.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr():
                bucket.adopt(index, local)

    def load(self, param: ShardedParam, full: torch.Tensor) -> None:
        """Set ``param``'s shard from its full value (meta allowed): this rank's rows go into its
        bucket's flat shard; a whole parameter keeps ``full`` (or a copy)."""
        bucket, index = self._place[id(param)]
        bucket.load(index, full)

    @property
    def is_unsharded(self) -> bool:
        """Whether any gathered (non-aliased) parameter holds memory or is being gathered."""
        return any(bucket.is_unsharded for bucket in self._buckets)

    @property
    def num_grad_params(self) -> int:
        return sum(1 for p in self.params if p.sharded.requires_grad)

    def start_unshard(self) -> None:
        """Launch the all-gathers (asynchronous), gathering again what the optimizer changed
        since the last gather (see [Note: unsharded storage])."""
        for bucket in self._buckets:
            if bucket.is_stale():
                bucket.free()
            bucket.start_unshard()

    def unshard(self) -> None:
        """Finish the gathers and point the modules at the gathered parameters."""
        self.start_unshard()
        for bucket in self._buckets:
            bucket.finish_unshard()
        for param in self.params:
            if not param.aliased:
                assert param.unsharded is not None
                for slot in param.slots:
                    set_param(slot.module, slot.attr, param.unsharded)

    def reshard(self, *, keep_memory: bool = False) -> None:
        """Point the modules back at the shards and free the gathered parameters (``keep_memory``:
        into the pool, for the next gather; see [Note: unsharded memory pool])."""
        for param in self.params:
            if not param.aliased:
                for slot in param.slots:
                    set_param(slot.module, slot.attr, param.sharded)
        for bucket in self._buckets:
            bucket.free(keep_memory=keep_memory)

    def has_grads(self) -> bool:
        """Whether any parameter has a gradient that was not reduced yet."""
        return any(bucket.has_new_grads() for bucket in self._buckets)

    def new_grad_bytes(self) -> int:
        """Bytes of the gathered parameters' gradients that reducing will free."""
        return sum(
            p.unsharded.grad.numel() * p.unsharded.grad.element_size()
            for p in self.params
            if not p.aliased and p.unsharded is not None and p.unsharded.grad is not None
            and not self._is_direct(p)  # freed when its reduction is done: finish_reduce
        )  # fmt: skip

    def _is_direct(self, param: ShardedParam) -> bool:
        place = self._place.get(id(param))
        return place is not None and place[0].direct[place[1]]

    def mark_stale(self) -> None:
        """The shards may have changed (an optimizer step): what is gathered now is gathered
        again at its next use. See [Note: unsharded storage]."""
        for bucket in self._buckets:
            bucket.mark_stale()

    def stash_grads(self) -> None:
        """Keep unreduced gradients for a later reduction (gradient accumulation)."""
        for param in self.params:
            param.stash_grad(self.reduce_dtype)

    def start_reduce(self, pool: BufferPool) -> None:
        for bucket in self._buckets:
            bucket.start_reduce(self.reduce_dtype, pool)

    def finish_reduce(self, pool: BufferPool) -> int:
        """Finish the reductions; the bytes of gathered gradients this releases."""
        return sum(bucket.finish_reduce(pool) for bucket in self._buckets)
