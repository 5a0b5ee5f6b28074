"""Giving freed host memory back to the operating system.

[Note: returning memory]
On the CPU, a freed tensor goes back to glibc's heap, not to the operating system, and glibc
cannot reuse a freed block for the next 64-byte-aligned allocation of the same size (torch's CPU
allocator aligns), so a backward that allocates and frees each layer's weight gradients in turn
keeps growing the heap: hundreds of MB of free but resident memory on a 100 M-parameter model.
Unit-sized buffers (see [Note: flat buckets]) are large enough to be mapped and unmapped as a
whole; for the rest, ``malloc_trim(0)`` hands the free pages back, so the resident set follows
what the ranks really hold. Trimming has a price: a call walks the whole heap, and pages handed
back fault in again when reused (the next forward's activations among them). So backward trims
once the gradients it released since the last trim reach ``TRIM_BUDGET_BYTES`` (every other
block of the 100 M-parameter benchmark), counting across iterations: the heap never holds much
more than that budget of free memory, at a fraction of the cost of trimming after every unit.
It does not also trim at the end of every backward: on seed 004's 1.2 M-parameter CNN that trim
cost more than a tenth of the step (0.236-0.267 s against 0.190-0.202 s without it, 2 ranks on a
Zen 3 EPYC, `bench_fsdp.py --model cnn`; peak RSS 0.40 -> 0.42 GB, torch FSDP1's 0.42-0.43),
half of it the call itself and half the next step's convolutions faulting their buffers in
again. It is skipped where there is no glibc, and for units computing on a GPU (the CUDA caching
allocator manages device memory).

Writing into freshly mapped memory costs a page fault per 4 KiB page, four times the cost of the
copy itself for a 32 MiB buffer here. The buffers shardkit fills itself (gathered parameters,
gradients in reduction order) are marked ``MADV_HUGEPAGE`` before the first write, so the kernel
maps them in 2 MiB pages where it can (about half the cost), and the reduction buffers of one
backward are reused from unit to unit instead of being mapped anew.

[Note: unsharded memory pool]
The gathered parameters of a unit are freed after each use and gathered again into the same storage
(see [Note: unsharded storage]); with plain ``resize_`` every gather maps fresh memory and faults
in every page of it, twice per unit per step. Instead, freeing after forward hands the storage's
memory to `UNSHARDED_POOL` (its data pointer moves to a storage the pool owns, which no tensor
views, so nothing live aliases it), and the next gather of a unit of the same size takes it back
into its own storage: forward's gathers, and backward's first ones, reuse the memory of the units
forward freed. Backward frees as before (its prefetch allocates before the unit it follows frees,
so a pooled buffer would sit idle through the next unit's gradients, when memory peaks). The pool
keeps at most ``UNSHARDED_POOL_ENTRIES`` buffers (beyond that, freeing returns the memory as
before), and is emptied when a backward ends, so that it adds nothing to the optimizer step's
memory: the first gathers of the next forward map fresh memory, the rest of the iteration reuses
it. CPU only (the CUDA caching allocator does this on a GPU), and only where torch can move a
storage's memory (``_swap_data_ptr_``).
"""

from __future__ import annotations

import ctypes

import torch

from shardkit.compat import glibc_function, madvise_huge_pages

__all__ = [
    "TRIM_BUDGET_BYTES",
    "UNSHARDED_POOL",
    "UNSHARDED_POOL_ENTRIES",
    "BufferPool",
    "FreedMemory",
    "StoragePool",
    "advise_huge_pages",
    "release_free_memory",
]

TRIM_BUDGET_BYTES = 64 << 20


def release_free_memory() -> None:
    """Return free heap pages to the operating system (glibc), else do nothing."""
    # glibc_function makes the function once per process (cached): nothing to hoist here
    malloc_trim = glibc_function("malloc_trim", (ctypes.c_size_t,))
    if malloc_trim is not None:
        malloc_trim(0)


def advise_huge_pages(tensor: torch.Tensor) -> None:
    """Ask for 2 MiB pages for the not-yet-written CPU ``tensor`` (a hint; errors ignored,
    nothing done without glibc)."""
    if tensor.device.type == "cpu":
        madvise_huge_pages(tensor.data_ptr(), tensor.numel() * tensor.element_size())


class BufferPool:
    """Reduction buffers reused from unit to unit within one backward. A buffer goes back to the
    pool once the reduction that read it was waited for, and the pool is emptied when the
    backward ends, so it holds memory only while gradients are being reduced."""

    def __init__(self) -> None:
        self._free: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}

    def take(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= size
        buffer = self._free.pop((numel, dtype, device), None)
        if buffer is None:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            advise_huge_pages(buffer)
        return buffer.view(shape)

    def give_back(self, buffer: torch.Tensor) -> None:
        flat = buffer.view(-1)
        self._free[(flat.numel(), flat.dtype, flat.device)] = flat

    def clear(self) -> None:
        self._free.clear()


class FreedMemory:
    """Counts the bytes backward freed since the last trim, across iterations, and trims when
    they reach ``TRIM_BUDGET_BYTES``. See [Note: returning memory]."""

    def __init__(self) -> None:
        self._freed = 0

    def add(self, nbytes: int) -> None:
        self._freed += nbytes
        if self._freed >= TRIM_BUDGET_BYTES:
            release_free_memory()
            self._freed = 0


UNSHARDED_POOL_ENTRIES = 3
_CAN_MOVE_STORAGE = hasattr(torch.UntypedStorage, "_swap_data_ptr_")


class StoragePool:
    """Memory of freed unsharded buffers, handed to the next gather of the same size.
    See [Note: unsharded memory pool]."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._free: list[torch.UntypedStorage] = []

    def release(self, tensor: torch.Tensor) -> None:
        """Free ``tensor``'s storage (it keeps its identity, with no memory), keeping the memory
        for reuse where it can."""
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0:
            return
        if tensor.device.type == "cpu" and _CAN_MOVE_STORAGE and len(self._free) < self.max_entries:
            holder = torch.UntypedStorage(0, device=tensor.device)
            storage._swap_data_ptr_(holder)  # type: ignore[attr-defined]  # no stub; holder owns it
            self._free.append(holder)
            return
        storage.resize_(0)

    def acquire(self, tensor: torch.Tensor, nbytes: int) -> bool:
        """Give ``tensor``'s empty storage ``nbytes`` of memory: a pooled buffer of that size
        if there is one (True), else fresh memory (False)."""
        storage = tensor.untyped_storage()
        for index, holder in enumerate(self._free):
            if holder.nbytes() == nbytes and holder.device == tensor.device:
                storage._swap_data_ptr_(self._free.pop(index))  # type: ignore[attr-defined]
                return True
        storage.resize_(nbytes)
        return False

    def clear(self) -> None:
        self._free.clear()


UNSHARDED_POOL = StoragePool(UNSHARDED_POOL_ENTRIES)
