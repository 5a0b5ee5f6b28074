"""The ``shardkit::`` operators under PT2: `torch.library.opcheck` holds each fake implementation
and ``pooled_forward``'s autograd formula to the operator (schema, fake tensors, autograd
registration, AOT dispatch with dynamic shapes), and a function calling them compiles with
``fullgraph=True`` to the eager values (see [Note: compiled kernel under PT2])."""

from __future__ import annotations

import pytest
import torch

from shardkit.kernels import KernelPath, use_kernel

ROWS, DIM = 10, 4


@pytest.fixture(scope="module", autouse=True)
def _loaded():
    with use_kernel(KernelPath.COMPILED):  # builds (or loads) the library and its fakes
        yield


def _batch(weighted: bool):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(ROWS, DIM, generator=g)
    ids = torch.tensor([1, 4, 4, 0, 9, 3])
    offsets = torch.tensor([0, 2, 2, 5, 6])  # 4 bags: 2 keys x batch 2, one empty
    psw = torch.rand(6, generator=g) if weighted else None
    return weight, ids, offsets, psw


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("batch_size", [0, 2])
def test_pooled_forward_opcheck(weighted, batch_size):
    weight, ids, offsets, psw = _batch(weighted)
    weight.requires_grad_()
    if psw is not None:
        psw.requires_grad_()
    torch.library.opcheck(torch.ops.shardkit.pooled_forward.default,
                          (weight, ids, offsets, psw, batch_size))  # fmt: skip


def test_backward_ops_opcheck():
    weight, ids, offsets, psw = _batch(True)
    grad_out = torch.randn(4, DIM)
    torch.library.opcheck(torch.ops.shardkit.dense_backward.default,
                          (weight, ids, offsets, psw, grad_out, True, 0))  # fmt: skip
    state = [torch.zeros(ROWS * DIM)]
    # Not test_aot_dispatch_*: torch 2.13 cannot functionalize a custom operator that writes
    # an input and returns ``Tensor?`` ("output has alias annotations", though it has none).
    # The collections never trace it (it runs inside their own operators).
    torch.library.opcheck(
        torch.ops.shardkit.fused_backward.default,
        (weight, ids, offsets, psw, grad_out, state, 2, 0.1, 1e-8, 0.0, 0.9, 0.999, 1, True, 0),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_bucket_rows_opcheck():
    values = torch.tensor([0, 7, 3, 9, 5])
    lengths = torch.tensor([2, 0, 3])
    torch.library.opcheck(torch.ops.shardkit.bucket_rows.default, (values, lengths, [0, 4, 8]))


def test_pooled_forward_compiles_and_differentiates_as_eager():
    """Inside a compiled function, with dynamic sizes: the forward and both gradients (the
    table's and the per-sample weights') equal eager's."""
    weight, ids, offsets, psw = _batch(True)

    def step(weight, ids, offsets, psw):
        out = torch.ops.shardkit.pooled_forward(weight, ids, offsets, psw, 2)
        return (out.sin() * torch.arange(out.numel()).view_as(out)).sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend="aot_eager")
    grads = []
    for fn in (step, compiled):
        w, p = weight.clone().requires_grad_(), psw.clone().requires_grad_()
        fn(w, ids, offsets, p).backward()
        grads.append((w.grad, p.grad))
    torch.testing.assert_close(grads[1], grads[0])
