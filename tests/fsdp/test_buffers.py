"""The gather and reduction buffers: parameters gathered and reduced in place (see
[Note: direct parameters]) train like the unsharded model, the pooled unsharded memory (see
[Note: unsharded memory pool]) never aliases a live tensor, and resharding still frees."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from torch import nn

from shardkit.fsdp import FullyShardedDataParallel, ShardingStrategy, fully_shard
from shardkit.fsdp.wrap import ModuleWrapPolicy
from tests.fsdp.models import OPTIMIZERS, Block, assert_state_equal, batches, local, loss_fn
from tests.fsdp.sharded import full_state


class EvenNet(nn.Module):
    """Rows that split evenly over 1, 2 and 3 ranks (gathered in place once the threshold is
    lowered) next to uneven ones (the head's 5 rows, packed), in the same units."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(5, 6)
        self.blocks = nn.Sequential(Block(6, 12), Block(6, 12))
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


def _model() -> EvenNet:
    torch.manual_seed(0)
    return EvenNet()


@contextlib.contextmanager
def _direct_from(numel: int):
    """Gather and reduce in place every evenly split parameter of at least ``numel`` elements."""
    from shardkit.fsdp import _layout

    saved = _layout.DIRECT_MIN_NUMEL
    _layout.DIRECT_MIN_NUMEL = numel
    try:
        yield
    finally:
        _layout.DIRECT_MIN_NUMEL = saved


def _shard(face: str, strategy: str) -> nn.Module:
    if face == "wrapper":
        return FullyShardedDataParallel(
            _model(),
            sharding_strategy=ShardingStrategy[strategy],
            auto_wrap_policy=ModuleWrapPolicy({Block}),
        )
    model = _model()
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=strategy == "FULL_SHARD")
    return fully_shard(model)


def _train(rank, ws, face, strategy, optimizer):
    with _direct_from(1):
        model = _shard(face, strategy)
        from shardkit.fsdp._state import get_state

        unit = get_state(model.blocks[0]) if face == "fully_shard" else None
        if unit is not None and ws > 1:
            assert any(unit.group.buckets[0].direct)  # the path under test runs
        opt = OPTIMIZERS[optimizer](model.parameters())
        for batch in batches(ws, steps=4):
            x, y = local(batch, rank, ws)
            opt.zero_grad()
            loss_fn(model, x, y).backward()
            opt.step()
        return full_state(model), {k: v for k, v in opt.state_dict()["state"][0].items()}


def _reference(ws, optimizer):
    model = _model()
    opt = OPTIMIZERS[optimizer](model.parameters())
    for x, y in batches(ws, steps=4):
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        opt.step()
    return model.state_dict()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
@pytest.mark.parametrize("face", ["wrapper", "fully_shard"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_in_place_gathers_and_reductions_train_like_single_process(
    run_ranks, ws, face, strategy, optimizer
):
    want = _reference(ws, optimizer)
    for got, state in run_ranks(_train, ws, face, strategy, optimizer):
        assert_state_equal(got, want)
        if optimizer == "adam":
            assert int(state["step"]) == 4


def _no_alias(rank, ws):
    """A gradient kept from one step keeps its values through the next (the reduction writes
    into new memory), and units gathered at the same time never share memory."""
    with _direct_from(1):
        model = _shard("fully_shard", "FULL_SHARD")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = batches(ws, steps=3)
        held, values = None, None
        from shardkit.fsdp._state import get_state

        buckets = [b for m in (model, *model.blocks) for b in get_state(m).group.buckets]
        checked = []

        def disjoint(*_):
            spans = sorted(
                (s.data_ptr(), s.data_ptr() + s.nbytes())
                for s in (b.flat_full.untyped_storage() for b in buckets if b.flat_full is not None)
                if s.nbytes()
            )
            assert all(end <= begin for (_, end), (begin, _) in itertools.pairwise(spans)), spans
            checked.append(len(spans))

        for block in model.blocks:
            block.register_forward_pre_hook(disjoint)
            block.register_full_backward_hook(disjoint)
        for step, batch in enumerate(data):
            x, y = local(batch, rank, ws)
            opt.zero_grad()
            loss_fn(model, x, y).backward()
            if step == 0:
                held = model.blocks[0].up.weight.grad
                values = held.to_local().clone()
            opt.step()
        torch.testing.assert_close(held.to_local(), values, rtol=0, atol=0)
        assert max(checked) >= 2  # two units were gathered at once, in different memory
        return True


def test_reused_buffers_do_not_alias_live_tensors(run_ranks):
    assert run_ranks(_no_alias, 2) == [True, True]


def _frees(rank, ws):
    from shardkit.fsdp import _memory
    from shardkit.fsdp._state import get_state

    trims = []
    trim = _memory.release_free_memory
    _memory.release_free_memory = lambda: trims.append(1)  # the pooled rank process's: restored
    try:
        with _direct_from(1):
            model = _shard("wrapper", "FULL_SHARD")
            opt = torch.optim.Adam(model.parameters())
            for batch in batches(ws, steps=2):
                x, y = local(batch, rank, ws)
                opt.zero_grad()
                loss_fn(model, x, y).backward()
                opt.step()
                for block in model.blocks:
                    for bucket in get_state(block).group.buckets:
                        assert bucket.flat_full.untyped_storage().nbytes() == 0  # resharded
                assert len(_memory.UNSHARDED_POOL._free) <= _memory.UNSHARDED_POOL_ENTRIES
            _memory.UNSHARDED_POOL.clear()
    finally:
        _memory.release_free_memory = trim
    # A few hundred bytes of gradients freed: far below the trim budget, so no trim (one at the
    # end of each backward cost a tenth of a small model's step, [Note: returning memory])
    assert trims == []
    return True


def test_resharding_frees_and_the_pool_stays_bounded(run_ranks):
    assert run_ranks(_frees, 2) == [True, True]


def test_trims_when_the_freed_bytes_reach_the_budget_across_iterations(monkeypatch):
    from shardkit.fsdp import _memory

    trims = []
    monkeypatch.setattr(_memory, "release_free_memory", lambda: trims.append(1))
    freed = _memory.FreedMemory()
    quarter = _memory.TRIM_BUDGET_BYTES // 4
    for _ in range(3):  # e.g. three small backwards
        freed.add(quarter)
    assert trims == []
    freed.add(quarter)  # the fourth reaches the budget
    assert trims == [1]
    for _ in range(3):  # counting starts again from zero
        freed.add(quarter)
    assert trims == [1]


def test_fresh_buffers_are_advised_in_whole_2mib_pages(monkeypatch):
    """A CPU buffer's bytes (not its elements) go to the advice; other devices' none."""
    from shardkit.compat import _libc
    from shardkit.fsdp import _memory

    calls = []
    monkeypatch.setattr(_libc, "_madvise", lambda: lambda *a: calls.append(a[:2]) or 0)
    buffer = torch.empty(3 << 20, dtype=torch.float32)  # 12 MiB
    _memory.advise_huge_pages(buffer)
    start, end = buffer.data_ptr(), buffer.data_ptr() + buffer.numel() * 4
    ((begin, length),) = calls
    assert start <= begin < start + (2 << 20) and end - (2 << 20) < begin + length <= end
    _memory.advise_huge_pages(torch.empty(3 << 20, device="meta"))
    assert len(calls) == 1
