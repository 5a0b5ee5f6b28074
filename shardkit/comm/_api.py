"""shardkit's collectives: out-of-place, differentiable, optionally asynchronous.

Every function takes the tensor first and the rest by keyword, checks its arguments before any
data moves, and returns the output tensor, or a `Handle` whose ``wait()`` returns it when
``async_op=True``. When the input requires grad the result is differentiable (see
[Note: adjoints] in `_ops`). Rows are split along dim 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from shardkit.comm import _debug
from shardkit.comm._autograd import Handle, run
from shardkit.comm._errors import collective_error
from shardkit.comm._label import label
from shardkit.comm._objects import group_device
from shardkit.comm._ops import (
    AllGather,
    AllReduce,
    AllToAll,
    Broadcast,
    ReduceOpLike,
    ReduceScatter,
)

__all__ = [
    "all_gather_into_tensor",
    "all_gather_sizes",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "reduce_scatter_tensor",
]

Group = dist.ProcessGroup | None
Sizes = Sequence[int] | torch.Tensor


def all_to_all_single(
    input: torch.Tensor,
    *,
    output_split_sizes: Sizes | None = None,
    input_split_sizes: Sizes | None = None,
    group: Group = None,
    async_op: bool = False,
) -> torch.Tensor | Handle:
    """Send ``input_split_sizes[j]`` rows to rank ``j``; receive from every rank in rank order.

    With neither split list the rows are split evenly (as in torch). With only
    ``input_split_sizes``, the output sizes are learnt from the other ranks first (one small
    all-to-all of counts). Backward is the all-to-all with the split lists swapped.

    Args:
        input: ``[N, *]`` rows to send.
        output_split_sizes: rows to receive from each rank (one entry per rank).
        input_split_sizes: rows to send to each rank; must sum to ``N``.
        group: the process group (default: the world).
        async_op: return a `Handle` instead of waiting.

    Returns:
        ``[sum(output_split_sizes), *]``.
    """
    name = "all_to_all_single"
    _check_tensor(name, input, min_dim=1)
    num_ranks = dist.get_world_size(group)
    if input_split_sizes is None:
        if output_split_sizes is not None:
            raise ValueError(
                f"{name}: output_split_sizes given without input_split_sizes; give both, or "
                "only input_split_sizes to have the output sizes exchanged"
            )
        even = _even_split(name, input.size(0), num_ranks)
        in_splits = out_splits = even
    else:
        in_splits = _check_sizes(name, "input_split_sizes", input_split_sizes, num_ranks)
        _check_sum(name, "input_split_sizes", in_splits, input.size(0))
        if output_split_sizes is None:
            out_splits = _exchange_counts(in_splits, group)
        else:
            out_splits = _check_sizes(name, "output_split_sizes", output_split_sizes, num_ranks)
    return _run(AllToAll(group, in_splits, out_splits), input, async_op)


def all_gather_into_tensor(
    input: torch.Tensor,
    *,
    output_split_sizes: Sizes | None = None,
    group: Group = None,
    async_op: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor | Handle:
    """Concatenate every rank's ``input`` in rank order; sizes may differ by rank.

    Args:
        input: ``[N_r, *]`` on rank ``r``.
        output_split_sizes: ``[N_0, ..., N_{W-1}]``; default: every rank has this rank's ``N``.
            Use `all_gather_sizes` to learn them when unknown.
        group: the process group (default: the world).
        async_op: return a `Handle` instead of waiting.
        out: ``[W * N, *]``, contiguous, ``input``'s dtype and device: gather into it instead
            of a new tensor (equal sizes only, not differentiable; see [Note: out buffers]).

    Returns:
        ``[sum(N_r), *]`` (``out`` itself when given). Backward is a SUM reduce-scatter.
    """
    name = "all_gather_into_tensor"
    _check_tensor(name, input, min_dim=1)
    num_ranks = dist.get_world_size(group)
    if output_split_sizes is None:
        sizes = (input.size(0),) * num_ranks
    else:
        sizes = _check_sizes(name, "output_split_sizes", output_split_sizes, num_ranks)
        rank = dist.get_rank(group)
        if sizes[rank] != input.size(0):
            raise ValueError(
                f"{name}: output_split_sizes[{rank}] is {sizes[rank]} but this rank's input has "
                f"{input.size(0)} rows; entry r must be the row count of rank r's input"
            )
    if out is not None:
        _check_out(name, out, input, sizes, (sum(sizes), *input.shape[1:]))
    return _run(AllGather(group, sizes), input, async_op, out)


def reduce_scatter_tensor(
    input: torch.Tensor,
    *,
    op: ReduceOpLike = dist.ReduceOp.SUM,
    input_split_sizes: Sizes | None = None,
    group: Group = None,
    async_op: bool = False,
    via_all_to_all: bool | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | Handle:
    """Reduce ``input`` over ranks and give rank ``r`` the ``r``-th chunk of rows.

    Args:
        input: ``[N, *]``, the same shape on every rank.
        op: ``SUM``, ``AVG``, ``MAX``, ``MIN`` or ``PRODUCT`` (differentiable: SUM and AVG).
        input_split_sizes: rows of each rank's chunk; default: ``N / world size`` each.
        group: the process group (default: the world).
        async_op: return a `Handle` instead of waiting.
        via_all_to_all: None picks the faster for the backend: NCCL's own operation; elsewhere
            (gloo) an all-to-all and a local reduction, which receives a buffer as large as
            ``input``. False asks for the backend's own operation where it has one (less memory
            on gloo, about an all-reduce's time); True for the all-to-all.
        out: ``[N / W, *]``, contiguous, ``input``'s dtype and device: write this rank's chunk
            into it instead of a new tensor (equal sizes only, not differentiable; see
            [Note: out buffers]).

    Returns:
        ``[input_split_sizes[r], *]`` on rank ``r`` (``out`` itself when given). Backward is an
        all-gather.
    """
    name = "reduce_scatter_tensor"
    _check_tensor(name, input, min_dim=1)
    num_ranks = dist.get_world_size(group)
    if input_split_sizes is None:
        sizes = _even_split(name, input.size(0), num_ranks)
    else:
        sizes = _check_sizes(name, "input_split_sizes", input_split_sizes, num_ranks)
        _check_sum(name, "input_split_sizes", sizes, input.size(0))
    base_op, scale = _reduce_op(name, op, input, num_ranks)
    if out is not None:
        _check_out(name, out, input, sizes, (sizes[0], *input.shape[1:]))
    op_ = ReduceScatter(group, base_op, sizes, scale, via_all_to_all)
    return _run(op_, input, async_op, out)


def all_reduce(
    input: torch.Tensor,
    *,
    op: ReduceOpLike = dist.ReduceOp.SUM,
    group: Group = None,
    async_op: bool = False,
    inplace: bool = False,
) -> torch.Tensor | Handle:
    """Reduce ``input`` over ranks; every rank gets the result.

    ``op`` is ``SUM``, ``AVG``, ``MAX``, ``MIN`` or ``PRODUCT``; SUM and AVG are differentiable.
    By default ``input`` is left alone and a new tensor returned; ``inplace=True`` writes the
    result into ``input`` (contiguous, not requiring grad) and returns it, saving a copy.
    """
    name = "all_reduce"
    _check_tensor(name, input, min_dim=0)
    if inplace:
        _check_inplace(name, input)
    base_op, scale = _reduce_op(name, op, input, dist.get_world_size(group))
    return _run(AllReduce(group, base_op, scale, inplace), input, async_op)


def broadcast(
    input: torch.Tensor,
    *,
    src: int = 0,
    group: Group = None,
    async_op: bool = False,
    inplace: bool = False,
) -> torch.Tensor | Handle:
    """Every rank gets global rank ``src``'s tensor (same shape and dtype on every rank).

    Backward sums the gradients of all ranks onto ``src``; the others get zeros. ``inplace=True``
    overwrites ``input`` on the other ranks instead of returning a new tensor (as `all_reduce`).
    """
    name = "broadcast"
    _check_tensor(name, input, min_dim=0)
    _check_member(name, src, group)
    if inplace:
        _check_inplace(name, input)
    return _run(Broadcast(group, src, inplace), input, async_op)


def all_gather_sizes(
    size: int, *, group: Group = None, device: torch.device | None = None
) -> list[int]:
    """Every rank's ``size`` in rank order: the ``output_split_sizes`` of an uneven gather."""
    device = device or group_device(group)
    local = torch.tensor([size], dtype=torch.int64, device=device)
    gathered = all_gather_into_tensor(local, group=group)
    assert isinstance(gathered, torch.Tensor)
    return gathered.tolist()


