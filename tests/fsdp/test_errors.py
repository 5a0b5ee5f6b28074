"""Every error names the value, the rule and the fix, and every rank raises it (no rank is left
waiting in a collective). Messages are pinned here."""

from __future__ import annotations

import functools
import re
from unittest import mock

import pytest
import torch
from torch import nn

from shardkit.fsdp import (
    DataParallelMeshDims,
    FSDPModule,
    FullyShardedDataParallel,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
    fully_shard,
    optim_state_dict,
    optim_state_dict_to_load,
    state_dict_type,
    summon_full_params,
)
from shardkit.fsdp._config import Prefetch
from shardkit.fsdp.wrap import ModuleWrapPolicy, lambda_auto_wrap_policy
from shardkit.launch import spawn
from tests.fsdp.models import Block, batches, local, loss_fn, make_model

FSDP = FullyShardedDataParallel


def _message(call) -> str:
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    return str(info.value)


# ---- without ranks ------------------------------------------------------------------------------


def test_no_process_group():
    with pytest.raises(
        ValueError,
        match=r"FullyShardedDataParallel needs an initialized process group: start ranks with shardkit\.launch\.spawn",
    ):
        FSDP(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"fully_shard needs an initialized process group"):
        fully_shard(nn.Linear(2, 2))


def test_policy_dataclasses_check_themselves():
    with pytest.raises(
        ValueError,
        match=r"MixedPrecision\.param_dtype must be a floating torch\.dtype or None, got torch\.int8; use e\.g\. torch\.bfloat16",
    ):
        MixedPrecision(param_dtype=torch.int8)
    with pytest.raises(
        ValueError,
        match=r"MixedPrecision\.reduce_dtype must be a floating torch\.dtype or None, got 'bf16'",
    ):
        MixedPrecision(reduce_dtype="bf16")
    with pytest.raises(
        TypeError, match=r"backward_prefetch must be a BackwardPrefetch or None, got 'pre'"
    ):
        Prefetch(backward="pre")
    with pytest.raises(
        ValueError,
        match=r"MixedPrecisionPolicy\.output_dtype must be a floating torch\.dtype or None, got "
        r"torch\.int8; use e\.g\. torch\.bfloat16",
    ):
        MixedPrecisionPolicy(output_dtype=torch.int8)
    with pytest.raises(
        ValueError, match=r"MixedPrecision\(keep_low_precision_grads=True\) is not offered"
    ):
        MixedPrecision(keep_low_precision_grads=True)
    with pytest.raises(ValueError, match=r"DataParallelMeshDims needs shard or replicate"):
        DataParallelMeshDims()
    with pytest.raises(
        TypeError, match=r"ModuleWrapPolicy takes nn\.Module subclasses, got <class 'int'>"
    ):
        ModuleWrapPolicy({int})


def test_summon_and_state_dict_type_need_units():
    with (
        pytest.raises(
            ValueError, match=r"Linear contains no fully sharded units; summon_full_params applies"
        ),
        summon_full_params(nn.Linear(2, 2)),
    ):
        pass
    with (
        pytest.raises(
            ValueError, match=r"Linear contains no fully sharded units; state_dict_type applies"
        ),
        state_dict_type(nn.Linear(2, 2), StateDictType.FULL_STATE_DICT),
    ):
        pass
    with (
        pytest.raises(
            TypeError, match=r"state_dict_type must be a shardkit\.fsdp\.StateDictType, got 'full'"
        ),
        state_dict_type(nn.Linear(2, 2), "full"),
    ):
        pass
    mismatch = r"ShardedStateDictConfig does not go with FULL_STATE_DICT; use FullStateDictConfig"
    config = ShardedStateDictConfig()
    with (
        pytest.raises(ValueError, match=mismatch),
        state_dict_type(nn.Linear(2, 2), StateDictType.FULL_STATE_DICT, config),
    ):
        pass


# ---- the same error on every rank ---------------------------------------------------------------


def _twice():
    yield lambda: FSDP(FSDP(nn.Linear(3, 3)))
    yield lambda: fully_shard(fully_shard(nn.Linear(3, 3)))
    yield lambda: FSDP(fully_shard(nn.Linear(3, 3)))


