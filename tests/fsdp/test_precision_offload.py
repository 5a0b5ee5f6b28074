"""Mixed precision reduces in exactly the dtype asked for, at every world size; gradients
accumulated without sync add up in that dtype; CPU offload keeps shards and optimizer state in
CPU memory (pinned only where a GPU gathers from it), and updates land where units gather from."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from torch import nn

from shardkit.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    FullyShardedDataParallel,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    _fully_shard,
)
from shardkit.fsdp import fully_sharded_data_parallel as _wrapper
from shardkit.fsdp._flat import FlatBucket
from shardkit.fsdp._mesh_info import MeshInfo
from shardkit.fsdp._param import ShardedParam, Slot
from shardkit.fsdp._state import get_state
from shardkit.fsdp.wrap import ModuleWrapPolicy
from tests.fsdp.emulate import one_thread, rank_grads
from tests.fsdp.models import (
    OPTIMIZERS,
    Block,
    assert_state_equal,
    batches,
    local,
    loss_fn,
    make_model,
    reference,
    shard_blocks,
)
from tests.fsdp.sharded import full_state

BF16, F32 = torch.bfloat16, torch.float32
CASES = {  # (param_dtype, reduce_dtype) -> the dtype gradients must be reduced in
    "bf16-params-fp32-reduce": (BF16, F32, F32),
    "bf16-params": (BF16, None, BF16),
    "bf16-reduce": (None, BF16, BF16),
}


def _wrap(face, param_dtype, reduce_dtype, **kwargs):
    if face == "fully_shard":
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        return shard_blocks(make_model(), mp_policy=policy, **kwargs)
    return FullyShardedDataParallel(
        make_model(),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        mixed_precision=MixedPrecision(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
        **kwargs,
    )


def _reductions(rank, ws, face, param_dtype, reduce_dtype):
    from shardkit.fsdp import _flat, _param

    comm_dtypes, added = [], []
    original_add = ShardedParam.add_grad

    def add_grad(self, reduced):
        added.append(reduced.dtype)
        return original_add(self, reduced)

    def spy(real):
        def call(tensor, **kwargs):
            comm_dtypes.append(tensor.dtype)
            return real(tensor, **kwargs)

        return call

    model = _wrap(face, param_dtype, reduce_dtype)
    with (
        mock.patch.object(ShardedParam, "add_grad", add_grad),
        mock.patch.object(
            _flat.comm, "reduce_scatter_tensor", spy(_flat.comm.reduce_scatter_tensor)
        ),
        mock.patch.object(_param.comm, "all_reduce", spy(_param.comm.all_reduce)),
    ):
        loss_fn(model, *local(batches(ws)[0], rank, ws)).backward()
    shard_grads = [p.grad for p in model.parameters() if p.grad is not None]
    grads = [g.to_local() if hasattr(g, "to_local") else g for g in shard_grads]
    return comm_dtypes, added, [g.dtype for g in grads], grads


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("face", ["fully_shard", "wrapper"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_gradients_are_reduced_in_the_reduce_dtype(run_ranks, ws, face, case):
    param_dtype, reduce_dtype, expected = CASES[case]
    for comm_dtypes, added, grad_dtypes, grads in run_ranks(
        _reductions, ws, face, param_dtype, reduce_dtype
    ):
        if ws > 1:  # every collective that reduced gradients ran in the reduce dtype
            assert comm_dtypes and set(comm_dtypes) == {expected}, comm_dtypes
        else:  # one rank, no collective: the gradients still pass through the reduce dtype
            assert set(added) <= {expected}, added
        assert set(grad_dtypes) == {F32}  # and the shards' gradients are float32 again
        representable = [torch.equal(g, g.to(BF16).float()) for g in grads]
        if expected == BF16:  # rounded to bfloat16 on the way, even on one rank
            assert all(representable)
        elif ws > 1:  # averaged in float32: more bits than a bfloat16 holds
            assert not all(representable)
        if face == "fully_shard":
            assert added, "gradients reach the shards through add_grad"


def _accumulate(rank, ws):
    torch.set_num_threads(1)
    policy = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=F32)
    model = shard_blocks(make_model(), mp_policy=policy)
    data = batches(ws, steps=3)
    for index, batch in enumerate(data):
        model.set_requires_gradient_sync(index == len(data) - 1)
        loss_fn(model, *local(batch, rank, ws)).backward()
    return {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}


def test_accumulated_gradients_add_up_in_the_reduce_dtype(run_ranks):
    """Three micro-batches' bf16 gradients summed in float32 (as FSDP2 does), not in bf16."""
    model = make_model()
    names = [name for name, _ in model.named_parameters()]
    with one_thread():
        per_batch = [rank_grads(model, *batch, param_dtype=BF16)[0] for batch in batches(1, 3)]
    want = {
        name: sum(grads[i] for grads in per_batch)
        for i, name in enumerate(names)
        if per_batch[0][i] is not None
    }
    bf16_sum = {
        name: sum(g[i].to(BF16) for g in per_batch).float()
        for i, name in enumerate(names)
        if per_batch[0][i] is not None
    }
    got = run_ranks(_accumulate, 1)[0]
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7, msg=name)
    assert any(not torch.equal(bf16_sum[n], want[n]) for n in want)  # the test can tell


# ---- CPU offload --------------------------------------------------------------------------------


