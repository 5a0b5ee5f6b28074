"""RankPool keeps ranks (and their process group) between runs and recovers after a failure."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from shardkit.launch import RankFailedError, RankPool


def _pid_and_sum(rank: int, world_size: int, value: float):
    t = torch.tensor([value * (rank + 1)])
    dist.all_reduce(t)
    return os.getpid(), t.item()


def _fail(rank: int, world_size: int):
    raise RuntimeError(f"planned failure on rank {rank}")


@pytest.mark.slow
def test_pool_reuses_ranks_and_restarts_after_failure():
    with RankPool(2, timeout=30) as pool:
        first = pool.run(_pid_and_sum, 1.0)
        second = pool.run(_pid_and_sum, 2.0)
        assert [pid for pid, _ in first] == [pid for pid, _ in second], "same processes"
        assert [s for _, s in second] == [6.0, 6.0]
        with pytest.raises(RankFailedError, match="planned failure on rank"):
            pool.run(_fail)
        assert not pool.started
        third = pool.run(_pid_and_sum, 1.0)
        assert {pid for pid, _ in third}.isdisjoint(pid for pid, _ in first)
        assert [s for _, s in third] == [3.0, 3.0]