def _wrapping_twice(rank, ws):
    return [_message(call) for call in _twice()]


def test_wrapping_twice(run_ranks):
    for messages in run_ranks(_wrapping_twice, 2):
        for message in messages:
            assert re.fullmatch(
                r"(FullyShardedDataParallel|FSDPLinear) is already fully sharded \(unit 'Linear'\); "
                r"wrap each module once \(call fully_shard or FullyShardedDataParallel on it a "
                r"single time\)",
                message,
            ), message


def _stale_optimizer(rank, ws):
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters())
    model = FSDP(model)
    loss_fn(model, *local(batches(ws)[0], rank, ws)).backward()
    return _message(optimizer.step)


def test_optimizer_built_before_wrapping(run_ranks):
    for message in run_ranks(_stale_optimizer, 2):
        assert message == (
            "Adam holds parameter 'frozen' [7] of unit 'ToyNet', which shardkit.fsdp "
            "replaced with its shard when it wrapped the module: this optimizer was built before "
            "wrapping and would update tensors the model no longer uses. Build it after wrapping, "
            "over the shards: optimizer = Adam(model.parameters(), ...)"
        )


class TwoDevices(nn.Module):
    def __init__(self, meta_on_rank=None):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3, device="meta" if meta_on_rank in (None, "all") else "cpu")


def _devices(rank, ws):
    return _message(lambda: FSDP(TwoDevices()))


def test_parameters_on_two_devices(run_ranks):
    for message in run_ranks(_devices, 2):
        assert message == (
            "unit 'TwoDevices' has parameters on 2 devices (cpu: a.weight, a.bias; meta: b.weight, "
            "b.bias); one unit gathers all its parameters on one device: move the module to one "
            "device (module.to(device)) before wrapping, or wrap the parts separately"
        )


