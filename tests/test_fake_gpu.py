"""The fake GPU of the device tier refuses what a GPU refuses, and catches a CPU-only factory
call put back into shardkit (see [Note: the fake GPU] in tests/fake_gpu.py).

The checks run in a rank of their own (``run_ranks(..., device="fakegpu")``), never in the
pytest process: registering the device is for the life of a process.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from shardkit.sharding import (
    ShardedEmbeddingBagCollection,
    construct_module_sharding_plan,
    row_wise,
)
from shardkit.types import ShardingEnv
from tests.fake_gpu import DeviceMismatch, host_syncs
from tests.sharding.common import global_batch, local_part


def _rules(rank: int, world_size: int, *, device: torch.device):
    x = torch.ones(3, device=device)
    assert type(x).__name__ == "FakeGpuTensor" and x.device == device
    assert torch.tensor([1, 2], device=device).device == device
    assert (x * torch.tensor(2.0)).device == device, "0-dim CPU tensors mix, as on CUDA"
    with pytest.raises(DeviceMismatch, match=r"aten.add.Tensor mixes tensors on fakegpu:0 with"):
        x + torch.ones(3)
    with pytest.raises(DeviceMismatch, match=r"CPU tensors of shapes \[\(2,\)\]"):
        torch.cat([x, torch.zeros(2)])
    y = torch.empty(3)
    y.copy_(x)  # copies between devices are explicit transfers, allowed
    before = host_syncs().count
    moved, listed = x.cpu(), x.tolist()
    assert host_syncs().count == before + 2, "each read by the host is a sync"
    summed = torch.zeros(2, device=device)
    dist.all_reduce(summed.add_(rank + 1))  # gloo carries the fake GPU's data
    return y.tolist(), moved.device.type, listed, summed.cpu().tolist()


def test_the_fake_gpu_refuses_mixed_devices_like_a_gpu(run_ranks):
    results = run_ranks(_rules, 2, device="fakegpu")
    for copied, moved, listed, summed in results:
        assert copied == [1.0, 1.0, 1.0] and moved == "cpu" and listed == [1.0, 1.0, 1.0]
        assert summed == [3.0, 3.0]


def _old_weights(jt, config):
    """`shardkit.sharding._dist._source._weights` as it was before the device audit."""
    weights = jt.weights_or_none()
    weights = None if weights is None else weights.float()
    num_ids = jt.values().numel()
    if getattr(config, "pooling", PoolingType.SUM) == PoolingType.MEAN:
        from shardkit.modules import mean_as_weights

        return mean_as_weights(jt.lengths(), weights, num_ids=num_ids)
    return torch.ones(num_ids) if weights is None else weights  # the CPU-only factory call


def _step(rank: int, world_size: int, put_back: bool, *, device: torch.device):
    """One step of a sharded EBC whose MEAN table makes the input dist send weights; with
    ``put_back``, the SUM table's weights come from the old CPU-only ``torch.ones(n)``."""
    import shardkit.sharding._dist._source as inputs

    tables = [
        EmbeddingBagConfig(
            name="mean", embedding_dim=4, num_embeddings=11, feature_names=["a", "b"],
            pooling=PoolingType.MEAN,
        ),
        EmbeddingBagConfig(name="sum", embedding_dim=4, num_embeddings=7, feature_names=["c"]),
    ]  # fmt: skip
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=tables)
    plan = _row_wise_plan(ebc, world_size)
    sharded = ShardedEmbeddingBagCollection(
        ebc, plan, ShardingEnv.from_process_group(dist.group.WORLD), device
    )
    kjt = global_batch(0, 2 * world_size, False).permute([0, 1, 2])  # features a, b, c
    mine = local_part(kjt, rank, world_size).to(device)
    fixed = inputs._weights
    if put_back:
        inputs._weights = _old_weights
    try:
        sharded(mine).values().sum().backward()
    except DeviceMismatch as exc:
        return str(exc)
    finally:
        inputs._weights = fixed
    return "ran"


def _row_wise_plan(ebc, world_size):
    return construct_module_sharding_plan(
        ebc, {"mean": row_wise(), "sum": row_wise()}, world_size=world_size, device_type="cpu"
    )


@pytest.mark.parametrize("put_back", [False, True])
def test_a_cpu_only_factory_call_put_back_fails_the_device_tier(run_ranks, put_back):
    results = run_ranks(_step, 2, put_back, device="fakegpu")
    if not put_back:
        assert results == ["ran", "ran"]
        return
    for message in results:
        assert "mixes tensors on fakegpu:0 with CPU tensors" in message, message


def test_the_cpu_tier_cannot_see_that_bug(run_ranks):
    """The same put-back call on the CPU tier: nothing to notice (why the device tier exists)."""
    assert run_ranks(_step, 2, True, device="cpu") == ["ran", "ran"]
