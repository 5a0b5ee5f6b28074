"""TrainPipelineSparseDist: the same training as a plain loop, with each batch's input dist
started one step ahead; ranks that run out of data at different times fail together."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from shardkit.distributed import DistributedModelParallel
from shardkit.models import DLRMTrain
from shardkit.sharding import (
    DataExhaustedError,
    ShardedEmbeddingBagCollection,
    TrainPipelineSparseDist,
)
from tests.sharding.common import dlrm, dlrm_batch, local_part

B = 4


def _batches(rank: int, world_size: int, count: int):
    for step in range(count):
        dense, sparse, labels = dlrm_batch(step, B * world_size)
        mine = slice(rank * B, (rank + 1) * B)
        yield SimpleNamespace(
            dense_features=dense[mine],
            sparse_features=local_part(sparse, rank, world_size),
            labels=labels[mine],
        )


def _pipelined_vs_plain(rank: int, world_size: int):
    torch.manual_seed(0)
    base = DLRMTrain(dlrm())
    runs = {}
    for mode in ("plain", "pipelined"):
        model = DistributedModelParallel(copy.deepcopy(base))
        optimizer = torch.optim.SGD(
            [p for n, p in model.named_parameters() if ".shards." not in n], lr=0.1
        )
        sharded = next(m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection))
        calls = []
        original = sharded.input_dist

        def record(features, original=original, calls=calls):
            import traceback

            calls.append(
                "prefetch"
                if any(f.name == "prefetch" for f in traceback.extract_stack())
                else "forward"
            )
            return original(features)

        sharded.input_dist = record
        losses = []
        if mode == "plain":
            for batch in _batches(rank, world_size, 6):
                optimizer.zero_grad()
                loss, _ = model(batch)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        else:
            pipeline = TrainPipelineSparseDist(model, optimizer)
            batches = _batches(rank, world_size, 6)
            while True:
                try:
                    loss, _, _ = pipeline.progress(batches)
                except StopIteration:
                    break
                losses.append(loss.item())
        state = {
            k: v.clone()
            for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor) and type(v) is torch.Tensor
        }
        runs[mode] = (losses, state, calls)
    return runs


def test_pipeline_trains_like_a_plain_loop_with_input_dist_one_step_ahead(run_ranks):
    for runs in run_ranks(_pipelined_vs_plain, 2):
        plain_losses, plain_state, plain_calls = runs["plain"]
        losses, state, calls = runs["pipelined"]
        assert losses == pytest.approx(plain_losses, abs=1e-6)
        for key in plain_state:
            torch.testing.assert_close(state[key], plain_state[key])
        assert plain_calls == ["forward"] * 6
        assert calls == ["prefetch"] * 6, "every batch's ids were sent ahead of its forward"


def _uneven_data(rank: int, world_size: int):
    torch.manual_seed(0)
    model = DistributedModelParallel(DLRMTrain(dlrm()))
    optimizer = torch.optim.SGD(
        [p for n, p in model.named_parameters() if ".shards." not in n], lr=0.1
    )
    pipeline = TrainPipelineSparseDist(model, optimizer)
    batches = _batches(rank, world_size, 3 if rank == 1 else 5)
    steps = 0
    with pytest.raises(DataExhaustedError) as info:
        while True:
            pipeline.progress(batches)
            steps += 1
    return steps, str(info.value)


def test_a_rank_that_runs_out_of_data_first_stops_every_rank(run_ranks):
    for steps, message in run_ranks(_uneven_data, 2):
        assert steps == 2  # the third batch's successor is missing on rank 1
        assert "rank(s) [1] ran out of data after 3 batch(es) while the others have more" in message