class TiedAcrossUnits(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = nn.Linear(4, 4)
        self.decode = nn.Linear(4, 4, bias=False)
        self.decode.weight = self.encode.weight


def _argument_errors(rank, ws):
    from torch.distributed.device_mesh import init_device_mesh

    cases = {
        "shared": lambda: FSDP(
            TiedAcrossUnits(),
            auto_wrap_policy=functools.partial(
                lambda_auto_wrap_policy, lambda_fn=lambda m: getattr(m, "bias", None) is not None
            ),
        ),
        "both_policies": lambda: FSDP(
            nn.Linear(2, 2),
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
            fsdp_auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        ),
        "strategy_type": lambda: FSDP(nn.Linear(2, 2), sharding_strategy="FULL_SHARD"),
        "tuple_group": lambda: FSDP(nn.Linear(2, 2), process_group=(None, None)),
        "single_group_hybrid": lambda: FSDP(
            nn.Linear(2, 2),
            sharding_strategy=ShardingStrategy.HYBRID_SHARD,
            process_group=torch.distributed.group.WORLD,
        ),
        "mesh_2d": lambda: FSDP(nn.Linear(2, 2), device_mesh=init_device_mesh("cpu", (1, ws))),
        "mesh_3d": lambda: fully_shard(nn.Linear(2, 2), mesh=init_device_mesh("cpu", (1, 1, ws))),
        "mesh_type": lambda: fully_shard(nn.Linear(2, 2), mesh="cpu"),
        "mp_type": lambda: FSDP(nn.Linear(2, 2), mixed_precision=torch.bfloat16),
        "offload_type": lambda: fully_shard(nn.Linear(2, 2), offload_policy=True),
        "ignored_type": lambda: FSDP(nn.Linear(2, 2), ignored_states=["weight"]),
        "not_a_module": lambda: FSDP("model"),
        "meta_no_reset": lambda: FSDP(MetaNoReset()),
    }
    with mock.patch("shardkit.launch.is_initialized", return_value=False):
        cases_hosts = _message(
            lambda: FSDP(nn.Linear(2, 2), sharding_strategy=ShardingStrategy.HYBRID_SHARD)
        )
    out = {name: _message(call) for name, call in cases.items()}
    out["hosts"] = cases_hosts
    return out


class MetaNoReset(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(3, device="meta"))


EXPECTED = {
    "shared": r"parameter 'decode\.weight' of unit 'TiedAcrossUnits' \(shape \[4, 4\]\) is also registered in another unit, which already sharded it; wrap the modules that share a parameter in one unit",
    "both_policies": r"both auto_wrap_policy and fsdp_auto_wrap_policy were given; they are the new and the old name of the same argument: pass only auto_wrap_policy",
    "strategy_type": r"sharding_strategy must be a shardkit\.fsdp\.ShardingStrategy, got 'FULL_SHARD'; use e\.g\. ShardingStrategy\.FULL_SHARD",
    "tuple_group": r"process_group is a tuple \(intra-host, inter-host\) but sharding_strategy is FULL_SHARD; a tuple is for HYBRID_SHARD only, pass one ProcessGroup",
    "single_group_hybrid": r"HYBRID_SHARD with a single process_group is ambiguous: pass process_group=\(intra_host_group, inter_host_group\), a 2-D device_mesh, or neither",
    "mesh_2d": r"device_mesh has 2 dimensions but FULL_SHARD needs a 1-D mesh; a 2-D \(replicate, shard\) mesh is for HYBRID_SHARD",
    "mesh_3d": r"fully_shard's mesh must be a 1-D DeviceMesh \(shard\) or a 2-D one \(replicate, shard\), got a 3-D DeviceMesh; e\.g\. init_device_mesh\('cpu', \(world_size,\)\)",
    "mesh_type": r"fully_shard's mesh must be a 1-D DeviceMesh \(shard\) or a 2-D one \(replicate, shard\), got 'cpu'",
    "mp_type": r"mixed_precision must be a shardkit\.fsdp\.MixedPrecision, got torch\.bfloat16",
    "offload_type": r"offload_policy must be a shardkit\.fsdp\.OffloadPolicy, got True; use e\.g\. CPUOffloadPolicy\(\)",
    "ignored_type": r"ignored_states takes parameters or modules, got str",
    "not_a_module": r"FullyShardedDataParallel wraps an nn\.Module, got <class 'str'>",
    "meta_no_reset": r"MetaNoReset has parameters or buffers \['w'\] on the meta device and no reset_parameters\(\) to initialise them; pass param_init_fn=",
    "hosts": r"HYBRID_SHARD needs to know which ranks share a host: start the ranks with shardkit\.launch \(spawn or init_from_env\), or pass process_group=",
}


def test_argument_errors(run_ranks):
    for messages in run_ranks(_argument_errors, 2):
        for name, pattern in EXPECTED.items():
            assert re.match(pattern, messages[name]), (name, messages[name])


def _usage_errors(rank, ws):
    model = FSDP(make_model(), auto_wrap_policy=ModuleWrapPolicy({Block}))
    optimizer = torch.optim.Adam(model.parameters())
    x, y = local(batches(ws)[0], rank, ws)
    out = {}
    out["clip_inner"] = _message(lambda: model.blocks[0].clip_grad_norm_(1.0))

    def summon_in_forward(module, args, output):
        with summon_full_params(model):
            pass

    handle = model.blocks[0].module.up.register_forward_hook(summon_in_forward)
    out["summon_in_forward"] = _message(lambda: model(x))
    handle.remove()
    out["summon_rank0"] = _message(lambda: summon_full_params(model, rank0_only=True).__enter__())
    states = model.state_dict()
    states["head.weight"] = torch.zeros(4, 7)
    out["load_shape"] = _message(lambda: model.load_state_dict(states))
    states["head.weight"] = [[0.0]]
    out["load_type"] = _message(lambda: model.load_state_dict(states))
    loss_fn(model, x, y).backward()
    optimizer.step()
    foreign = torch.optim.Adam([nn.Parameter(torch.zeros(2))])
    out["foreign"] = _message(lambda: optim_state_dict(model, foreign))
    osd = optim_state_dict(model, optimizer)
    osd["state"]["nope.weight"] = osd["state"].pop("head.weight")
    out["unknown_fqn"] = _message(lambda: optim_state_dict_to_load(model, optimizer, osd))
    osd = optim_state_dict(model, optimizer)
    osd["param_groups"].append(dict(osd["param_groups"][0]))
    out["groups"] = _message(lambda: optim_state_dict_to_load(model, optimizer, osd))
    osd = optim_state_dict(model, optimizer)
    head = dict(model.named_parameters())["_fsdp_wrapped_module.head.weight"]
    optimizer.state[head]["exp_avg"] = torch.zeros(17)
    out["not_elementwise"] = _message(lambda: optim_state_dict(model, optimizer))
    with torch.device("meta"):
        meta = nn.Sequential(nn.Linear(2, 2))
    fully_shard(meta)
    out["meta_forward"] = _message(lambda: meta(torch.zeros(1, 2)))
    out["materialize"] = _message(lambda: FSDPModule.materialize(nn.Linear(2, 2)))
    return out


USAGE = {
    "clip_inner": r"clip_grad_norm_ must be called on the outermost fully sharded module, got FullyShardedDataParallel \(unit 'blocks\.0'\); call it on the model you run forward on",
    "summon_in_forward": r"summon_full_params called on unit '\w+' during forward or backward; call it between iterations",
    "summon_rank0": r"summon_full_params\(rank0_only=True, writeback=True\) would let the other ranks' shards go stale; pass writeback=False with rank0_only=True",
    "load_shape": r"state dict entry '_fsdp_wrapped_module\.head\.weight' has shape \[4, 7\] but the parameter has shape \[3, 7\]; load a state dict of the unsharded model \(FULL_STATE_DICT\)",
    "load_type": r"state dict entry '_fsdp_wrapped_module\.head\.weight' must be a tensor, got list",
    "foreign": r"Adam holds a parameter of shape \[2\] that is not a parameter of the model; build the optimizer over model\.parameters\(\) after wrapping",
    "unknown_fqn": r"optimizer state for 'nope\.weight', which Adam does not hold",
    "groups": r"the state dict has 2 parameter group\(s\) but Adam has 1; build the optimizer with the same groups",
    "not_elementwise": r"optimizer state 'exp_avg' of parameter 'head\.weight' has shape \[17\], which is neither the shard's \[\d, 7\] nor a scalar; shardkit\.fsdp can only gather element-wise optimizer state",
    "meta_forward": r"unit 'Sequential' still has parameters on the meta device; initialise them first: model\.materialize\(\) after fully_shard, or param_init_fn=",
    "materialize": r"Linear has no fully sharded units: materialize\(\) applies to a module wrapped with fully_shard or FullyShardedDataParallel",
}


def test_usage_errors(run_ranks):
    for messages in run_ranks(_usage_errors, 2):
        for name, pattern in USAGE.items():
            assert re.match(pattern, messages[name]), (name, messages[name])


# ---- ranks that disagree: every rank raises, none hangs -----------------------------------------


def _disagree(rank, ws):
    out = {}
    # rank 1 builds a different model
    out["structure"] = _message(lambda: FSDP(nn.Linear(3, 4 if rank == 0 else 5)))
    # only rank 1 has a problem of its own
    out["local"] = _message(lambda: FSDP(TwoDevices(meta_on_rank="all" if rank == 1 else "none")))

    # rank 1 wraps one more unit than rank 0
    def extra_unit():
        model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3))
        for layer in list(model)[: 2 if rank == 0 else 3]:
            fully_shard(layer)
        fully_shard(model)

    out["extra_unit"] = _message(extra_unit)
    return out


def test_ranks_that_disagree_all_raise():
    results = spawn(_disagree, world_size=2, timeout=30)
    for messages in results:
        assert messages["structure"] == (
            "the module structure differs across ranks while wrapping unit 'Linear': parameter "
            "'weight' is [4, 3] torch.float32 on rank 0 but [5, 3] torch.float32 on rank 1. Every "
            "rank must build the same model and wrap the same modules in the same order"
        )
        assert messages["local"].startswith(
            "on rank 1: unit 'TwoDevices' has parameters on 2 devices (cpu: a.weight, a.bias; "
            "meta: b.weight, b.bias)"
        )
        assert messages["extra_unit"].startswith(
            "the module structure differs across ranks while wrapping unit "
        ), messages["extra_unit"]
