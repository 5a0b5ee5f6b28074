"""One batched lookup over a stack of tables, with the optimizer fused into backward.

[Note: batched kernel]
Tables of one embedding dim live stacked in one weight buffer ``[sum(rows), D]``; a table's ids
are shifted by its first row, so all of them are looked up by ONE ``embedding_bag`` (pooled) or
``embedding`` (sequence) call, whatever the number of tables.

Backward never forms a gradient for the whole buffer when an optimizer is fused. It sorts the
batch's ids once, finds the unique rows and, chunk by chunk, sums each unique row's gradient with
another ``embedding_bag``: its "table" is the output gradient ``[num_bags, D]``, its "ids" the bag of
each occurrence, its "bags" the runs of equal ids. That adds duplicates within and across bags
(and applies per-sample weights) without materialising a ``[num_ids, D]`` intermediate; the
optimizer rule then updates those rows (see [Note: fused row updates] in `shardkit.optim`).
Chunks of a few MiB keep the temporaries in cache and out of fresh pages, which on CPU costs more
than the arithmetic.

That is the eager kernel: pure torch ops, the spec and the fallback. The compiled kernel (see
[Note: compiled kernel] in `shardkit.kernels`) does the same in C++ operators without the
temporaries: forward one loop over the bags, backward one radix sort of the ids and ONE pass over
the unique rows that sums each row's gradient and applies the rule in place (plain fp32 SGD on
one thread needs no sort at all). Which one runs is chosen once per process, at the first lookup:
``SHARDKIT_KERNEL=auto|compiled|eager`` or `shardkit.kernels.set_kernel` (``use_kernel`` for a
block), one INFO line saying which and why; the choice is made in forward and kept by that
lookup's backward, and lookups the compiled operators cannot serve (`shardkit.kernels.unsupported`)
run eager. The first process on a machine builds the operators (10-40 s on 2 cores) and caches
them in ``~/.cache/shardkit/kernels/`` (``$SHARDKIT_CACHE_DIR``); later ones load them in
milliseconds.

Pooled lookups may ask for their output example-major (``batch_size``): ``[B, K * D]``, a
KeyedTensor's layout, which the compiled kernel writes directly (and reads its gradient so),
where the eager one transposes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from shardkit import kernels
from shardkit.optim import RowOptimizer

__all__ = ["BatchedTables", "lookup", "lookup_backward", "uses_compiled_kernel"]

logger = logging.getLogger(__name__)

# Bytes of gradient rows handled per chunk in backward (see [Note: batched kernel]).
_CHUNK_BYTES = 2 << 20
_MIN_CHUNK_ROWS = 256


class BatchedTables:
    """Tables of one dim stacked in one buffer, and the optimizer fused into their backward.

    Args:
        weight: ``[sum(rows), D]``, the stacked tables.
        row_starts: first row of each table in ``weight``, plus the total (``len = tables + 1``).
        optimizer: the fused optimizer, or None for plain dense gradients.
    """

    def __init__(
        self, weight: torch.Tensor, row_starts: Sequence[int], optimizer: RowOptimizer | None
    ) -> None:
        assert weight.dim() == 2 and row_starts[-1] == weight.shape[0]
        self.weight = weight
        self.row_starts = list(row_starts)
        self.optimizer = optimizer

    @property
    def dim(self) -> int:
        return self.weight.shape[1]

    def table_views(self) -> list[torch.Tensor]:
        """Each table's rows, as views of the buffer."""
        bounds = zip(self.row_starts[:-1], self.row_starts[1:])
        return [self.weight[start:end] for start, end in bounds]

    def backward(
        self,
        ids: torch.Tensor,
        bag_of: torch.Tensor | None,
        per_sample_weights: torch.Tensor | None,
        grad_out: torch.Tensor,
    ) -> list[torch.Tensor | None]:
        """Eager: fused update (returns no gradients), or the dense gradient of each table."""
        runs = _RowRuns(ids.long(), bag_of, per_sample_weights, *self.weight.shape)
        optimizer = self.optimizer
        if optimizer is not None:
            optimizer.begin_step()
            for index in range(runs.num_chunks):
                optimizer.update(self.weight, *runs.gradients(index, grad_out))
            return [None] * (len(self.row_starts) - 1)
        grad = torch.zeros(self.weight.shape, dtype=torch.float32, device=self.weight.device)
        for index in range(runs.num_chunks):
            grad.index_copy_(0, *runs.gradients(index, grad_out))
        return self._split(grad.to(self.weight.dtype))

    def compiled_backward(
        self,
        ids: torch.Tensor,
        offsets: torch.Tensor | None,
        per_sample_weights: torch.Tensor | None,
        grad_out: torch.Tensor,
        grad_per_sample_weights: bool,
        *,
        batch_size: int = 0,
    ) -> tuple[list[torch.Tensor | None], torch.Tensor | None]:
        """Compiled: as `backward`, and d loss / d per_sample_weights ``[N]`` fp32 when asked."""
        optimizer = self.optimizer
        args = (self.weight, ids, offsets, per_sample_weights, grad_out)
        wants_grad = grad_per_sample_weights
        if optimizer is not None:
            optimizer.begin_step()
            grad_weights = kernels.fused_backward(
                *args, optimizer, grad_per_sample_weights=wants_grad, batch_size=batch_size
            )
            return [None] * (len(self.row_starts) - 1), grad_weights
        grad, grad_weights = kernels.dense_backward(
            *args, grad_per_sample_weights=wants_grad, batch_size=batch_size
        )
        return self._split(grad), grad_weights

    def apply_gradient(
        self,
        ids: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None,
        grad_out: torch.Tensor,
    ) -> list[torch.Tensor | None]:
        """What `lookup`'s backward does for bags whose output gradient is known, without their
        forward (compiled kernel where it serves, else eager): the fused optimizer's step
        (returns None per table), or with no optimizer each table's dense gradient.

        Args:
            ids: ``[N]`` rows of the buffer; offsets: ``[num_bags + 1]`` bag boundaries;
            per_sample_weights: ``[N]`` or None; grad_out: ``[num_bags, D]`` fp32, bags in
            ``offsets`` order.
        """
        if _compiled(self, ids):
            grads, _ = self.compiled_backward(ids, offsets, per_sample_weights, grad_out, False)
            return grads
        ids = ids.long()
        return self.backward(ids, _bag_of(offsets, ids.numel()), per_sample_weights, grad_out)

    def _split(self, grad: torch.Tensor) -> list[torch.Tensor | None]:
        bounds = zip(self.row_starts[:-1], self.row_starts[1:])
        return [grad[start:end] for start, end in bounds]


