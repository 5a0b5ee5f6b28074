"""The train pipeline's schedule is the same on every rank ([Note: when the pipeline
overlaps]): ranks that would choose differently (other core counts) all run synchronously."""

from __future__ import annotations

import torch

from shardkit.data import Batch
from shardkit.distributed import DistributedModelParallel
from shardkit.models import DLRMTrain
from shardkit.sharding import TrainPipelineSparseDist
from shardkit.sharding._pipeline import _schedule as _pipeline_schedule
from tests.sharding.common import dlrm, dlrm_batch, local_part


def _mixed_choices(rank: int, world_size: int):
    # Rank 0 would overlap, rank 1 would not (as on hosts with other core counts)
    _pipeline_schedule.choose_overlap = lambda *a, **k: (rank == 0, f"rank {rank}'s host")
    torch.manual_seed(0)
    model = DistributedModelParallel(DLRMTrain(dlrm()))
    pipeline = TrainPipelineSparseDist(model, torch.optim.SGD(model.parameters(), lr=0.1))
    batches = []
    for step in range(3):
        dense, sparse, labels = dlrm_batch(step, 4 * world_size)
        mine = slice(rank * 4, (rank + 1) * 4)
        batches.append(Batch(dense[mine], local_part(sparse, rank, world_size), labels[mine]))
    batches = iter(batches)
    for _ in range(3):
        pipeline.progress(batches)
    return pipeline._overlap


def test_ranks_that_would_choose_other_schedules_all_run_synchronously(run_ranks):
    assert run_ranks(_mixed_choices, 2) == [False, False]
