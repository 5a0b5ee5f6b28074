"""One parameter of a unit: where its shard lives, its gathered form, and whole-parameter handling.

[Note: shard layout]
A parameter of shape ``[n, *rest]`` is split the way ``torch.chunk(n, N)`` splits it: shard rank
``r`` holds rows ``[r * c, min((r + 1) * c, n))`` with ``c = ceil(n / N)``, so trailing ranks may
hold fewer rows or none (n=5, N=3: 2, 2, 1 rows; n=1, N=3: 1, 0, 0). This is DTensor's
``Shard(0)`` layout, so a shard is exactly the local tensor of a DTensor with the parameter's
global shape. The rows live in the unit's flat shard buffer (see [Note: flat buckets]).
A parameter is kept *whole* on every rank when the shard group has one rank (NO_SHARD) or it has
no dim 0 (a 0-dim parameter); its gradient is then all-reduced (placement ``Replicate()``).
A whole parameter in its own dtype on the compute device *shares storage* with its gathered form.

[Note: DTensor parameters]
``fully_shard`` registers each shard as FSDP2 does: an ``nn.Parameter`` holding a DTensor with the
parameter's global shape on the unit's mesh (``Shard(0)``; ``Replicate(), Shard(0)`` on a 2-D
mesh), whose local tensor is this rank's rows (a view of the flat shard). Its gradient is a
DTensor too. So torch's own DTensor-aware code gives the unsharded model's answer: gradient
clipping sums the norm over ranks, ``state_dict()`` is sharded, ``full_tensor()`` gathers, and
optimizers do their arithmetic on the local tensors. The FSDP1 wrapper keeps plain parameters
holding the local rows (as torch's FSDP1 does), with its own ``clip_grad_norm_`` and state-dict
types. Everything inside shardkit works on the local tensor (`local_of`), in both cases.

[Note: unsharded storage]
The gathered parameter is a plain ``nn.Parameter`` made at the first gather and kept for the life
of the unit, because autograd's AccumulateGrad node and every tensor saved for backward refer to
it. Resharding frees its memory with ``untyped_storage().resize_(0)``, which also frees the views
autograd saved (they share the storage). Gathering again resizes the same storage and copies the
values in without bumping the version counter, so tensors saved in forward are valid again when
backward needs them. A unit gathered outside an iteration (``set_reshard_after_backward(False)``,
``unshard()``) is stale once its shards change: every optimizer step marks such gathers stale (a
global step post-hook), and a gather records the shard's version counter for other in-place
changes of plain shards (DTensor operations run below autograd and do not bump it); the next
use gathers again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.compat import is_dtensor
from shardkit.fsdp._mesh_info import MeshInfo

__all__ = ["ShardedParam", "Slot", "chunk_rows", "copy_into_storage", "local_of", "set_param"]

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


def local_of(tensor: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor; a plain tensor itself. See [Note: DTensor parameters]."""
    return tensor._local_tensor if is_dtensor(tensor) else tensor


def set_param(module: nn.Module, name: str, param: torch.Tensor) -> None:
    """Register ``param`` as ``module.<name>`` without nn.Module's checks (hot path), unless the
    module has its own ``__setattr__`` (RNNs keep a cache of their weights up to date there)."""
    if type(module).__setattr__ is nn.Module.__setattr__:
        module._parameters[name] = param  # type: ignore[assignment]
    else:
        setattr(module, name, param)


def copy_into_storage(target: torch.Tensor, values: torch.Tensor) -> None:
    """Give ``target``'s (freed) storage its size back and fill it with ``values``, keeping the
    version counter. See [Note: unsharded storage]."""
    storage = target.untyped_storage()
    needed = (target.storage_offset() + target.numel()) * target.element_size()
    if storage.nbytes() < needed:
        storage.resize_(needed)  # type: ignore[arg-type]  # a SymInt only under tracing
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(target):
        target.copy_(values)


