"""Training with every strategy equals training the unsharded model on the global batch.

Each rank builds the same model from a seed, wraps it, trains ``STEPS`` steps on its chunk of each
global batch (mean loss, so the average of the ranks' gradients is the global gradient) and returns
the full state dict; the parent trains the unsharded model on the global batches in one process
and compares parameters and buffers (float32, atol 1e-5, rtol 1e-4; see `models.TOL`). Sizes do
not divide by the world size, the root unit mixes frozen, 0-dim and trainable parameters. Every
strategy runs with SGD, whose update is proportional to the gradient (Adam's is not: a gradient
summed instead of averaged over ranks would go unnoticed), and with Adam.
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
    MixedPrecisionPolicy,
    ShardingStrategy,
    fully_shard,
)
from shardkit.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy
from tests.devices import CPU_AND_GPU, DEVICE_TIER
from tests.fake_gpu import to_cpu
from tests.fsdp.models import (
    OPTIMIZERS,
    Block,
    assert_state_equal,
    batches,
    fsdp2_kwargs,
    local,
    loss_fn,
    make_model,
    reference,
    shard_blocks,
    train,
)
from tests.fsdp.sharded import full_state

WRAPS = {
    "none": None,
    "size": functools.partial(size_based_auto_wrap_policy, min_num_params=100),
    "blocks": ModuleWrapPolicy({Block}),
}


def _train_wrapper(rank, ws, strategy, wrap, optimizer, offload=False, mp=None, *, device=None):
    """Computing on ``device`` (default: the rank's), from a model built on the CPU."""
    model = FullyShardedDataParallel(
        make_model(),
        sharding_strategy=ShardingStrategy[strategy],
        auto_wrap_policy=WRAPS[wrap],
        cpu_offload=CPUOffload(offload_params=offload),
        mixed_precision=mp,
        device_id=device,
    )
    train(model, OPTIMIZERS[optimizer](model.parameters()), batches(ws), rank, ws, device)
    return to_cpu(full_state(model))


def _train_fully_shard(rank, ws, strategy, optimizer, offload=False, per_host=None, *, device=None):
    kwargs = fsdp2_kwargs(strategy, ws, offload=offload, per_host=per_host, device=device)
    model = shard_blocks(make_model(), **kwargs)
    train(model, OPTIMIZERS[optimizer](model.parameters()), batches(ws), rank, ws, device)
    return to_cpu(full_state(model))


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("wrap", ["none", "size"])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_wrapper_matches_single_process(run_ranks, ws, strategy, wrap, optimizer, device):
    results = run_ranks(_train_wrapper, ws, strategy, wrap, optimizer, device=device)
    want = reference(ws, optimizer)
    for got in results:
        assert_state_equal(got, want)


def test_seed_optimizer_adadelta_matches_single_process(run_ranks):
    for got in run_ranks(_train_wrapper, 3, "FULL_SHARD", "size", "adadelta"):
        assert_state_equal(got, reference(3, "adadelta"))
    for got in run_ranks(_train_fully_shard, 2, "FULL_SHARD", "adadelta"):
        assert_state_equal(got, reference(2, "adadelta"))


@pytest.mark.parametrize("device", DEVICE_TIER)
@pytest.mark.parametrize("face", ["wrapper", "fully_shard"])
@pytest.mark.parametrize(
    ("strategy", "offload"),
    [("FULL_SHARD", False), ("SHARD_GRAD_OP", False), ("NO_SHARD", False), ("FULL_SHARD", True)],
)
def test_both_apis_on_a_device(run_ranks, face, strategy, offload, device):
    """The FSDP wrapper and fully_shard computing on a device that is not the CPU (see
    tests/devices.py), shards there or offloaded to the CPU, against the unsharded model
    trained on the CPU."""
    if face == "fully_shard" and offload and device == "fakegpu":
        pytest.skip(
            "fully_shard's DTensor shards offloaded to the CPU under a fakegpu mesh crash torch "
            "natively (SIGSEGV in the rank); offload's values are in the CPU tier, placement in "
            "test_offload_puts_every_units_shards_on_the_cpu, a real GPU runs this case"
        )
    if face == "wrapper":
        results = run_ranks(_train_wrapper, 2, strategy, "blocks", "adam", offload, device=device)
    else:
        results = run_ranks(_train_fully_shard, 2, strategy, "adam", offload, device=device)
    want = reference(2, "adam")
    for got in results:
        assert_state_equal(got, want)


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("wrap", ["none", "blocks"])
@pytest.mark.parametrize(("ws", "per_host"), [(1, 1), (2, 1), (2, 2), (3, 3), (4, 2)])
def test_hybrid_shard_matches_single_process(run_ranks, ws, per_host, wrap, optimizer, device):
    results = run_ranks(
        _train_wrapper,
        ws,
        "HYBRID_SHARD",
        wrap,
        optimizer,
        local_world_size=per_host,
        device=device,
    )
    want = reference(ws, optimizer)
    for got in results:
        assert_state_equal(got, want)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_hybrid_shard_zero2_matches_single_process(run_ranks, optimizer):
    results = run_ranks(
        _train_wrapper, 4, "_HYBRID_SHARD_ZERO2", "blocks", optimizer, local_world_size=2
    )
    want = reference(4, optimizer)
    for got in results:
        assert_state_equal(got, want)


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_fully_shard_matches_single_process(run_ranks, ws, strategy, optimizer, device):
    results = run_ranks(_train_fully_shard, ws, strategy, optimizer, device=device)
    want = reference(ws, optimizer)
    for got in results:
        assert_state_equal(got, want)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize(("ws", "per_host"), [(2, 1), (2, 2), (4, 2)])
def test_fully_shard_hybrid_mesh_matches_single_process(run_ranks, ws, per_host, optimizer):
    """A 2-D (replicate, shard) mesh: FSDP2's HSDP."""
    results = run_ranks(_train_fully_shard, ws, "HYBRID_SHARD", optimizer, False, per_host)
    want = reference(ws, optimizer)
    for got in results:
        assert_state_equal(got, want)


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_cpu_offload_matches_single_process(run_ranks, ws, strategy, device):
    results = run_ranks(_train_wrapper, ws, strategy, "blocks", "adam", True, device=device)
    results += run_ranks(_train_fully_shard, ws, strategy, "sgd", True, device=device)
    for got, optimizer in zip(results, ["adam"] * ws + ["sgd"] * ws):
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


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("reduce_dtype", [torch.float32, None])
@pytest.mark.parametrize("ws", [2, 3])
def test_mixed_precision_bfloat16_matches_emulation(run_ranks, ws, reduce_dtype, device):
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    results = run_ranks(_train_wrapper, ws, "FULL_SHARD", "blocks", "sgd", False, mp, device=device)
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

    model = shard_blocks(make_model(), **kwargs)
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
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    results = run_ranks(_train_fsdp2_style, 2, {"mp_policy": policy}, "sgd")
    want = _mixed_reference(
        2, MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    )
    for got in results:
        assert_state_equal(got, want, atol=2e-3, rtol=1e-2)


def _fsdp2_errors(rank, ws):
    from torch.distributed.tensor import Shard

    from shardkit.fsdp import DataParallelMeshDims

    found = []
    for module, kwargs in (
        (make_model(), {"reshard_after_forward": 2}),
        ([make_model(), make_model()], {}),
        (make_model(), {"dp_mesh_dims": DataParallelMeshDims(shard="dp")}),
        (make_model(), {"shard_placement_fn": lambda param: Shard(1) if param.dim() > 1 else None}),
    ):
        try:
            fully_shard(module, **kwargs)
        except ValueError as exc:
            found.append(str(exc))
    return found


def test_fsdp2_arguments_shardkit_lacks_are_refused(run_ranks):
    messages = run_ranks(_fsdp2_errors, 1)[0]
    assert messages == [
        "reshard_after_forward=2: shardkit takes True, False or None; resharding to a smaller "
        "group after forward (an int) is not offered",
        "fully_shard got a list of 2 modules; shardkit shards one module per call: give the "
        "modules a common parent and shard that, or shard each one",
        "dp_mesh_dims=DataParallelMeshDims(shard='dp', replicate=None): shardkit's fully_shard "
        "shards plain parameters on a data-parallel mesh; pass that mesh (1-D, or 2-D replicate "
        "x shard) as mesh=",
        "shard_placement_fn gave Shard(dim=1) for parameter 'embed.weight'; shardkit shards "
        "every parameter along dim 0: return None or Shard(0)",
    ]


def _dtensor_layout(rank, ws, strategy, per_host):
    model = shard_blocks(make_model(), **fsdp2_kwargs(strategy, ws, per_host=per_host))
    loss_fn(model, *local(batches(ws)[0], rank, ws)).backward()
    out = {}
    for name, param in model.named_parameters():
        grad = param.grad
        out[name] = (
            type(param).__name__,
            tuple(param.shape),
            [str(p) for p in param.placements],
            tuple(param.to_local().shape),
            None if grad is None else (type(grad).__name__, [str(p) for p in grad.placements]),
        )
    return out


@pytest.mark.parametrize(
    ("strategy", "ws", "per_host", "placements", "rows"),
    [
        ("FULL_SHARD", 3, None, ["S(0)"], (4, 4, 3)),
        ("HYBRID_SHARD", 4, 2, ["R", "S(0)"], (6, 5, 6, 5)),
        ("NO_SHARD", 2, None, ["R", "R"], (11, 11)),
    ],
)
def test_fully_shard_parameters_and_gradients_are_dtensors(
    run_ranks, strategy, ws, per_host, placements, rows
):
    """FSDP2's layout: global shapes, Shard(0) (Replicate, Shard(0) on a 2-D mesh), this rank's
    rows locally; 0-dim parameters replicated; the gradient is a DTensor laid out alike."""
    results = run_ranks(_dtensor_layout, ws, strategy, per_host, local_world_size=per_host)
    full = make_model().state_dict()
    for rank, layout in enumerate(results):
        kind, shape, kinds, local_shape, grad = layout["blocks.0.up.weight"]
        assert (kind, shape, kinds) == ("DTensor", (11, 7), placements)
        assert local_shape == (rows[rank], 7)
        assert grad == ("DTensor", placements)
        kind, shape, kinds, local_shape, grad = layout["scale"]
        assert (shape, local_shape, set(kinds)) == ((), (), {"R"})
        assert grad is not None and grad[0] == "DTensor"
        assert layout["frozen"][4] is None  # frozen: no gradient
        assert {name: entry[1] for name, entry in layout.items()} == {
            name: tuple(value.shape) for name, value in full.items() if name != "offset"
        }