def barrier(*, group: Group = None) -> None:
    """Block until every rank of ``group`` arrives (bounded by the group's timeout)."""
    with label("shardkit::barrier"):
        try:
            dist.barrier(group=group)
        except RuntimeError as exc:
            raise collective_error("barrier", group, exc) from exc


def _run(
    op: Any, x: torch.Tensor, async_op: bool, out: torch.Tensor | None = None
) -> torch.Tensor | Handle:
    if _debug.enabled():
        _debug.check(op, x)
    return run(op, x, async_op=async_op, out=out)


def _exchange_counts(in_splits: tuple[int, ...], group: Group) -> tuple[int, ...]:
    device = group_device(group)
    counts = torch.tensor(in_splits, dtype=torch.int64, device=device)
    received = run(
        AllToAll(group, (1,) * len(in_splits), (1,) * len(in_splits)), counts, async_op=False
    )
    assert isinstance(received, torch.Tensor)
    return tuple(received.tolist())


def _reduce_op(
    name: str, op: ReduceOpLike, x: torch.Tensor, num_ranks: int
) -> tuple[ReduceOpLike, float]:
    """AVG becomes SUM scaled by ``1 / num_ranks`` (same arithmetic on every backend)."""
    if op == dist.ReduceOp.AVG:
        if not (x.is_floating_point() or x.is_complex()):
            raise TypeError(
                f"{name}: AVG needs a floating dtype, got {x.dtype}; use SUM and divide, or "
                "convert to float first"
            )
        return dist.ReduceOp.SUM, 1.0 / num_ranks
    supported = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
    if not any(op == allowed for allowed in supported):
        raise ValueError(f"{name}: op must be SUM, AVG, MAX, MIN or PRODUCT, got {op}")
    if op != dist.ReduceOp.SUM and x.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{name}: only SUM and AVG are differentiable, got {op} on a tensor that requires "
            "grad; detach it or use SUM/AVG"
        )
    return op, 1.0


