"""The pooled output ``[B, sum(dims)]`` of a sharded bag collection, put together in one pass.

[Note: one-pass assembly]
The rows a rank gets back come in a few tensors: one per output class (``[R_c, cols]``, unit
after unit, ``B`` rows each) and the data-parallel replica's values (``[B, D_local]``, feature
after feature). Each unit is one ``[B, cols]`` block of one of them, and fills columns
``[col, col + cols)`` of the output. Slicing each block out and concatenating them would cost,
in backward, one zero-filled gradient the size of the whole source per block (autograd's
``SliceBackward``) plus one add each; `assemble` instead copies every block straight into the
output, and in backward copies every block's gradient straight back (scaled by the source's
``gradient_division`` factor), so each byte is moved once each way. Every row of a source
belongs to exactly one block; a source that is not covered whole gets zeros where no block is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

__all__ = ["Block", "assemble"]


@dataclass(frozen=True)
class Block:
    """Rows ``[row, row + B)`` x columns ``[src_col, src_col + cols)`` of source ``source``,
    written to output columns ``[out_col, out_col + cols)``."""

    source: int
    row: int
    src_col: int
    cols: int
    out_col: int


def assemble(
    sources: Sequence[torch.Tensor],
    scales: Sequence[float],
    blocks: Sequence[Block],
    *,
    batch_size: int,
    width: int,
) -> torch.Tensor:
    """``[batch_size, width]``: every block copied into its columns (see [Note: one-pass assembly]).

    Args:
        sources: 2-d tensors the blocks are read from.
        scales: per source, the factor its gradient is multiplied by on the way back.
        blocks: where each block comes from and goes to.
        batch_size: rows of every block and of the output.
        width: the output's columns (every column is some block's).
    """
    return _Assemble.apply(tuple(scales), tuple(blocks), batch_size, width, *sources)


class _Assemble(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        scales: tuple[float, ...],
        blocks: tuple[Block, ...],
        batch_size: int,
        width: int,
        *sources: torch.Tensor,
    ) -> torch.Tensor:
        ctx.scales, ctx.blocks = scales, blocks
        ctx.shapes = [(s.shape, s.dtype, s.device) for s in sources]
        dtype = sources[0].dtype if sources else torch.float32
        for source in sources[1:]:
            dtype = torch.promote_types(dtype, source.dtype)
        device = sources[0].device if sources else None
        out = torch.empty((batch_size, width), dtype=dtype, device=device)  # [B, sum(dims)]
        for b in blocks:
            part = sources[b.source][b.row : b.row + batch_size, b.src_col : b.src_col + b.cols]
            out[:, b.out_col : b.out_col + b.cols].copy_(part)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        batch_size = grad.shape[0]
        covered = [0] * len(ctx.shapes)
        for b in ctx.blocks:
            covered[b.source] += batch_size * b.cols
        grads = []
        for (shape, dtype, device), count in zip(ctx.shapes, covered):
            whole = count == shape.numel()
            make = torch.empty if whole else torch.zeros
            grads.append(make(shape, dtype=dtype, device=device))
        for b in ctx.blocks:
            part = grad[:, b.out_col : b.out_col + b.cols]
            dest = grads[b.source][b.row : b.row + batch_size, b.src_col : b.src_col + b.cols]
            scale = ctx.scales[b.source]
            if scale == 1.0:
                dest.copy_(part)
            else:
                torch.mul(part, scale, out=dest)
        return (None, None, None, None, *grads)
