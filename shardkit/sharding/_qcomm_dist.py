"""Compressed output dists: the pooled (and sequence) embeddings' collectives run through a
`QuantizedCommCodecs` pair, TorchRec's ``qcomm_codecs_registry``.

[Note: compressed collectives]
A codec pair compresses one collective in both directions: forward sends
``forward.encode(rows)`` (e.g. float16) and decodes what arrives to float32; backward sends the
gradient as ``backward.encode(grad)`` through the adjoint collective (the reverse all-to-all, or
the all-gather of a reduce-scatter) and decodes it. One autograd function holds both
directions, so the two may use different precisions (autograd alone would send the gradient in
the forward's dtype). Only elementwise casts are accepted (`check_codecs`): the split sizes
and a reduce-scatter's sums stay those of the float32 rows. The ids of the input dist are
integers and are never compressed; TorchRec compresses the same three collectives
(`CommOp`).
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


def check_codecs(registry: Mapping[str, Any] | None, tables: Sequence[str]) -> None:
    """Refuse, naming the collection's ``tables``, a registry whose keys are not `CommOp`
    names or whose codecs are not elementwise casts to a dtype both gloo and NCCL carry."""
    names = [op.name for op in CommOp]
    for key, codecs in (registry or {}).items():
        if key not in names:
            raise ValueError(
                f"qcomm_codecs_registry of tables {list(tables)} has key {key!r}: the keys are "
                f"CommOp names {names}; build it with get_qcomm_codecs_registry(QCommsConfig(...))"
            )
        for direction in ("forward", "backward"):
            codec = getattr(codecs, direction)
            if not _is_cast(codec):
                raise ValueError(
                    f"qcomm_codecs_registry[{key!r}].{direction} of tables {list(tables)} is "
                    f"{codec!r}: shardkit's collectives run elementwise casts only (float32, "
                    "float16, bfloat16, which gloo and NCCL carry); use get_qcomm_codecs_registry("
                    "QCommsConfig(forward_precision=CommType.FP16 or BF16, ...))"
                )


def _is_cast(codec: Any) -> bool:
    if isinstance(codec, NoOpQuantizedCommCodec):
        return True
    return type(codec).__name__ == "_CastCodec" and codec.quantized_dtype in _CARRIED


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
        return comm.all_to_all_single(
            x, input_split_sizes=splits[0], output_split_sizes=splits[1], group=group
        )
    return _AllToAll.apply(x, codecs, splits, group)


def reduce_scatter(
    x: torch.Tensor, codecs: QuantizedCommCodecs | None, *, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """`comm.reduce_scatter_tensor` (SUM, even chunks) of ``x``, compressed by ``codecs``."""
    if codecs is None:
        return comm.reduce_scatter_tensor(x, group=group)
    return _ReduceScatter.apply(x, codecs, group)


def _send(x: torch.Tensor, codec: Any, collective) -> torch.Tensor:
    """``decode(collective(encode(x)))`` in float32. See [Note: compressed collectives]."""
    return codec.decode(collective(codec.encode(x.contiguous()))).to(x.dtype)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, codecs, splits, group):  # type: ignore[override]
        ctx.codecs, ctx.splits, ctx.group = codecs, splits, group
        return _send(
            x,
            codecs.forward,
            lambda t: comm.all_to_all_single(
                t, input_split_sizes=splits[0], output_split_sizes=splits[1], group=group
            ),
        )

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        splits = ctx.splits
        back = _send(
            grad,
            ctx.codecs.backward,
            lambda t: comm.all_to_all_single(
                t, input_split_sizes=splits[1], output_split_sizes=splits[0], group=ctx.group
            ),
        )
        return back, None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, codecs, group):  # type: ignore[override]
        ctx.codecs, ctx.group = codecs, group
        return _send(x, codecs.forward, lambda t: comm.reduce_scatter_tensor(t, group=group))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        group = ctx.group
        back = _send(
            grad, ctx.codecs.backward, lambda t: comm.all_gather_into_tensor(t, group=group)
        )
        return back, None, None