def _check_tensor(name: str, x: Any, *, min_dim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: input must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{name}: input must have at least {min_dim} dimension(s) (rows are split along dim "
            f"0), got shape {tuple(x.shape)}; use input.reshape(-1) or unsqueeze(0)"
        )


def _check_inplace(name: str, x: torch.Tensor) -> None:
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{name}: inplace=True on a tensor that requires grad cannot be differentiated; "
            "use inplace=False, or run it under torch.no_grad() on .data"
        )
    if not x.is_contiguous():
        raise ValueError(f"{name}: inplace=True needs a contiguous tensor; call .contiguous()")


def _check_out(
    name: str, out: Any, x: torch.Tensor, sizes: tuple[int, ...], shape: tuple[int, ...]
) -> None:
    """``out`` must be what the collective would have allocated. See [Note: out buffers]."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: out must be a torch.Tensor, got {type(out).__name__}")
    if len(set(sizes)) > 1:
        raise ValueError(
            f"{name}: out= needs equal sizes on every rank, got {list(sizes)}; pad the inputs "
            "to equal sizes, or leave out unset"
        )
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{name}: out= on a tensor that requires grad cannot be differentiated; leave out "
            "unset, or run it under torch.no_grad()"
        )
    if tuple(out.shape) != shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"{name}: out is {tuple(out.shape)} {out.dtype} on {out.device}, but the output is "
            f"{shape} {x.dtype} on {x.device}; give out that shape, dtype and device"
        )
    if not out.is_contiguous():
        raise ValueError(f"{name}: out must be contiguous; pass a contiguous tensor")


def _check_sizes(name: str, what: str, sizes: Sizes, num_ranks: int) -> tuple[int, ...]:
    values = sizes.tolist() if isinstance(sizes, torch.Tensor) else list(sizes)
    if len(values) != num_ranks:
        raise ValueError(
            f"{name}: {what} has {len(values)} entries but the group has {num_ranks} ranks; "
            "give one size per rank"
        )
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise ValueError(f"{name}: {what} must be integers >= 0, got {values}")
    return tuple(values)


def _check_sum(name: str, what: str, sizes: tuple[int, ...], rows: int) -> None:
    if sum(sizes) != rows:
        raise ValueError(
            f"{name}: {what} {list(sizes)} sum to {sum(sizes)} but the input has {rows} rows "
            "(dim 0); the sizes must sum to input.size(0)"
        )


def _even_split(name: str, rows: int, num_ranks: int) -> tuple[int, ...]:
    if rows % num_ranks:
        raise ValueError(
            f"{name}: {rows} rows do not split evenly over {num_ranks} ranks; pass split sizes "
            "for uneven chunks"
        )
    return (rows // num_ranks,) * num_ranks


def _check_member(name: str, rank: int, group: Group) -> None:
    members = dist.get_process_group_ranks(group) if group is not None else None
    world = dist.get_world_size()
    if members is None and not 0 <= rank < world:
        raise ValueError(f"{name}: src must be a rank in [0, {world}), got {rank}")
    if members is not None and rank not in members:
        raise ValueError(f"{name}: src {rank} is not in the group (ranks {members})")
