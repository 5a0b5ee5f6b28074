"""Training with every strategy equals training the unsharded model on the global batch.

Each rank builds the same model from a seed, wraps it, trains ``STEPS`` steps on its chunk of each
global batch (mean loss, so the average of the ranks' gradients is the global gradient) and returns
the full state dict; the parent trains the unsharded model on the global batches in one process
and compares parameters and buffers (float32, atol 1e-5, rtol 1e-4; see `models.TOL`). Sizes do
not divide by the world size, the root unit mixes frozen, 0-dim and trainable parameters.
"""

from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch

from shardkit.fsdp import (
    CPUOffload,
    FullyShardedDataParallel,
    MixedPrecision,
    ShardingStrategy,
    fully_shard,
)
from shardkit.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy
from tests.fsdp.models import (
    OPTIMIZERS,
    Block,
    assert_state_equal,
    batches,
    loss_fn,
    make_model,
    reference,
    train,
)
from tests.fsdp.sharded import full_state

WRAPS = {
    "none": None,
    "size": functools.partial(size_based_auto_wrap_policy, min_num_params=100),
    "blocks": ModuleWrapPolicy({Block}),
}


def _train_wrapper(rank, ws, strategy, wrap, optimizer, offload=False, mp=None):
    model = FullyShardedDataParallel(
        make_model(),
        sharding_strategy=ShardingStrategy[strategy],
        auto_wrap_policy=WRAPS[wrap],
        cpu_offload=CPUOffload(offload_params=offload),
        mixed_precision=mp,
    )
    train(model, OPTIMIZERS[optimizer](model.parameters()), batches(ws), rank, ws)
    return full_state(model)


def _train_fully_shard(rank, ws, strategy, optimizer, offload=False):
    model = make_model()
    kwargs = {
        "strategy": ShardingStrategy[strategy],
        "offload_policy": CPUOffload(offload_params=offload),
    }
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    train(model, OPTIMIZERS[optimizer](model.parameters()), batches(ws), rank, ws)
    return full_state(model)


@pytest.mark.parametrize("optimizer", ["adam", "adadelta"])
@pytest.mark.parametrize("wrap", ["none", "size"])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_wrapper_matches_single_process(run_ranks, ws, strategy, wrap, optimizer):
    results = run_ranks(_train_wrapper, ws, strategy, wrap, optimizer)
    want = reference(ws, optimizer)
    for got in results:
        assert_state_equal(got, want)


@pytest.mark.parametrize("wrap", ["none", "blocks"])
@pytest.mark.parametrize(("ws", "per_host"), [(1, 1), (2, 1), (2, 2), (3, 3), (4, 2)])
def test_hybrid_shard_matches_single_process(run_ranks, ws, per_host, wrap):
    results = run_ranks(_train_wrapper, ws, "HYBRID_SHARD", wrap, "adam", local_world_size=per_host)
    want = reference(ws, "adam")
    for got in results:
        assert_state_equal(got, want)


@pytest.mark.parametrize("optimizer", ["adam", "adadelta"])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_fully_shard_matches_single_process(run_ranks, ws, strategy, optimizer):
    results = run_ranks(_train_fully_shard, ws, strategy, optimizer)
    want = reference(ws, optimizer)
    for got in results:
        assert_state_equal(got, want)


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_cpu_offload_matches_single_process(run_ranks, ws, strategy):
    results = run_ranks(_train_wrapper, ws, strategy, "blocks", "adam", True)
    results += run_ranks(_train_fully_shard, ws, strategy, "adadelta", True)
    for got, optimizer in zip(results, ["adam"] * ws + ["adadelta"] * ws):
        assert_state_equal(got, reference(ws, optimizer))


# ---- mixed precision ----------------------------------------------------------------------------


@contextlib.contextmanager
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks run one thread each: same kernels, same rounding
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _mixed_reference(ws: int, mp: MixedPrecision) -> dict[str, torch.Tensor]:
    """What FSDP computes, in one process: each rank's forward and backward with parameters cast
    to ``param_dtype``, gradients cast to the reduce dtype, summed in rank order and scaled by
    ``1 / ws`` (an AVG reduction), then an fp32 SGD step on the fp32 parameters."""
    model = make_model()
    optimizer = OPTIMIZERS["sgd"](model.parameters())
    reduce_dtype = mp.reduce_dtype or mp.param_dtype
    with _one_thread():
        for batch in batches(ws):
            total = None
            for rank in range(ws):
                low = copy.deepcopy(model)
                for param in low.parameters():
                    param.data = param.data.to(mp.param_dtype)
                x, y = (t.chunk(ws)[rank] for t in batch)
                loss_fn(low, x.to(mp.param_dtype), y).backward()
                grads = [
                    p.grad.to(reduce_dtype) if p.grad is not None else None
                    for p in low.parameters()
                ]
                total = (
                    grads
                    if total is None
                    else [a + b if a is not None else None for a, b in zip(total, grads)]
                )
            for param, grad in zip(model.parameters(), total):
                param.grad = None if grad is None else (grad * (1.0 / ws)).float()
            optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize("reduce_dtype", [torch.float32, None])
