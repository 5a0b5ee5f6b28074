"""Bad arguments get a clear error before any data moves; mismatches between ranks are caught in
debug mode on every rank; a collective that times out says which one it was."""

from __future__ import annotations

import re
import time

import pytest
import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.launch import RankFailedError, spawn


def _expect_local_errors(rank: int, ws: int):
    x = torch.ones(4, 2)
    cases = [
        (
            lambda: comm.all_to_all_single(x, input_split_sizes=[1, 1]),
            r"input_split_sizes \[1, 1\] sum to 2 but the input has 4 rows",
        ),
        (
            lambda: comm.all_to_all_single(x, input_split_sizes=[4]),
            r"input_split_sizes has 1 entries but the group has 2 ranks",
        ),
        (
            lambda: comm.all_to_all_single(x, input_split_sizes=[5, -1]),
            r"input_split_sizes must be integers >= 0, got \[5, -1\]",
        ),
        (
            lambda: comm.all_to_all_single(x, output_split_sizes=[2, 2]),
            r"output_split_sizes given without input_split_sizes",
        ),
        (
            lambda: comm.all_to_all_single(torch.ones(3)),
            r"3 rows do not split evenly over 2 ranks",
        ),
        (
            lambda: comm.all_gather_into_tensor(x, output_split_sizes=[1, 1]),
            rf"output_split_sizes\[{rank}\] is 1 but this rank's input has 4 rows",
        ),
        (
            lambda: comm.reduce_scatter_tensor(x, input_split_sizes=[3, 3]),
            r"sum to 6 but the input has 4 rows",
        ),
        (
            lambda: comm.all_reduce(x.clone().requires_grad_(), op=dist.ReduceOp.MAX),
            r"only SUM and AVG are differentiable",
        ),
        (lambda: comm.all_gather_into_tensor(torch.tensor(1.0)), r"at least 1 dimension"),
        (lambda: comm.broadcast(x, src=5), r"src must be a rank in \[0, 2\), got 5"),
    ]
    for call, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
    with pytest.raises(TypeError, match=r"input must be a torch\.Tensor, got list"):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match=r"AVG needs a floating dtype, got torch\.int64"):
        comm.reduce_scatter_tensor(torch.ones(4, dtype=torch.int64), op=dist.ReduceOp.AVG)
    comm.barrier()  # every rank is still in step after all those errors
    return True


def test_local_errors_on_every_rank(run_ranks):
    assert run_ranks(_expect_local_errors, 2) == [True, True]


def _mismatch_rank(rank: int, ws: int, case: str):
    comm.set_debug(True)
    try:
        with pytest.raises(comm.CollectiveMismatchError) as info:
            if case == "op":
                if rank == 0:
                    comm.all_reduce(torch.ones(3))
                else:
                    comm.all_gather_into_tensor(torch.ones(3))
            elif case == "dtype":
                comm.all_reduce(torch.ones(3, dtype=torch.float32 if rank else torch.float64))
            elif case == "splits":
                # rank 0 claims it receives 2 rows from rank 1, which sends only 1
                sends = [[1, 1], [1, 1]][rank]
                receives = [[1, 2], [1, 1]][rank]
                comm.all_to_all_single(
                    torch.ones(2), input_split_sizes=sends, output_split_sizes=receives
                )
            elif case == "gather":
                comm.all_gather_into_tensor(torch.ones(rank + 1))
        return str(info.value)
    finally:
        comm.set_debug(False)


@pytest.mark.parametrize(
    ("case", "pattern"),
    [
        ("op", r"ranks disagree on op \(rank 0: all_reduce, rank 1: all_gather_into_tensor\)"),
        ("dtype", r"ranks disagree on dtype \(rank 0: torch.float64, rank 1: torch.float32\)"),
        ("splits", r"rank 1 sends 1 rows to rank 0, which expects 2"),
        ("gather", r"they give \[1, 2\] rows; pass output_split_sizes=\[1, 2\] on every rank"),
    ],
)
def test_debug_mode_catches_mismatch_on_every_rank(run_ranks, case, pattern):
    messages = run_ranks(_mismatch_rank, 2, case)
    for message in messages:
        assert re.search(pattern, message), message


def _one_rank_skips(rank: int, ws: int):
    if rank == 0:
        comm.all_reduce(torch.ones(2))


def test_timeout_names_the_collective():
    start = time.monotonic()
    with pytest.raises(RankFailedError, match=r"shardkit.comm.all_reduce timed out on rank 0"):
        spawn(_one_rank_skips, world_size=2, timeout=2)
    assert time.monotonic() - start < 30
