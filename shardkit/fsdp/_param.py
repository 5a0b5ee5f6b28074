"""One parameter, split along dim 0 over the shard group: its shard, its gathered form, its grad.

[Note: shard layout]
A parameter of shape ``[n, *rest]`` is split the way ``torch.chunk(n, N)`` splits it: shard rank
``r`` holds rows ``[r * c, min((r + 1) * c, n))`` with ``c = ceil(n / N)``, so trailing ranks may
hold fewer rows or none (n=5, N=3: 2, 2, 1 rows; n=1, N=3: 1, 0, 0). This is DTensor's
``Shard(0)`` layout, so a shard is exactly the local tensor of a DTensor with the parameter's
global shape. A parameter is kept *whole* on every rank when the shard group has one rank
(NO_SHARD) or it has no dim 0 (a 0-dim parameter); its gradient is then all-reduced over all
ranks instead of reduce-scattered. A whole parameter in its own dtype on the compute device is
*aliased*: the shard and the gathered parameter are the same tensor.

[Note: unsharded storage]
The gathered parameter is one ``nn.Parameter`` per `ShardedParam`, made at the first gather and
kept for the life of the unit, because autograd's AccumulateGrad node and every tensor saved for
backward refer to it. Resharding frees its memory with ``untyped_storage().resize_(0)``, which also
frees the views autograd saved (they share that storage). Gathering again for backward resizes the
same storage and copies the rows in, keeping the version counter (the values are the ones forward
saw), so the saved tensors are valid again. Gathering for a forward when no graph refers to the
old storage any more instead points the parameter at the gathered buffer (``.data =``): no copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.fsdp._topology import Topology

__all__ = ["ShardedParam", "Slot", "chunk_rows", "set_param"]

AVG = dist.ReduceOp.AVG
Pending = comm.Handle | torch.Tensor | None


class Slot(NamedTuple):
    """A place where a parameter is registered: ``module.<attr>``, named ``fqn`` in the unit."""

    fqn: str
    module: nn.Module
    attr: str


def chunk_rows(num_rows: int, num_shards: int) -> tuple[int, ...]:
    """Rows of each shard, as ``torch.chunk`` cuts them. See [Note: shard layout]."""
    chunk = math.ceil(num_rows / num_shards) if num_rows else 0
    return tuple(max(0, min(chunk, num_rows - r * chunk)) for r in range(num_shards))


def set_param(module: nn.Module, name: str, param: nn.Parameter) -> None:
    """Register ``param`` as ``module.<name>`` without nn.Module's checks (hot path), unless the
    module has its own ``__setattr__`` (RNNs keep a cache of their weights up to date there)."""
    if type(module).__setattr__ is nn.Module.__setattr__:
        module._parameters[name] = param
    else:
        setattr(module, name, param)


class ShardedParam:
    """A parameter of a unit: the shard this rank keeps and the gathered parameter compute uses.

    Args:
        slots: every place the parameter is registered (a shared parameter has several); the
            first one names it, e.g. ``"0.weight"`` under the unit's module.
        full: the original parameter's values (any device, meta included).
        requires_grad: whether the parameter is trained.
        topology: the unit's groups and compute device.
        storage_device: where the shard lives (the CPU with offload).
        param_dtype: dtype of the gathered parameter (mixed precision), None for its own.
    """

    def __init__(
        self,
        slots: list[Slot],
        full: torch.Tensor,
        *,
        requires_grad: bool,
        topology: Topology,
        storage_device: torch.device,
        param_dtype: torch.dtype | None,
    ) -> None:
        self.fqn = slots[0].fqn
        self.slots = slots
        self.shape = full.shape
        self.dtype = full.dtype
        self.topology = topology
        self.storage_device = storage_device
        self.param_dtype = param_dtype or full.dtype
        self.whole = topology.shard_size == 1 or full.dim() == 0
        self.aliased = (
            self.whole and self.param_dtype == full.dtype and storage_device == topology.device
        )
        self.row_shape = tuple(full.shape[1:])
        self.rows_per_rank = chunk_rows(full.shape[0] if full.dim() else 1, topology.shard_size)
        self.row_offset = sum(self.rows_per_rank[: topology.shard_rank])
        self.on_grad_ready: Callable[[ShardedParam], None] = lambda _: None
        self.grad_fresh = False  # a gradient arrived since the last reduction (aliased only)
        self.sharded = nn.Parameter(self._make_shard(full.detach()), requires_grad)
        self.sharded._shardkit_fsdp_shard = True  # type: ignore[attr-defined]
        self.unsharded: nn.Parameter | None = self.sharded if self.aliased else None
        self.is_unsharded = self.aliased
        self._gather: Pending = None
        self._reduce: Pending = None
        self._reduce_buffer: torch.Tensor | None = None
        self._hooked: nn.Parameter | None = None
        self.ensure_grad_hook()

    # ---- shards ---------------------------------------------------------------------------------

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of this rank's shard: ``[rows, *rest]``, or the parameter's own when whole."""
        if self.whole:
            return tuple(self.shape)
        return (self.rows_per_rank[self.topology.shard_rank], *self.row_shape)

    def local_rows(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full-shape tensor (a view)."""
        if self.whole:
            return full
        return full[self.row_offset : self.row_offset + self.local_shape[0]]

    def _make_shard(self, full: torch.Tensor) -> torch.Tensor:
        if full.is_meta:
            return torch.empty(self.local_shape, dtype=self.dtype, device="meta")
        if self.aliased:
            return full.to(self.storage_device)
        shard = torch.empty(self.local_shape, dtype=self.dtype, device=self.storage_device)
        if self.storage_device.type == "cpu" and self.topology.device.type == "cuda":
            shard = shard.pin_memory()
        return shard.copy_(self.local_rows(full))

    def set_shard_from_full(self, full: torch.Tensor) -> None:
        """Make a new shard from this rank's rows of ``full`` and register it in every slot
        (a meta tensor cannot take real storage in place)."""
        shard = nn.Parameter(self._make_shard(full.detach()), self.sharded.requires_grad)
        shard._shardkit_fsdp_shard = True  # type: ignore[attr-defined]
        self.sharded = shard
        for slot in self.slots:
            set_param(slot.module, slot.attr, shard)
        if self.aliased:
            self.unsharded = shard
            self.is_unsharded = True
            self.ensure_grad_hook()

    def full_value(self, source: torch.Tensor | None = None) -> torch.Tensor:
        """All-gather the shard (or ``source``, laid out like it) into the full shape.

        A collective for sharded parameters: every rank of the shard group must call it.
        """
        local = self.sharded.detach() if source is None else source.detach()
        if self.whole:
            return local
        full = comm.all_gather_into_tensor(
            local.to(self.topology.device),
            output_split_sizes=self.rows_per_rank,
            group=self.topology.shard_group,
        )
        assert isinstance(full, torch.Tensor)
        return full.view(self.shape)

    # ---- gathering ------------------------------------------------------------------------------

    def start_unshard(self) -> None:
        """Launch the all-gather of this parameter (asynchronous; no-op if gathered or pending)."""
        if self.is_unsharded or self._gather is not None:
            return
        local = self.sharded.detach().to(self.topology.device, non_blocking=True)
        local = local.to(self.param_dtype)
        if self.whole:
            self._gather = local
            return
        self._gather = comm.all_gather_into_tensor(
            local,
            output_split_sizes=self.rows_per_rank,
            group=self.topology.shard_group,
            async_op=True,
        )

    def finish_unshard(self, *, in_place: bool) -> None:
        """Wait for the gather and make `unsharded` hold it. See [Note: unsharded storage]."""
        if self.is_unsharded:
            return
        self.start_unshard()
        pending, self._gather = self._gather, None
        full = pending if isinstance(pending, torch.Tensor) else pending.wait()
        full = full.view(self.shape)
        if self.unsharded is None:
            self.unsharded = nn.Parameter(full, self.sharded.requires_grad)
        elif in_place:
            storage = self.unsharded.untyped_storage()
            storage.resize_(full.numel() * full.element_size())
            with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(self.unsharded):
                self.unsharded.copy_(full)
        else:
            self.unsharded.data = full
        if self.unsharded.requires_grad != self.sharded.requires_grad:
            self.unsharded.requires_grad_(self.sharded.requires_grad)
        self.ensure_grad_hook()
        self.is_unsharded = True

    def ensure_grad_hook(self) -> None:
        """Have autograd report when the gathered parameter's gradient is accumulated (once per
        parameter, and only once it requires grad: frozen parameters get none)."""
        param = self.unsharded
        if param is not None and param.requires_grad and self._hooked is not param:
            param.register_post_accumulate_grad_hook(self._grad_ready)
            self._hooked = param

    def free(self) -> None:
        """Free the gathered parameter's memory (and drop a prefetch that was never used)."""
        if self._gather is not None:
            pending, self._gather = self._gather, None
            if not isinstance(pending, torch.Tensor):
                pending.wait()  # issued on every rank already; let it finish
        if self.aliased or not self.is_unsharded:
            return
        assert self.unsharded is not None
        self.unsharded.untyped_storage().resize_(0)
        self.is_unsharded = False

    # ---- gradients ------------------------------------------------------------------------------

    def _grad_ready(self, _param: torch.Tensor) -> None:
        self.grad_fresh = True
        self.on_grad_ready(self)

    def has_new_grad(self) -> bool:
        """Whether a gradient arrived that has not been reduced yet."""
        if self.aliased:
            return self.grad_fresh and self.sharded.grad is not None
        return self.unsharded is not None and self.unsharded.grad is not None

    def start_reduce(self, reduce_dtype: torch.dtype | None) -> None:
        """Launch the average of this parameter's gradient over all ranks (asynchronous)."""
        if self.aliased:
            grad = self.sharded.grad
            self.grad_fresh = False
        else:
            assert self.unsharded is not None
            grad, self.unsharded.grad = self.unsharded.grad, None
        if grad is None:
            return
        buffer = grad if reduce_dtype in (None, grad.dtype) else grad.to(reduce_dtype)
        if self.whole:
            self._reduce_buffer = buffer
            group = self.topology.world_group
            if dist.get_world_size(group) > 1:
                self._reduce = comm.all_reduce(
                    buffer, op=AVG, group=group, async_op=True, inplace=True
                )
            else:
                self._reduce = buffer
            return
        self._reduce = comm.reduce_scatter_tensor(
            buffer,
            op=AVG,
            input_split_sizes=self.rows_per_rank,
            group=self.topology.shard_group,
            async_op=True,
        )

    def finish_reduce(self) -> None:
        """Wait for the reduction and add the result to the shard's ``.grad``."""
        pending, self._reduce = self._reduce, None
        if pending is None:
            return
        reduced = pending if isinstance(pending, torch.Tensor) else pending.wait()
        self._reduce_buffer = None
        if self.aliased:
            grad = self.sharded.grad
            assert grad is not None
            if reduced is not grad:
                grad.copy_(reduced)
            return
        if not self.whole and self.topology.replicate_group is not None:
            comm.all_reduce(reduced, op=AVG, group=self.topology.replicate_group, inplace=True)
        reduced = reduced.to(device=self.sharded.device, dtype=self.sharded.dtype)
        if self.sharded.grad is None:
            self.sharded.grad = reduced.view(self.sharded.shape)
        else:
            self.sharded.grad += reduced.view(self.sharded.shape)