def contiguous_stride(shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    stride, out = 1, []
    for size in reversed(shape):
        out.append(stride)
        stride *= size
    return tuple(reversed(out))


class ShardedParam:
    """A parameter of a unit: the shard this rank keeps and the gathered parameter compute uses.

    Args:
        slots: every place the parameter is registered (a shared parameter has several); the
            first one names it, e.g. ``"0.weight"`` under the unit's module.
        shape, dtype: the parameter's.
        requires_grad: whether it is trained.
        mesh_info: the unit's groups, mesh and compute device.
        storage_device: where the shard lives (the CPU with offload).
        param_dtype: dtype of the gathered parameter (mixed precision), None for its own.
        dtensor: register the shard as a DTensor (``fully_shard``) rather than a plain tensor.
    """

    def __init__(
        self,
        slots: list[Slot],
        shape: torch.Size,
        dtype: torch.dtype,
        *,
        requires_grad: bool,
        mesh_info: MeshInfo,
        storage_device: torch.device,
        param_dtype: torch.dtype | None,
        dtensor: bool = False,
    ) -> None:
        self.fqn = slots[0].fqn
        self.slots = slots
        self.shape = shape
        self.dtype = dtype
        self.requires_grad = requires_grad
        self.mesh_info = mesh_info
        self.storage_device = storage_device
        self.param_dtype = param_dtype or dtype
        self.dtensor = dtensor
        self.whole = mesh_info.shard_size == 1 or len(shape) == 0
        self.shares_storage = (
            self.whole and self.param_dtype == dtype and storage_device == mesh_info.device
        )
        self.aliased = self.shares_storage and not dtensor  # shard and gathered: one Parameter
        self.row_shape = tuple(shape[1:])
        self.row_numel = math.prod(self.row_shape)
        self.rows_per_rank = chunk_rows(shape[0] if len(shape) else 1, mesh_info.shard_size)
        self.row_offset = sum(self.rows_per_rank[: mesh_info.shard_rank])
        self.on_grad_ready: Callable[[ShardedParam], None] = lambda _: None
        self.grad_fresh = False  # a gradient arrived since the last reduction (aliased only)
        self.sharded: nn.Parameter = nn.Parameter(torch.empty(0, device="meta"), requires_grad)
        self.unsharded: nn.Parameter | None = None
        self.is_unsharded = False
        self.accumulated: torch.Tensor | None = None  # unreduced gradients, in the reduce dtype
        self._gather: Pending = None
        self._gathered_version = -1
        self._reduce: Pending = None
        self._reduce_later: list[dist.ProcessGroup] = []
        self._hooked: nn.Parameter | None = None

    # ---- shards ---------------------------------------------------------------------------------

    @property
    def local(self) -> torch.Tensor:
        """This rank's rows (the shard's local tensor)."""
        return local_of(self.sharded)

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of this rank's shard: ``[rows, *rest]``, or the parameter's own when whole."""
        if self.whole:
            return tuple(self.shape)
        return (self.rows_per_rank[self.mesh_info.shard_rank], *self.row_shape)

    def local_rows(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full-shape tensor (a view)."""
        if self.whole:
            return full
        return full[self.row_offset : self.row_offset + self.local_shape[0]]

    def wrap(self, local: torch.Tensor) -> torch.Tensor:
        """``local`` (laid out like the shard) as a DTensor with the parameter's global shape."""
        from torch.distributed.tensor import DTensor, Replicate  # See [Note: DTensor on demand]

        mesh, placements = self.mesh_info.mesh_and_placements
        if self.whole:  # every rank holds all of it (see [Note: shard layout])
            placements = tuple(Replicate() for _ in placements)
        return DTensor.from_local(
            local,
            mesh,
            placements,
            run_check=False,
            shape=self.shape,
            stride=contiguous_stride(self.shape),
        )

    def set_shard(self, shard: torch.Tensor) -> None:
        """Make ``shard`` (a tensor of `local_shape`) the parameter every slot holds."""
        value = self.wrap(shard) if self.dtensor else shard
        param = nn.Parameter(value, self.requires_grad)
        param._shardkit_fsdp_shard = True  # type: ignore[attr-defined]
        self.sharded = param
        for slot in self.slots:
            set_param(slot.module, slot.attr, param)
        self.unsharded, self.is_unsharded = None, False
        if self.aliased:
            self.unsharded, self.is_unsharded = param, True
            self.ensure_grad_hook()

    def repoint(self, local: torch.Tensor) -> None:
        """Make the registered shard (the same Parameter object) hold ``local``."""
        if is_dtensor(self.sharded):
            self.sharded._local_tensor = local
        else:
            self.sharded.data = local

    def make_whole_shard(self, full: torch.Tensor) -> torch.Tensor:
        """The shard of a whole parameter: ``full`` itself (shared storage) or a copy on the
        storage device. Sharded parameters get theirs from the unit's flat bucket instead."""
        assert self.whole
        if full.is_meta or self.shares_storage:
            return full.to(self.storage_device) if not full.is_meta else full
        return full.to(self.storage_device, copy=True)

    def full_value(self, source: torch.Tensor | None = None) -> torch.Tensor:
        """All-gather the shard (or ``source``, laid out like it) into the full shape.

        A collective for sharded parameters: every rank of the shard group must call it.
        """
        local = local_of(self.sharded if source is None else source).detach()
        if self.whole:
            return local
        full = comm.all_gather_into_tensor(
            local.to(self.mesh_info.device),
            output_split_sizes=self.rows_per_rank,
            group=self.mesh_info.shard_group,
        )
        assert isinstance(full, torch.Tensor)
        return full.view(self.shape)

    # ---- gradients ------------------------------------------------------------------------------

    def ensure_grad_hook(self) -> None:
        """Have autograd report when the gathered parameter's gradient is accumulated (once per
        parameter, and only once it requires grad: frozen parameters get none)."""
        param = self.unsharded
        if param is not None and param.requires_grad and self._hooked is not param:
            param.register_post_accumulate_grad_hook(self._grad_ready)
            self._hooked = param

    def _grad_ready(self, _param: torch.Tensor) -> None:
        self.grad_fresh = True
        self.on_grad_ready(self)

    def has_new_grad(self) -> bool:
        """Whether a gradient arrived that has not been reduced yet."""
        if self.aliased:
            return self.grad_fresh and self.sharded.grad is not None
        if self.accumulated is not None:
            return True
        return self.unsharded is not None and self.unsharded.grad is not None

    def take_grad(self) -> torch.Tensor | None:
        """The unreduced gradient (accumulated ones added), removed from the gathered
        parameter so that the next backward starts afresh."""
        grad = None
        if self.unsharded is not None:
            grad, self.unsharded.grad = self.unsharded.grad, None
        accumulated, self.accumulated = self.accumulated, None
        if accumulated is None:
            return grad
        return accumulated if grad is None else accumulated.add_(grad)

    def stash_grad(self, reduce_dtype: torch.dtype | None) -> None:
        """Without reduction (gradient accumulation), keep the sum of gradients in the reduce
        dtype, as FSDP2 does: bf16 gradients of several micro-batches add up in float32."""
        if self.aliased or self.unsharded is None or self.unsharded.grad is None:
            return
        if reduce_dtype is None or self.unsharded.grad.dtype == reduce_dtype:
            return  # autograd keeps adding into .grad
        grad, self.unsharded.grad = self.unsharded.grad, None
        if self.accumulated is None:
            self.accumulated = grad.to(reduce_dtype)
        else:
            self.accumulated.add_(grad)

    def add_grad(self, reduced: torch.Tensor) -> None:
        """Add a reduced gradient (laid out like the shard) to the shard's ``.grad``."""
        reduced = reduced.to(device=self.storage_device, dtype=self.dtype)
        reduced = reduced.view(self.local_shape)
        if self.sharded.grad is None:
            self.sharded.grad = self.wrap(reduced) if self.dtensor else reduced
        else:
            local_of(self.sharded.grad).add_(reduced)

    def sync_requires_grad(self) -> None:
        """Follow ``requires_grad_`` calls made on the shard since the last gather."""
        self.requires_grad = self.sharded.requires_grad
        if self.unsharded is not None and self.unsharded.requires_grad != self.requires_grad:
            self.unsharded.requires_grad_(self.requires_grad)
        self.ensure_grad_hook()

    # ---- whole parameters: a cast/copy instead of a gather, an all-reduce instead of a
    # ---- reduce-scatter (sharded parameters are handled by their unit's FlatBucket)

    def is_stale(self) -> bool:
        """Gathered (by a copy) before the shard last changed. See [Note: unsharded storage]."""
        return (
            self.is_unsharded
            and not self.shares_storage
            and self.local._version != self._gathered_version
        )

    def mark_stale(self) -> None:
        if self.is_unsharded:
            self._gathered_version = -2

    def start_unshard_whole(self) -> None:
        if self.is_unsharded or self._gather is not None or self.shares_storage:
            return
        local = self.local.detach().to(self.mesh_info.device, non_blocking=True)
        self._gather = local.to(self.param_dtype)
        self._gathered_version = self.local._version

    def finish_unshard_whole(self) -> None:
        if self.is_unsharded:
            return
        if self.shares_storage:  # a plain Parameter on the shard's storage (DTensor shards)
            local = self.local
            same = self.unsharded is not None and self.unsharded.data_ptr() == local.data_ptr()
            if not same:
                self.unsharded = nn.Parameter(local.detach(), self.requires_grad)
        else:
            self.start_unshard_whole()
            full, self._gather = self._gather, None
            assert isinstance(full, torch.Tensor)
            if self.unsharded is None:
                self.unsharded = nn.Parameter(full, self.requires_grad)
            else:
                copy_into_storage(self.unsharded, full)
        self.sync_requires_grad()
        self.is_unsharded = True

    def free_whole(self) -> None:
        self._gather = None
        if self.shares_storage or not self.is_unsharded:
            self.is_unsharded = self.aliased
            return
        assert self.unsharded is not None
        self.unsharded.untyped_storage().resize_(0)
        self.is_unsharded = False

    def start_reduce_whole(self, reduce_dtype: torch.dtype | None) -> None:
        """Launch the average of the gradient over the shard group, then (when waited for) over
        the replicate group: every rank that holds the parameter (asynchronous)."""
        if self.aliased:
            grad = self.sharded.grad
            self.grad_fresh = False
        else:
            grad = self.take_grad()
        if grad is None:
            return
        buffer = grad if reduce_dtype in (None, grad.dtype) else grad.to(reduce_dtype)
        info = self.mesh_info
        groups = [
            group
            for group in (info.shard_group, info.replicate_group)
            if group is not None and dist.get_world_size(group) > 1
        ]
        if not groups:
            self._reduce = buffer
            return
        self._reduce_later = groups[1:]
        self._reduce = comm.all_reduce(buffer, op=AVG, group=groups[0], async_op=True, inplace=True)

    def finish_reduce_whole(self) -> None:
        pending, self._reduce = self._reduce, None
        if pending is None:
            return
        reduced = pending if isinstance(pending, torch.Tensor) else pending.wait()
        for group in self._reduce_later:
            comm.all_reduce(reduced, op=AVG, group=group, inplace=True)
        self._reduce_later = []
        if self.aliased:
            grad = self.sharded.grad
            assert grad is not None
            if reduced is not grad:
                grad.copy_(reduced)
            return
        self.add_grad(reduced)