def lookup(
    tables: BatchedTables,
    ids: torch.Tensor,
    offsets: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None,
    params: Sequence[torch.Tensor],
    *,
    batch_size: int | None = None,
) -> torch.Tensor:
    """Pooled lookup ``[num_bags, D]`` (``offsets`` given, SUM with optional per-sample weights)
    or per-id lookup ``[num_ids, D]`` (``offsets`` None), differentiable.

    Args:
        tables: the stacked tables.
        ids: ``[N]`` int64 (or int32) rows of the buffer (table-local id + the table's first row).
        offsets: ``[num_bags + 1]`` int64 bag boundaries into ``ids``, or None.
        per_sample_weights: ``[N]`` weight of each id in its bag, or None.
        params: the tables' parameters (views of the buffer), so autograd reaches them.
        batch_size: for pooled lookups whose bags are ``K`` keys x ``batch_size`` examples,
            key-major (a KJT's order): return them example-major, ``[batch_size, K * D]`` (a
            KeyedTensor's values), which the compiled kernel writes without a transpose.
    """
    return _Lookup.apply(tables, ids, offsets, per_sample_weights, batch_size or 0, *params)


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        tables: BatchedTables,
        ids: torch.Tensor,
        offsets: torch.Tensor | None,
        per_sample_weights: torch.Tensor | None,
        batch_size: int,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        ctx.tables, ctx.batch_size = tables, batch_size
        ctx.save_for_backward(ids, offsets, per_sample_weights)
        ctx.compiled = _compiled(tables, ids)
        if offsets is None:
            return F.embedding(ids, tables.weight)
        if ctx.compiled:
            # this Function is the autograd of the lookup: call the operator below autograd,
            # skipping the Python autograd formula it carries for programs that call it alone
            with torch._C._AutoDispatchBelowAutograd():
                out = kernels.pooled_forward(
                    tables.weight, ids, offsets, per_sample_weights, batch_size=batch_size
                )  # rows already example-major when batch_size > 0
            return out.view(batch_size, out.numel() // batch_size) if batch_size else out
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(tables.weight.dtype)
        out = F.embedding_bag(
            ids.long(),
            tables.weight,
            offsets.long(),
            mode="sum",
            per_sample_weights=per_sample_weights,
            include_last_offset=True,
        )
        return _example_major(out, batch_size)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        ids, offsets, per_sample_weights = ctx.saved_tensors
        tables: BatchedTables = ctx.tables
        ctx.tables = None
        wants_grad_weights = per_sample_weights is not None and ctx.needs_input_grad[3]
        param_grads, grad_weights = lookup_backward(
            tables, ids, offsets, per_sample_weights, grad_out, batch_size=ctx.batch_size,
            compiled=ctx.compiled, grad_per_sample_weights=wants_grad_weights,
        )  # fmt: skip
        return (None, None, None, grad_weights, None, *param_grads)


def lookup_backward(
    tables: BatchedTables,
    ids: torch.Tensor,
    offsets: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None,
    grad_out: torch.Tensor,
    *,
    batch_size: int,
    compiled: bool,
    grad_per_sample_weights: bool,
) -> tuple[list[torch.Tensor | None], torch.Tensor | None]:
    """`lookup`'s backward: the fused update (no parameter gradients) or each table's dense
    gradient, and d loss / d per_sample_weights when asked (in their dtype).

    Args: as `lookup`'s, and ``grad_out`` the gradient of its output (its shape);
        ``compiled``: the kernel the forward ran (`lookup` decides in forward).
    """
    args = (ids, offsets, per_sample_weights)
    if compiled:
        grad_out = grad_out.float().contiguous().view(-1, tables.dim)  # the forward's rows
        param_grads, grad_weights = tables.compiled_backward(
            *args, grad_out, grad_per_sample_weights, batch_size=batch_size
        )
    else:
        grad_out = _key_major(grad_out.float(), batch_size, tables.dim).contiguous()
        param_grads, grad_weights = _eager_backward(
            tables, *args, grad_out, grad_per_sample_weights
        )
    if grad_weights is not None:
        assert per_sample_weights is not None
        grad_weights = grad_weights.to(per_sample_weights.dtype)
    return param_grads, grad_weights


def uses_compiled_kernel(tables: BatchedTables, ids: torch.Tensor) -> bool:
    """Whether a lookup of ``ids`` in ``tables`` runs the compiled kernel now (as `lookup`
    decides it in forward)."""
    return _compiled(tables, ids)


def _eager_backward(
    tables: BatchedTables,
    ids: torch.Tensor,
    offsets: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None,
    grad_out: torch.Tensor,
    wants_grad_weights: bool,
) -> tuple[list[torch.Tensor | None], torch.Tensor | None]:
    ids = ids.long()
    bag_of = None if offsets is None else _bag_of(offsets, ids.numel())
    grad_weights = None
    if wants_grad_weights:
        # d out[bag] / d w_i = weight[ids[i]]; read the weights before the update changes them
        rows = tables.weight.index_select(0, ids).float()
        assert bag_of is not None, "per-sample weights come with bags (offsets)"
        grad_weights = (grad_out.index_select(0, bag_of) * rows).sum(1)
    return tables.backward(ids, bag_of, per_sample_weights, grad_out), grad_weights


def _example_major(out: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``[K * B, D]`` key-major -> ``[B, K * D]`` (no-op when ``batch_size`` is 0)."""
    if not batch_size:
        return out
    dim = out.shape[1]
    return out.view(-1, batch_size, dim).transpose(0, 1).reshape(batch_size, -1)


def _key_major(grad: torch.Tensor, batch_size: int, dim: int) -> torch.Tensor:
    """The inverse of `_example_major`: ``[B, K * D]`` -> ``[K * B, D]``."""
    if not batch_size:
        return grad
    return grad.reshape(batch_size, -1, dim).transpose(0, 1).reshape(-1, dim)


_unsupported_logged: set[str] = set()


def _compiled(tables: BatchedTables, ids: torch.Tensor) -> bool:
    """Whether this lookup runs the compiled kernel (see [Note: compiled kernel])."""
    if kernels.kernel_path() != kernels.KernelPath.COMPILED:
        return False
    reason = kernels.unsupported(tables.weight, ids, tables.optimizer)
    if reason is None:
        return True
    if reason not in _unsupported_logged:
        _unsupported_logged.add(reason)
        logger.info("these embedding lookups run the eager kernel: %s", reason)
    return False


def _bag_of(offsets: torch.Tensor, num_ids: int) -> torch.Tensor:
    """``[N]``: the bag index of every id."""
    bags = torch.arange(offsets.numel() - 1, device=offsets.device)
    return torch.repeat_interleave(bags, offsets.diff(), output_size=num_ids)


class _RowRuns:
    """The batch's ids grouped by row: each unique row and the run of its occurrences.

    See [Note: batched kernel]. ``grad_out`` is ``[num_bags, D]`` (pooled: row ``bag_of[i]``
    receives id ``i``) or ``[N, D]`` (per id: ``bag_of`` None). Chunk ``k`` covers unique rows
    ``[k * chunk, (k + 1) * chunk)``; chunks never share a row.
    """

    def __init__(
        self,
        ids: torch.Tensor,
        bag_of: torch.Tensor | None,
        per_sample_weights: torch.Tensor | None,
        num_rows: int,
        dim: int,
    ) -> None:
        # int32 keys sort about twice as fast as int64 ones; rows of one buffer fit them.
        keys = ids.int() if num_rows <= torch.iinfo(torch.int32).max else ids
        sorted_ids, order = torch.sort(keys, stable=True)
        unique, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
        self.unique = unique.long()
        self.runs = torch.zeros(unique.numel() + 1, dtype=torch.int64, device=ids.device)
        torch.cumsum(counts, 0, out=self.runs[1:])
        self.sources = order if bag_of is None else bag_of.index_select(0, order)
        self.weights = None if per_sample_weights is None else per_sample_weights.float()[order]
        self.chunk = max(_MIN_CHUNK_ROWS, _CHUNK_BYTES // (4 * dim))
        self.num_chunks = -(-unique.numel() // self.chunk)
        self.bounds = [*self.runs[:: self.chunk].tolist(), ids.numel()]

    def gradients(self, index: int, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows [U_c], grads [U_c, D])`` of chunk ``index``: its rows and summed gradients."""
        first = index * self.chunk
        last = min(first + self.chunk, self.unique.numel())
        lo, hi = self.bounds[index], self.bounds[index + 1]
        grads = F.embedding_bag(
            self.sources[lo:hi],
            grad_out,
            self.runs[first : last + 1] - lo,
            mode="sum",
            per_sample_weights=None if self.weights is None else self.weights[lo:hi],
            include_last_offset=True,
        )
        return self.unique[first:last], grads
