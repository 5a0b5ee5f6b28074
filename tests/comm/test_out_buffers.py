"""``out=`` on all-gather and reduce-scatter: the result lands in the caller's tensor (the same
object is returned), equals the allocating call's result, and wrong buffers are refused before
any data moves. See [Note: out buffers]."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shardkit import comm


def _input(rank: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, 3, generator=torch.Generator().manual_seed(100 + rank))


def _out_rank(rank: int, ws: int, via_all_to_all: bool):
    x = _input(rank, 2)
    gathered = torch.full((2 * ws, 3), float("nan"))
    handle = comm.all_gather_into_tensor(x, out=gathered, async_op=True)
    assert handle.wait() is gathered
    big = _input(rank, 2 * ws)
    reduced = torch.full((2, 3), float("nan"))
    result = comm.reduce_scatter_tensor(
        big, op=dist.ReduceOp.AVG, out=reduced, via_all_to_all=via_all_to_all
    )
    assert result is reduced
    # the same buffer again (reuse from step to step) gives the new values, not stale ones
    comm.all_gather_into_tensor(x * 2, out=gathered)
    return gathered, reduced


@pytest.mark.parametrize("via_all_to_all", [False, True])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_out_buffers_match_the_formula(run_ranks, ws, via_all_to_all):
    inputs = [_input(r, 2) for r in range(ws)]
    big = [_input(r, 2 * ws) for r in range(ws)]
    average = sum(big) / ws
    for rank, (gathered, reduced) in enumerate(run_ranks(_out_rank, ws, via_all_to_all)):
        torch.testing.assert_close(gathered, torch.cat(inputs) * 2)
        torch.testing.assert_close(reduced, average[2 * rank : 2 * rank + 2])


def _out_errors_rank(rank: int, ws: int):
    x = torch.ones(2, 3)
    cases = [
        (
            lambda: comm.all_gather_into_tensor(x, out=torch.empty(3, 3)),
            r"all_gather_into_tensor: out is \(3, 3\) torch\.float32 on cpu, but the output is "
            r"\(4, 3\) torch\.float32 on cpu; give out that shape",
        ),
        (
            lambda: comm.reduce_scatter_tensor(x, out=torch.empty(1, 3, dtype=torch.float64)),
            r"reduce_scatter_tensor: out is \(1, 3\) torch\.float64 .* but the output is \(1, 3\) "
            r"torch\.float32",
        ),
        (
            lambda: comm.all_gather_into_tensor(x, out=torch.empty(3, 4).t()),
            r"out must be contiguous",
        ),
        (
            lambda: comm.all_gather_into_tensor(
                torch.ones(rank + 1, 3), output_split_sizes=[1, 2], out=torch.empty(3, 3)
            ),
            r"out= needs equal sizes on every rank, got \[1, 2\]",
        ),
        (
            lambda: comm.all_gather_into_tensor(x.clone().requires_grad_(), out=torch.empty(4, 3)),
            r"out= on a tensor that requires grad cannot be differentiated",
        ),
    ]
    for call, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
    with pytest.raises(TypeError, match=r"out must be a torch\.Tensor, got list"):
        comm.all_gather_into_tensor(x, out=[0.0])
    comm.barrier()  # nothing was launched: the ranks are still in step
    return True


def test_out_buffers_refuse_wrong_tensors(run_ranks):
    assert run_ranks(_out_errors_rank, 2) == [True, True]