@pytest.mark.parametrize("ws", [2, 3])
def test_mixed_precision_bfloat16_matches_emulation(run_ranks, ws, reduce_dtype):
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    results = run_ranks(_train_wrapper, ws, "FULL_SHARD", "blocks", "sgd", False, mp)
    want = _mixed_reference(ws, mp)
    for got in results:
        assert_state_equal(got, want, atol=2e-3, rtol=1e-2)
        # and not simply the float32 result: the low precision really was used
        fp32 = reference(ws, "sgd")
        assert any(not torch.equal(got[k], fp32[k]) for k in fp32 if k != "frozen")


def _buffer_dtype(rank, ws):
    mp = MixedPrecision(buffer_dtype=torch.bfloat16)
    model = FullyShardedDataParallel(make_model(), mixed_precision=mp)
    during = model.module.offset.dtype
    model(batches(ws)[0][0][:2]).sum().backward()
    states = model.state_dict()
    return during, states["offset"]


def test_buffer_dtype_is_used_in_forward_and_saved_in_the_original_dtype(run_ranks):
    want = make_model().offset.to(torch.bfloat16).float()
    for during, saved in run_ranks(_buffer_dtype, 2):
        assert during == torch.bfloat16
        assert saved.dtype == torch.float32
        torch.testing.assert_close(saved, want)


# ---- FSDP2's names ------------------------------------------------------------------------------


def _train_fsdp2_style(rank, ws, kwargs, optimizer, reshards=None):
    from shardkit.fsdp._state import get_state

    model = make_model()
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    if reshards is not None:
        assert get_state(model.blocks[0]).config.reshard_after_forward is reshards
    train(model, OPTIMIZERS[optimizer](model.parameters()), batches(ws), rank, ws)
    return full_state(model)


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_keywords_train_like_single_process(run_ranks, reshard):
    """``reshard_after_forward`` and ``CPUOffloadPolicy``, as FSDP2 code writes them."""
    from shardkit.fsdp import CPUOffloadPolicy

    kwargs = {"reshard_after_forward": reshard, "offload_policy": CPUOffloadPolicy()}
    for got in run_ranks(_train_fsdp2_style, 2, kwargs, "adam", reshard):
        assert_state_equal(got, reference(2, "adam"))


def test_fsdp2_mixed_precision_policy_matches_emulation(run_ranks):
    from shardkit.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    results = run_ranks(_train_fsdp2_style, 2, {"mp_policy": policy}, "sgd")
    want = _mixed_reference(
        2, MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    )
    for got in results:
        assert_state_equal(got, want, atol=2e-3, rtol=1e-2)


def _fsdp2_errors(rank, ws):
    from shardkit.fsdp import MixedPrecisionPolicy

    found = []
    for kwargs in (
        {"reshard_after_forward": 2},
        {"reshard_after_forward": True, "strategy": ShardingStrategy.NO_SHARD},
        {"reshard_after_forward": False, "strategy": ShardingStrategy.FULL_SHARD},
        {"mp_policy": MixedPrecisionPolicy(output_dtype=torch.bfloat16)},
    ):
        try:
            fully_shard(make_model(), **kwargs)
        except ValueError as exc:
            found.append(str(exc))
    return found


def test_fsdp2_arguments_shardkit_lacks_are_refused(run_ranks):
    messages = run_ranks(_fsdp2_errors, 1)[0]
    assert len(messages) == 4
    assert "reshard_after_forward=2" in messages[0] and "True (FULL_SHARD)" in messages[0]
    assert "disagree" in messages[1] and "disagree" in messages[2]
    assert "output_dtype" in messages[3]


def _train_on_2d_mesh(rank, ws):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("replicate", "shard"))
    model = make_model()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)  # FSDP2's HSDP: the strategy follows the mesh
    fully_shard(model, mesh=mesh)
    rows = model.blocks[0].up.weight.shape[0]  # 11 rows split 2 ways (hybrid), not 4 ways
    assert rows in (5, 6), rows
    train(model, OPTIMIZERS["adam"](model.parameters()), batches(ws), rank, ws)
    return full_state(model)


def test_fsdp2_two_dimensional_mesh_is_hybrid_sharding(run_ranks):
    for got in run_ranks(_train_on_2d_mesh, 4, local_world_size=2):
        assert_state_equal(got, reference(4, "adam"))
