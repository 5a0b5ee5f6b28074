"""Compressed output dists: the pooled (and sequence) embeddings' collectives run through a
`QuantizedCommCodecs` pair, TorchRec's ``qcomm_codecs_registry``.

[Note: compressed collectives]
A codec pair compresses one collective in both directions: forward sends
``forward.encode(rows)`` (e.g. float16) and decodes what arrives to float32; backward sends the
gradient as ``backward.encode(grad)`` through the adjoint collective (the reverse all-to-all, or
the all-gather of a reduce-scatter) and decodes it. One autograd function holds both
directions, so the two may use different precisions (autograd alone would send the gradient in
the forward's dtype).

Two kinds of codec are accepted (`check_codecs`): elementwise casts (FP16, BF16), whose
encoded rows have the float32 rows' shape and can be summed on the wire, and row-wise codecs
(INT8, FP8: ``shardkit.types``' [Note: row-wise wire rows]), whose ``uint8`` rows carry their
own scale. Their rows count the same, so an all-to-all's split sizes do not change; but they
cannot be summed, so a reduce-scatter under a row-wise codec is an all-to-all of the encoded
rows (even chunks, what the reduce-scatter would send; gloo's reduce-scatter is an all-to-all
too), decoded and summed in float32 on the receiving rank: each of the ``W`` partial sums is
rounded once, none of the sums. Its backward is the all-gather of the encoded gradient (an
all-gather adds nothing). TorchRec instead turns FP8 into FP16 (BF16 backward) on its
reduce-scatter and sums INT8 bytes; shardkit runs every codec where it is asked for. The ids
of the input dist are integers and are never compressed; TorchRec compresses the same three
collectives (`CommOp`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.types import CommOp, NoOpQuantizedCommCodec, QuantizedCommCodecs

__all__ = ["all_to_all", "check_codecs", "codecs_of", "reduce_scatter"]


_CARRIED = (torch.float32, torch.float16, torch.bfloat16)
_ROWWISE = ("Int8RowwiseCodec", "Fp8RowwiseCodec")  # shardkit.types' [Note: row-wise wire rows]


def check_codecs(registry: Mapping[str, Any] | None, tables: Sequence[str]) -> None:
    """Refuse, naming the collection's ``tables``, a registry whose keys are not `CommOp`
    names or whose codecs are neither elementwise casts to a dtype both gloo and NCCL carry nor
    shardkit's row-wise INT8/FP8 codecs."""
    names = [op.name for op in CommOp]
    for key, codecs in (registry or {}).items():
        if key not in names:
            raise ValueError(
                f"qcomm_codecs_registry of tables {list(tables)} has key {key!r}: the keys are "
                f"CommOp names {names}; build it with get_qcomm_codecs_registry(QCommsConfig(...))"
            )
        for direction in ("forward", "backward"):
            codec = getattr(codecs, direction)
            if not _is_cast(codec) and not _is_rowwise(codec):
                raise ValueError(
                    f"qcomm_codecs_registry[{key!r}].{direction} of tables {list(tables)} is "
                    f"{codec!r}: shardkit's collectives run elementwise casts (float32, float16, "
                    "bfloat16, which gloo and NCCL carry) and its INT8/FP8 row-wise codecs only; "
                    "use get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16, "
                    "BF16, INT8 or FP8, ...))"
                )


def _is_cast(codec: Any) -> bool:
    if isinstance(codec, NoOpQuantizedCommCodec):
        return True
    return type(codec).__name__ == "_CastCodec" and codec.quantized_dtype in _CARRIED


def _is_rowwise(codec: Any) -> bool:
    return type(codec).__name__ in _ROWWISE


def codecs_of(registry: Mapping[str, Any] | None, op: CommOp) -> QuantizedCommCodecs | None:
    """The codecs ``registry`` gives ``op``, or None when it has none or only no-ops."""
    codecs = (registry or {}).get(op.name)
    if codecs is None:
        return None
    no_op = NoOpQuantizedCommCodec
    if isinstance(codecs.forward, no_op) and isinstance(codecs.backward, no_op):
        return None
    return codecs


def all_to_all(
    x: torch.Tensor,
    codecs: QuantizedCommCodecs | None,
    *,
    input_split_sizes: Sequence[int],
    output_split_sizes: Sequence[int],
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """`comm.all_to_all_single` of ``x`` ``[N, cols]``, compressed by ``codecs`` when given."""
    splits = (list(input_split_sizes), list(output_split_sizes))
    if codecs is None:
        out = comm.all_to_all_single(
            x, input_split_sizes=splits[0], output_split_sizes=splits[1], group=group
        )
        assert isinstance(out, torch.Tensor)
        return out
    return _AllToAll.apply(x, codecs, splits, group)


def reduce_scatter(
    x: torch.Tensor, codecs: QuantizedCommCodecs | None, *, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """`comm.reduce_scatter_tensor` (SUM, even chunks) of ``x``, compressed by ``codecs``."""
    if codecs is None:
        out = comm.reduce_scatter_tensor(x, group=group)
        assert isinstance(out, torch.Tensor)
        return out
    return _ReduceScatter.apply(x, codecs, group)


def _send(x: torch.Tensor, codec: Any, collective) -> torch.Tensor:
    """``decode(collective(encode(x)))`` in float32. See [Note: compressed collectives]."""
    return codec.decode(collective(codec.encode(x.contiguous()))).to(x.dtype)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, codecs, splits, group):
        ctx.codecs, ctx.splits, ctx.group = codecs, splits, group
        return _send(
            x,
            codecs.forward,
            lambda t: comm.all_to_all_single(
                t, input_split_sizes=splits[0], output_split_sizes=splits[1], group=group
            ),
        )

    @staticmethod
    def backward(ctx, grad):
        splits = ctx.splits
        back = _send(
            grad,
            ctx.codecs.backward,
            lambda t: comm.all_to_all_single(
                t, input_split_sizes=splits[1], output_split_sizes=splits[0], group=ctx.group
            ),
        )
        return back, None, None, None


def _summed(x: torch.Tensor, codec: Any, group: dist.ProcessGroup | None) -> torch.Tensor:
    """This rank's chunk of the sum over ranks of ``x`` ``[N, cols]``, sent through ``codec``:
    a reduce-scatter of the casts, an all-to-all and a float32 sum of the row-wise codecs' rows.
    See [Note: compressed collectives]."""
    if not _is_rowwise(codec):
        return _send(x, codec, lambda t: comm.reduce_scatter_tensor(t, group=group))
    world = dist.get_world_size(group)
    received = _send(x, codec, lambda t: comm.all_to_all_single(t, group=group))  # [N, cols]
    return received.view(world, -1, *x.shape[1:]).sum(0)  # [N / W, cols]


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, codecs, group):
        ctx.codecs, ctx.group = codecs, group
        return _summed(x, codecs.forward, group)

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        back = _send(
            grad, ctx.codecs.backward, lambda t: comm.all_gather_into_tensor(t, group=group)
        )
        return back, None, None
