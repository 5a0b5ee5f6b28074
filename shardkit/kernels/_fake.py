"""What `torch.compile` and `torch.export` need of the ``shardkit::`` operators: their fake
(meta) implementations and ``pooled_forward``'s autograd formula.

[Note: compiled kernel under PT2]
A compiler traces a program with fake tensors: each operator must say, from its inputs' shapes
and dtypes alone, what it returns. Every ``shardkit::`` operator's output size follows from its
inputs' sizes (``pooled_forward``: one row per bag, ``offsets`` minus one; ``bucket_rows``: one
entry per id, and one row of bag lengths per shard), so none needs an unbacked size. The fakes
are registered when the library is loaded (`register`), once per process. ``pooled_forward``
is differentiable on its own: its gradient is ``dense_backward`` (the whole table's gradient,
and the per-sample weights' when they need one). ``fused_backward`` writes the table and the
optimizer state in place and says so in its schema (``Tensor(a!)``), so a compiler orders it
after every read of them. The embedding collections do not trace these operators one by one
under `torch.compile` (see [Note: collections under torch.compile] in ``shardkit.modules``), but
a program that calls them does, and `torch.library.opcheck` holds each registration to its
operator (tests/kernels/test_fake.py).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["register"]

_registered = False


def register() -> None:
    """Register the fakes and the autograd formula (the library must be loaded); idempotent."""
    global _registered
    if _registered:
        return
    torch.library.register_fake("shardkit::pooled_forward", _pooled_forward)
    torch.library.register_fake("shardkit::fused_backward", _fused_backward)
    torch.library.register_fake("shardkit::dense_backward", _dense_backward)
    torch.library.register_fake("shardkit::bucket_rows", _bucket_rows)
    torch.library.register_fake("shardkit::shift_ids", _shift_ids)
    torch.library.register_autograd(
        "shardkit::pooled_forward", _pooled_forward_grad, setup_context=_pooled_forward_setup
    )
    _registered = True


def _pooled_forward(weight, ids, offsets, per_sample_weights, batch_size=0):
    return weight.new_empty(offsets.shape[0] - 1, weight.shape[1])  # [num_bags, D]


def _fused_backward(weight, ids, offsets, per_sample_weights, grad_out, state, rule, lr, eps,
                    weight_decay, beta1, beta2, step, grad_per_sample_weights, batch_size=0):  # fmt: skip
    if not grad_per_sample_weights:
        return None
    return grad_out.new_empty(ids.shape[0])  # [N] fp32


def _dense_backward(weight, ids, offsets, per_sample_weights, grad_out,
                    grad_per_sample_weights, batch_size=0):  # fmt: skip
    grad_weights = grad_out.new_empty(ids.shape[0]) if grad_per_sample_weights else None
    return torch.empty_like(weight), grad_weights


def _bucket_rows(values, lengths, row_starts):
    shard_lengths = values.new_empty(len(row_starts), lengths.shape[0])  # [S, B] int64
    return shard_lengths, torch.empty_like(values), torch.empty_like(values)


def _shift_ids(ids, bases, counts):
    return ids.new_empty(ids.shape[0], dtype=torch.int64)


def _pooled_forward_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    weight, ids, offsets, per_sample_weights, batch_size = (*inputs, 0)[:5]
    ctx.save_for_backward(weight, ids, offsets, per_sample_weights)
    ctx.batch_size = batch_size


def _pooled_forward_grad(ctx: Any, grad: torch.Tensor) -> tuple:
    weight, ids, offsets, per_sample_weights = ctx.saved_tensors
    wants = per_sample_weights is not None and ctx.needs_input_grad[3]
    grad_weight, grad_weights = torch.ops.shardkit.dense_backward(
        weight, ids, offsets, per_sample_weights, grad.float().contiguous(), wants, ctx.batch_size
    )
    if not ctx.needs_input_grad[0]:
        grad_weight = None
    return grad_weight, None, None, grad_weights if wants else None, None
