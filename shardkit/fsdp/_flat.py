"""A unit's sharded parameters of one dtype, gathered and reduced with one collective each.

[Note: flat buckets]
The shards of a unit's sharded parameters (see [Note: shard layout]) are views into one flat
buffer per rank, ``[S]``, where ``S`` is the largest shard total over the ranks (the smaller ones
end in padding), so one all-gather with equal sizes gives ``[N_ranks, S]``, rank-major. Copying
each parameter's rows out of it gives the unsharded parameters, which are views into one flat
``[numel]`` buffer, parameter-major; freeing the unit frees that one buffer (see
[Note: unsharded storage]). Gradients go the other way: each parameter's gradient is copied into
its place in a ``[N_ranks, S]`` buffer (in the reduce dtype), one reduce-scatter with AVG leaves
``[S]`` on each rank, and each shard's gradient is a view into it. Parameters without a gradient
(on every rank alike) get none. One collective per unit instead of one per parameter, and
unit-sized buffers rather than many parameter-sized ones: large buffers are mapped and returned
to the operating system as a whole when freed, where many medium-sized ones would fragment the
heap (glibc cannot reuse a freed block for an aligned allocation of the same size).

Example: parameters ``a`` [5, 2] and ``b`` [3] over 2 ranks: rows 3+2 and 2+1, so rank 0 holds
a[0:3], b[0:2] (8 elements) and rank 1 a[3:5], b[2:3] (5 elements, padded to ``S = 8``).

[Note: direct parameters]
Rank-major is not parameter-major, so the one all-gather above costs a copy of the whole unit
into freshly mapped memory, and the reduction another copy the other way. A parameter whose rows
split equally over the ranks needs neither: gathering its rows from every rank in rank order *is*
the parameter, and reduce-scattering its gradient leaves exactly this rank's rows. So such a
parameter, when it is large (`_layout`'s ``DIRECT_MIN_NUMEL``; a collective has a fixed cost), sits after the
others in the flat shard, at the same offset on every rank, and has collectives of its own: the
all-gather writes straight into its place in the unsharded buffer and the reduce-scatter takes
its gradient as it is and writes into its place in the shard's gradient buffer, whose views
become the shards' ``.grad`` (see `shardkit.comm`'s [Note: out buffers]). The other parameters
(small or uneven: biases, norms) go together through the packed region at the start, as above.
Which parameters are direct depends only on shapes, so every rank issues the same collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.fsdp._layout import is_direct, shard_offsets
from shardkit.fsdp._memory import UNSHARDED_POOL, BufferPool, advise_huge_pages
from shardkit.fsdp._mesh_info import MeshInfo
from shardkit.fsdp._param import ShardedParam

__all__ = ["FlatBucket"]

AVG = dist.ReduceOp.AVG


class FlatBucket:
    """The sharded (not whole) parameters of one unit that share a dtype. See [Note: flat buckets].

    Args:
        params: the parameters, in the unit's order.
        mesh_info: the unit's groups and compute device.
        storage_device: where the flat shard lives (the CPU with offload).
        meta: allocate the shard on the meta device (the module is not materialised yet).
        pin_memory: pin a CPU shard that a GPU gathers from.
    """

    def __init__(
        self,
        params: list[ShardedParam],
        mesh_info: MeshInfo,
        storage_device: torch.device,
        *,
        meta: bool,
        pin_memory: bool = True,
    ) -> None:
        self.params = params
        self.pin_memory = pin_memory
        self.mesh_info = mesh_info
        self.storage_device = storage_device
        self.dtype = params[0].dtype
        self.param_dtype = params[0].param_dtype
        num_ranks = mesh_info.shard_size
        self.direct = [is_direct(p, num_ranks) for p in params]
        self.offsets, self.packed_numel, self.shard_numel = shard_offsets(
            params, self.direct, num_ranks
        )
        # parameters whose rows sit at the same place in every rank's shard move in one copy
        self.uniform = [
            len({p.rows_per_rank[k] for k in range(mesh_info.shard_size)}) == 1
            and len({starts[i] for starts in self.offsets}) == 1
            for i, p in enumerate(params)
        ]
        sizes = [param.shape.numel() for param in params]
        self.full_offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.full_numel = sum(sizes)
        device = torch.device("meta") if meta else storage_device
        self.flat_shard = self._new_shard(device)
        self.flat_full: torch.Tensor | None = None
        self._gather: list[comm.Handle] | None = None  # the packed region's first, if any
        self._gathered_version = -1
        self._full_version = 0  # of flat_full, when its gathers were launched
        self._reduce: list[comm.Handle] | None = None
        self._reduce_buffer: torch.Tensor | None = None  # the packed region's, rank-major
        self._reduce_inputs: list[torch.Tensor] = []  # kept alive until the reduction is done
        self._reduce_out: torch.Tensor | None = None
        self._reduced: list[bool] = []

    def _new_shard(self, device: torch.device) -> torch.Tensor:
        shard = torch.zeros(self.shard_numel, dtype=self.dtype, device=device)
        if self.pin_memory and device.type == "cpu" and self.mesh_info.device.type == "cuda":
            shard = shard.pin_memory()
        return shard

    def shard_view(self, index: int) -> torch.Tensor:
        """Parameter ``index``'s rows of this rank, a view into the flat shard."""
        param = self.params[index]
        start = self.offsets[self.mesh_info.shard_rank][index]
        numel = param.local_shape[0] * param.row_numel
        return self.flat_shard[start : start + numel].view(param.local_shape)

    def load(self, index: int, full: torch.Tensor) -> None:
        """Put this rank's rows of ``full`` into parameter ``index``'s shard (and make the flat
        shard real if it was on the meta device)."""
        if self.flat_shard.is_meta and not full.is_meta:
            self.flat_shard = self._new_shard(self.storage_device)
        view = self.shard_view(index)
        if not full.is_meta:
            with torch.no_grad():
                view.copy_(self.params[index].local_rows(full))
        self.params[index].set_shard(view)

    def adopt(self, index: int, local: torch.Tensor) -> None:
        """Parameter ``index``'s registered shard was given a new tensor (``module.to_empty``,
        ``module.to``): copy it into the flat shard and point the shard back at its view."""
        if self.flat_shard.is_meta and not local.is_meta:
            self.flat_shard = self._new_shard(self.storage_device)
        view = self.shard_view(index)
        if not local.is_meta:
            with torch.no_grad():
                view.copy_(local)
        self.params[index].repoint(view)

    # ---- gathering ------------------------------------------------------------------------------

    @property
    def is_unsharded(self) -> bool:
        storage = None if self.flat_full is None else self.flat_full.untyped_storage()
        return self._gather is not None or (storage is not None and storage.nbytes() > 0)

    def is_stale(self) -> bool:
        """Gathered before the shard last changed. See [Note: unsharded storage]."""
        return (
            self._gather is None
            and self.is_unsharded
            and self.flat_shard._version != self._gathered_version
        )

    def mark_stale(self) -> None:
        if self._gather is None and self.is_unsharded:
            self._gathered_version = -2

    def start_unshard(self) -> None:
        """Launch the all-gathers of the flat shard (asynchronous; no-op if gathered or pending):
        the packed region's, and each direct parameter's straight into the unsharded buffer."""
        if self._gather is not None or self.is_unsharded:
            return
        self._gathered_version = self.flat_shard._version
        local = self.flat_shard.to(self.mesh_info.device, non_blocking=True).to(self.param_dtype)
        first = self._alloc_full()
        assert self.flat_full is not None
        self._full_version = self.flat_full._version
        group, handles = self.mesh_info.shard_group, []
        if not all(self.direct):
            packed = local[: self.packed_numel]
            handles.append(comm.all_gather_into_tensor(packed, group=group, async_op=True))
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(self.flat_full):
            for index in (i for i, alone in enumerate(self.direct) if alone):
                start, numel = self.offsets[0][index], self._local_numel(index)
                full = self.full_offsets[index]
                out = self.flat_full[full : full + numel * self.mesh_info.shard_size]
                src = local[start : start + numel]
                handles.append(
                    comm.all_gather_into_tensor(src, group=group, async_op=True, out=out)
                )
        self._gather = handles  # type: ignore[assignment]  # Handles: async_op=True
        if first:
            self._make_unsharded_params()

    def _wait_gathers(self, handles: list[comm.Handle]) -> None:
        """Wait for the gathers. gloo gathers into a buffer of its own and copies the result
        into ``out`` on its worker thread, which bumps the version counter autograd checks:
        put it back (see [Note: unsharded storage])."""
        for handle in handles:
            handle.wait()
        assert self.flat_full is not None
        torch._C._autograd._unsafe_set_version_counter((self.flat_full,), (self._full_version,))

    def _alloc_full(self) -> bool:
        """Give the unsharded buffer its memory (the same storage every time, see
        [Note: unsharded storage]); True the first time."""
        first = self.flat_full is None
        if first:
            self.flat_full = torch.empty(
                self.full_numel, dtype=self.param_dtype, device=self.mesh_info.device
            )
            advise_huge_pages(self.flat_full)  # See [Note: returning memory]
        else:  # See [Note: unsharded memory pool]
            assert self.flat_full is not None
            nbytes = self.full_numel * self.flat_full.element_size()
            if not UNSHARDED_POOL.acquire(self.flat_full, nbytes):
                advise_huge_pages(self.flat_full)
        return first

    def _local_numel(self, index: int) -> int:
        return self.params[index].local_shape[0] * self.params[index].row_numel

    def finish_unshard(self) -> None:
        """Wait for the gathers and copy each packed parameter's rows into its place."""
        if self._gather is None and self.is_unsharded:
            return
        self.start_unshard()
        handles = self._gather
        assert handles is not None
        self._gather = None
        self._wait_gathers(handles)
        if not all(self.direct):
            gathered = handles[0].wait().view(self.mesh_info.shard_size, self.packed_numel)
            assert self.flat_full is not None
            with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(self.flat_full):
                for index in (i for i, alone in enumerate(self.direct) if not alone):
                    self._copy_rows_out(index, gathered)
        for param in self.params:
            param.sync_requires_grad()
            param.is_unsharded = True

    def _copy_rows_out(self, index: int, gathered: torch.Tensor) -> None:
        """Rows of parameter ``index`` from every rank's region into its place in flat_full."""
        param = self.params[index]
        assert self.flat_full is not None
        start = self.full_offsets[index]
        rows = param.rows_per_rank
        width = param.row_numel
        if self.uniform[index]:  # one strided copy
            source = gathered[:, self.offsets[0][index] : self.offsets[0][index] + rows[0] * width]
            target = self.flat_full[start : start + len(rows) * rows[0] * width]
            target.view(len(rows), rows[0] * width).copy_(source)
            return
        for rank, count in enumerate(rows):
            if count:
                begin = self.offsets[rank][index]
                self.flat_full[start : start + count * width].copy_(
                    gathered[rank, begin : begin + count * width]
                )
            start += count * width

    def _make_unsharded_params(self) -> None:
        assert self.flat_full is not None
        for param, start in zip(self.params, self.full_offsets):
            view = self.flat_full[start : start + param.shape.numel()].view(param.shape)
            param.unsharded = nn.Parameter(view, param.requires_grad)

    def free(self, *, keep_memory: bool = False) -> None:
        """Free the gathered parameters (one buffer), dropping a prefetch that was not used;
        ``keep_memory``: hand the memory to the pool. See [Note: unsharded memory pool]."""
        if self._gather is not None:  # issued on every rank already; let them finish
            self._wait_gathers(self._gather)
            self._gather = None
        if self.flat_full is not None:
            if keep_memory:
                UNSHARDED_POOL.release(self.flat_full)
            else:
                self.flat_full.untyped_storage().resize_(0)
        for param in self.params:
            param.is_unsharded = False

    # ---- gradients ------------------------------------------------------------------------------

    def has_new_grads(self) -> bool:
        return any(p.has_new_grad() for p in self.params)

    def start_reduce(self, reduce_dtype: torch.dtype | None, pool: BufferPool) -> None:
        """Launch the AVG reduce-scatters into one new ``[S]`` gradient buffer: the packed
        gradients copied into rank-major order first, each direct one as it is.
        See [Note: direct parameters]."""
        self._reduced = [p.has_new_grad() for p in self.params]
        if not any(self._reduced):
            return
        dtype, device = reduce_dtype or self.param_dtype, self.mesh_info.device
        out = torch.empty(self.shard_numel, dtype=dtype, device=device)
        advise_huge_pages(out)
        handles = []
        if not all(self.direct):
            handles.append(self._reduce_packed(out, dtype, pool))
        for index in (i for i, alone in enumerate(self.direct) if alone):
            grad = self.params[index].take_grad() if self._reduced[index] else None
            if grad is None and not self.params[index].requires_grad:
                continue  # frozen on every rank: no collective
            numel = self._local_numel(index)
            if grad is None:  # used on another rank only: take part with zeros
                grad = torch.zeros(numel * self.mesh_info.shard_size, device=device)
            flat = grad.reshape(-1).to(dtype).contiguous()
            self._reduce_inputs.append(flat)  # the backend reads it until the wait
            start = self.offsets[0][index]
            handles.append(self._reduce_scatter(flat, out[start : start + numel]))
        self._reduce = handles
        self._reduce_out = out

    def _reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor) -> comm.Handle:
        handle = comm.reduce_scatter_tensor(
            flat,
            op=AVG,
            group=self.mesh_info.shard_group,
            async_op=True,
            via_all_to_all=False,  # memory first: no receive buffer of the unit's size on gloo
            out=out,
        )
        assert isinstance(handle, comm.Handle)
        return handle

    def _reduce_packed(
        self, out: torch.Tensor, dtype: torch.dtype, pool: BufferPool
    ) -> comm.Handle:
        shape = (self.mesh_info.shard_size, self.packed_numel)
        buffer = pool.take(shape, dtype, self.mesh_info.device)
        self._reduce_buffer = buffer
        packed = [i for i, alone in enumerate(self.direct) if not alone]
        if not all(self._reduced[i] for i in packed) or self._has_padding():
            buffer.zero_()
        for index in packed:
            grad = self.params[index].take_grad() if self._reduced[index] else None
            if grad is not None:
                self._copy_rows_in(index, grad, buffer)
        return self._reduce_scatter(buffer.view(-1), out[: self.packed_numel])

    def _has_padding(self) -> bool:
        return any(
            sum(p.rows_per_rank[k] * p.row_numel for p, d in zip(self.params, self.direct) if not d)
            != self.packed_numel
            for k in range(self.mesh_info.shard_size)
        )

    def _copy_rows_in(self, index: int, grad: torch.Tensor, buffer: torch.Tensor) -> None:
        param = self.params[index]
        rows, width = param.rows_per_rank, param.row_numel
        flat = grad.reshape(-1)
        if self.uniform[index]:
            begin = self.offsets[0][index]
            target = buffer[:, begin : begin + rows[0] * width]
            target.copy_(flat.view(len(rows), rows[0] * width))
            return
        start = 0
        for rank, count in enumerate(rows):
            begin = self.offsets[rank][index]
            buffer[rank, begin : begin + count * width].copy_(flat[start : start + count * width])
            start += count * width

    def finish_reduce(self, pool: BufferPool) -> int:
        """Wait for the reductions (and the replicas' all-reduce) and add the shards' gradients.
        Returns the bytes of the direct parameters' gradients this releases."""
        if self._reduce is None:
            return 0
        for handle in self._reduce:
            handle.wait()
        self._reduce = None
        released = sum(t.numel() * t.element_size() for t in self._reduce_inputs)
        self._reduce_inputs = []
        reduced, self._reduce_out = self._reduce_out, None
        assert reduced is not None
        if self._reduce_buffer is not None:
            pool.give_back(self._reduce_buffer)
            self._reduce_buffer = None
        if self.mesh_info.replicate_group is not None:
            comm.all_reduce(reduced, op=AVG, group=self.mesh_info.replicate_group, inplace=True)
        reduced = reduced.to(device=self.storage_device, dtype=self.dtype)
        rank = self.mesh_info.shard_rank
        for index, param in enumerate(self.params):
            if self._reduced[index]:
                start = self.offsets[rank][index]
                param.add_grad(reduced[start : start + self._local_numel(index)])
        return released
