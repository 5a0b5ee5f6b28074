"""Meta-device init (``param_init_fn`` at wrap time, or ``materialize`` after ``fully_shard``) and
``sync_module_states``: the result equals initialising the unsharded model the same way."""

from __future__ import annotations

import pytest
import torch

from shardkit.fsdp import FullyShardedDataParallel, fully_shard
from shardkit.fsdp.wrap import ModuleWrapPolicy
from tests.fsdp.models import (
    OPTIMIZERS,
    Block,
    ToyNet,
    assert_state_equal,
    batches,
    init_module,
    make_model,
    meta_reference,
    train,
)
from tests.fsdp.sharded import full_state


def _meta_wrapper(rank, ws, wrap):
    with torch.device("meta"):
        model = ToyNet()
    torch.manual_seed(0)
    model = FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Block}) if wrap else None,
        param_init_fn=init_module,
    )
    before = full_state(model)
    train(model, OPTIMIZERS["adam"](model.parameters()), batches(ws), rank, ws)
    return before, full_state(model)


def _meta_fully_shard(rank, ws):
    with torch.device("meta"):
        model = ToyNet()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    assert all(p.is_meta for p in model.parameters())
    torch.manual_seed(0)
    model.materialize(init_fn=init_module)
    before = full_state(model)
    train(model, OPTIMIZERS["adam"](model.parameters()), batches(ws), rank, ws)
    return before, full_state(model)


def _trained_from(states: dict[str, torch.Tensor], ws: int) -> dict[str, torch.Tensor]:
    model = make_model()
    model.load_state_dict(states)
    train(model, OPTIMIZERS["adam"](model.parameters()), batches(ws))
    return model.state_dict()


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("ws", [1, 3])
def test_param_init_fn_on_meta_module(run_ranks, ws, wrap):
    want = meta_reference()
    for before, after in run_ranks(_meta_wrapper, ws, wrap):
        assert_state_equal(before, want)
        assert_state_equal(after, _trained_from(want, ws))


@pytest.mark.parametrize("ws", [2, 3])
def test_materialize_after_fully_shard(run_ranks, ws):
    want = meta_reference()
    for before, after in run_ranks(_meta_fully_shard, ws):
        assert_state_equal(before, want)
        assert_state_equal(after, _trained_from(want, ws))


def _default_reset(rank, ws):
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7))
    torch.manual_seed(0)
    return FullyShardedDataParallel(model).state_dict()


def test_meta_module_defaults_to_reset_parameters(run_ranks):
    torch.manual_seed(0)
    want = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7)).state_dict()
    for got in run_ranks(_default_reset, 2):
        assert_state_equal(got, want)


def _sync(rank, ws, meta):
    if meta:
        with torch.device("meta"):
            model = ToyNet()
        torch.manual_seed(rank)  # every rank draws different values; rank 0's must win
        return FullyShardedDataParallel(
            model, sync_module_states=True, param_init_fn=init_module
        ).state_dict()
    model = make_model(seed=rank)
    return FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({Block}), sync_module_states=True
    ).state_dict()


@pytest.mark.parametrize("meta", [False, True])
def test_sync_module_states_takes_rank_zeros_values(run_ranks, meta):
    want = meta_reference(seed=0) if meta else make_model(seed=0).state_dict()
    results = run_ranks(_sync, 3, meta)
    assert not torch.equal(make_model(seed=1).state_dict()["head.weight"], want["head.weight"])
    for got in results:
        assert_state_equal(got, want)