def _offloaded(face, offload):
    if face == "fully_shard":
        policy = CPUOffloadPolicy(pin_memory=True) if offload else OffloadPolicy()
        return shard_blocks(make_model(), offload_policy=policy)
    return FullyShardedDataParallel(
        make_model(),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        cpu_offload=CPUOffload(offload_params=offload),
    )


def _storage_on_a_gpu(rank, ws, face, offload):
    """Where each unit would keep its shards if it computed on a GPU: the CPU host has one
    device only, so the unit's settings are asked as if its mesh were on ``cuda``."""
    seen = []

    def spy(real):
        def build_unit(trigger, module, settings, **kwargs):
            gpu = dataclasses.replace(settings.mesh_info, device=torch.device("cuda"))
            seen.append(str(dataclasses.replace(settings, mesh_info=gpu).storage_device))
            return real(trigger, module, settings, **kwargs)

        return build_unit

    with (
        mock.patch.object(_fully_shard, "build_unit", spy(_fully_shard.build_unit)),
        mock.patch.object(_wrapper, "build_unit", spy(_wrapper.build_unit)),
    ):
        _offloaded(face, offload)
    return seen


@pytest.mark.parametrize("face", ["fully_shard", "wrapper"])
def test_offload_puts_every_units_shards_on_the_cpu(run_ranks, face):
    """On a CPU host offloading moves nothing, so the policy is followed to each unit's storage
    device under a GPU mesh: the CPU with offload, the GPU without."""
    for offload, want in [(True, "cpu"), (False, "cuda")]:
        for seen in run_ranks(_storage_on_a_gpu, 2, face, offload):
            assert seen and set(seen) == {want}, (offload, seen)


def _offload(rank, ws, face):
    model = _offloaded(face, offload=True)
    optimizer = OPTIMIZERS["adam"](model.parameters())
    loss_fn(model, *local(batches(ws)[0], rank, ws)).backward()
    optimizer.step()
    out = {"devices": set(), "pinned": False, "state_devices": set(), "in_bucket": True}
    for unit in get_state(model).context.units:
        for bucket in unit.group.buckets:
            storage = bucket.flat_shard.untyped_storage().data_ptr()
            for param in bucket.params:  # the optimizer stepped the storage units gather from
                out["in_bucket"] &= param.local.untyped_storage().data_ptr() == storage
        for param in unit.group.params:
            out["devices"].add(str(param.local.device))
            out["pinned"] |= param.local.is_pinned()
            for value in optimizer.state[param.sharded].values():
                rows = value.to_local() if hasattr(value, "to_local") else value
                out["state_devices"].add(str(rows.device))
    return out, full_state(model)


@pytest.mark.parametrize("face", ["fully_shard", "wrapper"])
def test_cpu_offload_keeps_shards_and_state_on_the_cpu(run_ranks, face):
    for out, state in run_ranks(_offload, 2, face):
        assert out["devices"] == {"cpu"} and out["state_devices"] == {"cpu"}
        assert not out["pinned"]  # no GPU here: nothing gathers from pinned memory
        assert out["in_bucket"]
        assert_state_equal(state, reference(2, "adam", steps=1))  # the update landed back


def test_pin_memory_only_where_a_gpu_gathers(monkeypatch):
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(1) or self)
    for compute, pin_memory, want in [("cuda", True, 1), ("cuda", False, 0), ("cpu", True, 0)]:
        pinned.clear()
        info = MeshInfo(None, None, None, torch.device(compute))
        slot = Slot("weight", nn.Linear(2, 3), "weight")
        param = ShardedParam(
            [slot],
            torch.Size([3, 2]),
            F32,
            requires_grad=True,
            mesh_info=info,
            storage_device=torch.device("cpu"),
            param_dtype=None,
        )
        bucket = FlatBucket([param], info, torch.device("cpu"), meta=False, pin_memory=pin_memory)
        assert len(pinned) == want, (compute, pin_memory)
        assert bucket.flat_shard.device.type == "cpu"  # the shard stays where it is stored


# ---- loss scaling -------------------------------------------------------------------------------


def _scaled(rank, ws, inf_rank):
    from shardkit.fsdp.sharded_grad_scaler import ShardedGradScaler

    model = shard_blocks(make_model())
    optimizer = OPTIMIZERS["sgd"](model.parameters())
    scaler = ShardedGradScaler("cpu", init_scale=2.0**4)
    scales = []
    for step, batch in enumerate(batches(ws)):
        optimizer.zero_grad()
        scaler.scale(loss_fn(model, *local(batch, rank, ws))).backward()
        if step == 1 and rank == inf_rank:  # only this rank's shard overflows
            model.embed.weight.grad.to_local().fill_(float("inf"))
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, full_state(model)


def test_sharded_grad_scaler_skips_the_step_on_every_rank(run_ranks):
    ref = make_model()
    optimizer = OPTIMIZERS["sgd"](ref.parameters())
    for step, batch in enumerate(batches(2)):
        optimizer.zero_grad()
        loss_fn(ref, *batch).backward()
        if step != 1:
            optimizer.step()
    for scales, state in run_ranks(_scaled, 2, 1):
        assert scales == [16.0, 8.0, 8.0]  # backed off once, on both ranks
        assert_state_equal(state, ref.state_dict())
