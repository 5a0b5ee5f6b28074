"""Every collective, forward and backward, against its single-process formula.

Each rank builds its input from a seed (so the parent can rebuild every rank's input), runs the
collective, backpropagates ``sum(output * weight_of_rank)`` and returns output and input gradient.
The parent computes both with plain tensor arithmetic in float64 and compares.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.comm._autograd import run
from shardkit.comm._ops import ReduceScatter

WORLD_SIZES = [1, 2, 3, 4]
DTYPES = ["float32", "float64", "bfloat16"]
TOL = {
    "float32": {"atol": 1e-5, "rtol": 1e-5},
    "float64": {"atol": 1e-12, "rtol": 1e-12},
    "bfloat16": {"atol": 3e-2, "rtol": 2e-2},
}
COLS = 3


def _tensor(seed: int, rows: int, dtype: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, COLS, generator=g, dtype=torch.float64).to(getattr(torch, dtype))


def _input(rank: int, rows: int, dtype: str) -> torch.Tensor:
    return _tensor(1000 + rank, rows, dtype)


def _weight(rank: int, rows: int, dtype: str) -> torch.Tensor:
    return _tensor(2000 + rank, rows, dtype)


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64)


def _forward_backward(x: torch.Tensor, out: torch.Tensor, rank: int, dtype: str):
    (out * _weight(rank, out.shape[0], dtype)).sum().backward()
    return out.detach(), x.grad


def _check(results, expected_out, expected_grad, dtype):
    for rank, (out, grad) in enumerate(results):
        torch.testing.assert_close(_f64(out), expected_out[rank], **TOL[dtype])
        torch.testing.assert_close(_f64(grad), expected_grad[rank], **TOL[dtype])


# ---- all-to-all --------------------------------------------------------------------------------


def _a2a_splits(ws: int, mode: str) -> list[list[int]]:
    """splits[i][j]: rows rank i sends to rank j; 'uneven' includes empty splits."""
    if mode == "even":
        return [[2] * ws for _ in range(ws)]
    return [[(i + 2 * j) % 3 for j in range(ws)] for i in range(ws)]


def _a2a_rank(rank: int, ws: int, dtype: str, mode: str):
    splits = _a2a_splits(ws, mode)
    x = _input(rank, sum(splits[rank]), dtype).requires_grad_()
    if mode == "even":
        out = comm.all_to_all_single(x)
    elif mode == "exchange":
        out = comm.all_to_all_single(x, input_split_sizes=splits[rank])
    else:
        receive = [splits[i][rank] for i in range(ws)]
        out = comm.all_to_all_single(x, input_split_sizes=splits[rank], output_split_sizes=receive)
    return _forward_backward(x, out, rank, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ws", WORLD_SIZES)
@pytest.mark.parametrize("mode", ["even", "exchange", "uneven"])
def test_all_to_all(run_ranks, ws, dtype, mode):
    results = run_ranks(_a2a_rank, ws, dtype, mode)
    splits = _a2a_splits(ws, mode)
    pieces = [torch.split(_f64(_input(i, sum(splits[i]), dtype)), splits[i]) for i in range(ws)]
    expected_out = [torch.cat([pieces[i][j] for i in range(ws)]) for j in range(ws)]
    weights = [
        torch.split(_f64(_weight(j, expected_out[j].shape[0], dtype)), [s[j] for s in splits])
        for j in range(ws)
    ]
    expected_grad = [torch.cat([weights[j][i] for j in range(ws)]) for i in range(ws)]
    _check(results, expected_out, expected_grad, dtype)


# ---- all-gather --------------------------------------------------------------------------------


def _gather_sizes(ws: int, mode: str) -> list[int]:
    return [2] * ws if mode == "even" else [(2 * r + 1) % 3 for r in range(ws)]


def _gather_rank(rank: int, ws: int, dtype: str, mode: str):
    sizes = _gather_sizes(ws, mode)
    x = _input(rank, sizes[rank], dtype).requires_grad_()
    given = None if mode == "even" else sizes
    out = comm.all_gather_into_tensor(x, output_split_sizes=given)
    return _forward_backward(x, out, rank, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ws", WORLD_SIZES)
@pytest.mark.parametrize("mode", ["even", "uneven"])
def test_all_gather(run_ranks, ws, dtype, mode):
    results = run_ranks(_gather_rank, ws, dtype, mode)
    sizes = _gather_sizes(ws, mode)
    full = torch.cat([_f64(_input(r, sizes[r], dtype)) for r in range(ws)])
    weight_sum = sum(_f64(_weight(r, full.shape[0], dtype)) for r in range(ws))
    expected_grad = list(torch.split(weight_sum, sizes))
    _check(results, [full] * ws, expected_grad, dtype)


# ---- reduce-scatter ----------------------------------------------------------------------------


def _scatter_sizes(ws: int, mode: str) -> list[int]:
    return [2] * ws if mode == "even" else [(r + 1) % 3 for r in range(ws)]


def _scatter_rank(rank: int, ws: int, dtype: str, mode: str, op: str, via_all_to_all: bool):
    sizes = _scatter_sizes(ws, mode)
    x = _input(rank, sum(sizes), dtype).requires_grad_()
    reduce_op = getattr(dist.ReduceOp, op)
    scale = 1.0 / ws if op == "AVG" else 1.0
    base = dist.ReduceOp.SUM if op == "AVG" else reduce_op
    forced = ReduceScatter(None, base, tuple(sizes), scale, via_all_to_all)
    out = run(forced, x, async_op=False)  # the backend's own operation, or the fallback
    given = None if mode == "even" else sizes
    public = comm.reduce_scatter_tensor(x.detach(), op=reduce_op, input_split_sizes=given)
    loose = {"rtol": 0.05, "atol": 0.01} if dtype == "bfloat16" else {}  # other summation order
    torch.testing.assert_close(public, out.detach(), **loose)  # the path the backend picks
    return _forward_backward(x, out, rank, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ws", WORLD_SIZES)
@pytest.mark.parametrize("mode", ["even", "uneven"])
@pytest.mark.parametrize("op", ["SUM", "AVG"])
@pytest.mark.parametrize("via_all_to_all", [False, True], ids=["native", "fallback"])
def test_reduce_scatter(run_ranks, ws, dtype, mode, op, via_all_to_all):
    results = run_ranks(_scatter_rank, ws, dtype, mode, op, via_all_to_all)
    sizes = _scatter_sizes(ws, mode)
    scale = 1.0 / ws if op == "AVG" else 1.0
    total = sum(_f64(_input(r, sum(sizes), dtype)) for r in range(ws)) * scale
    expected_out = list(torch.split(total, sizes))
    grad = torch.cat([_f64(_weight(r, sizes[r], dtype)) for r in range(ws)]) * scale
    _check(results, expected_out, [grad] * ws, dtype)


def _scatter_max_rank(rank: int, ws: int, via_all_to_all: bool):
    sizes = _scatter_sizes(ws, "uneven")
    x = _input(rank, sum(sizes), "float32")
    op = ReduceScatter(None, dist.ReduceOp.MAX, tuple(sizes), 1.0, via_all_to_all)
    return run(op, x, async_op=False)


@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("via_all_to_all", [False, True], ids=["native", "fallback"])
def test_reduce_scatter_max(run_ranks, ws, via_all_to_all):
    results = run_ranks(_scatter_max_rank, ws, via_all_to_all)
    sizes = _scatter_sizes(ws, "uneven")
    stacked = torch.stack([_input(r, sum(sizes), "float32") for r in range(ws)])
    expected = torch.split(stacked.amax(0), sizes)
    for out, want in zip(results, expected):
        torch.testing.assert_close(out, want)


# ---- all-reduce and broadcast ------------------------------------------------------------------


def _all_reduce_rank(rank: int, ws: int, dtype: str, op: str):
    x = _input(rank, 4, dtype).requires_grad_()
    out = comm.all_reduce(x, op=getattr(dist.ReduceOp, op))
    result = _forward_backward(x, out, rank, dtype)
    assert torch.equal(x.detach(), _input(rank, 4, dtype)), "all_reduce must not modify its input"
    return result


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ws", WORLD_SIZES)
@pytest.mark.parametrize("op", ["SUM", "AVG"])
def test_all_reduce(run_ranks, ws, dtype, op):
    results = run_ranks(_all_reduce_rank, ws, dtype, op)
    scale = 1.0 / ws if op == "AVG" else 1.0
    total = sum(_f64(_input(r, 4, dtype)) for r in range(ws)) * scale
    grad = sum(_f64(_weight(r, 4, dtype)) for r in range(ws)) * scale
    _check(results, [total] * ws, [grad] * ws, dtype)


def _broadcast_rank(rank: int, ws: int, dtype: str):
    x = _input(rank, 4, dtype).requires_grad_()
    out = comm.broadcast(x, src=ws - 1)
    return _forward_backward(x, out, rank, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_broadcast(run_ranks, ws, dtype):
    results = run_ranks(_broadcast_rank, ws, dtype)
    src = ws - 1
    grad_src = sum(_f64(_weight(r, 4, dtype)) for r in range(ws))
    expected_grad = [grad_src if r == src else torch.zeros_like(grad_src) for r in range(ws)]
    _check(results, [_f64(_input(src, 4, dtype))] * ws, expected_grad, dtype)


# ---- asynchronous use, objects, profiler labels ------------------------------------------------


def _async_rank(rank: int, ws: int):
    x = torch.full((ws, 2), float(rank), requires_grad=True)
    handle = comm.all_to_all_single(x, async_op=True)
    assert isinstance(handle, comm.Handle)
    local = (x * 2).sum()  # computed while the all-to-all is in flight
    out = handle.wait()
    assert handle.wait() is out, "wait() returns the same tensor every time"
    (out.sum() + local).backward()
    return out.detach(), x.grad, handle.is_completed()


@pytest.mark.parametrize("ws", [2, 3])
def test_async_handle(run_ranks, ws):
    for rank, (out, grad, done) in enumerate(run_ranks(_async_rank, ws)):
        assert done
        assert out[:, 0].tolist() == [float(r) for r in range(ws)]
        assert torch.equal(grad, torch.full((ws, 2), 3.0)), f"rank {rank}"


def _objects_rank(rank: int, ws: int):
    got = comm.broadcast_object({"plan": "x", "from": rank} if rank == 1 else None, src=1)
    everyone = comm.all_gather_object(("rank", rank))
    sizes = comm.all_gather_sizes(rank * 3)
    comm.barrier()
    return got, everyone, sizes


def test_objects_and_sizes(run_ranks):
    for got, everyone, sizes in run_ranks(_objects_rank, 3):
        assert got == {"plan": "x", "from": 1}
        assert everyone == [("rank", 0), ("rank", 1), ("rank", 2)]
        assert sizes == [0, 3, 6]


def _profiled_rank(rank: int, ws: int):
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(ws * 2, 2, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = comm.all_to_all_single(x)
        out.sum().backward()
        comm.all_reduce(torch.ones(2))
    return sorted({e.name for e in prof.events() if e.name.startswith("shardkit::")})


def test_profiler_labels(run_ranks):
    names = run_ranks(_profiled_rank, 2)[0]
    assert "shardkit::all_to_all_single" in names
    assert "shardkit::all_to_all_single.wait" in names
    assert "shardkit::all_to_all_single.backward" in names
    assert "shardkit::all_reduce" in names


def _which_reduce_scatter(rank: int, ws: int):
    """Which path each choice takes on gloo: torch's own operation is made to fail."""

    def refuse(*args, **kwargs):
        raise RuntimeError("the backend's own reduce-scatter ran")

    x = torch.ones(2 * ws, 3)
    own = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else None
    original = getattr(dist, own or "reduce_scatter_tensor")
    setattr(dist, own or "reduce_scatter_tensor", refuse)
    try:
        taken = {}
        for choice in (None, True, False):
            try:
                comm.reduce_scatter_tensor(x, via_all_to_all=choice)
                taken[choice] = "all_to_all"
            except Exception as exc:  # the refusal, perhaps wrapped by comm
                assert "own reduce-scatter ran" in str(exc), exc
                taken[choice] = "own"
    finally:
        setattr(dist, own or "reduce_scatter_tensor", original)
    return taken


def test_reduce_scatter_path_on_gloo(run_ranks):
    """gloo: the all-to-all unless the caller asks for gloo's own (FSDP does, for memory); before
    torch 2.13 gloo had none of its own, so the all-to-all always."""
    own = "own" if hasattr(dist, "reduce_scatter_single") else "all_to_all"
    for taken in run_ranks(_which_reduce_scatter, 2):
        assert taken == {None: "all_to_all", True: "all_to_all", False: own}
