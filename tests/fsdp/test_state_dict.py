"""State dicts: full (rank0_only, offload_to_cpu), sharded DTensors that torch.distributed.checkpoint
(DCP) saves on one world size and loads on another, and the optimizer state in both forms. After
each round trip the model (and its optimizer) must go on exactly as the unsharded one does."""

from __future__ import annotations

import pytest
import torch

from shardkit.fsdp import (
    FullStateDictConfig,
    FullyShardedDataParallel,
    ShardedStateDictConfig,
    StateDictType,
    optim_state_dict,
    optim_state_dict_to_load,
    state_dict_type,
)
from tests.fsdp.models import (
    OPTIMIZERS,
    assert_state_equal,
    batches,
    make_model,
    reference,
    train,
)
from tests.fsdp.sharded import full_state, model_and_optimizer, wrapped

FSDP = FullyShardedDataParallel
FULL = StateDictType.FULL_STATE_DICT
SHARDED = StateDictType.SHARDED_STATE_DICT


# ---- full ---------------------------------------------------------------------------------------


def _rank0_only(rank, ws):
    model = wrapped()
    train(model, OPTIMIZERS["adam"](model.parameters()), batches(ws), rank, ws)
    config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, FULL, config):
        return model.state_dict()


def test_full_state_dict_rank0_only(run_ranks):
    results = run_ranks(_rank0_only, 3)
    assert_state_equal(results[0], reference(3, "adam"))
    assert results[1] == {} and results[2] == {}


def _load_full(rank, ws, states):
    model = wrapped(seed=7)  # different values: all must come from the state dict
    model.load_state_dict(states)
    return model.state_dict()


def test_load_full_state_dict_on_another_world_size(run_ranks):
    want = reference(2, "adam")
    for got in run_ranks(_load_full, 3, want):
        assert_state_equal(got, want)


# ---- sharded ------------------------------------------------------------------------------------


def _sharded_layout(rank, ws, strategy):
    from torch.distributed.tensor import DTensor

    model = wrapped(strategy)
    with state_dict_type(model, SHARDED, ShardedStateDictConfig()):
        states = model.state_dict()
    out = {}
    for key, value in states.items():
        if isinstance(value, DTensor):
            out[key] = (
                tuple(value.shape),
                [str(p) for p in value.placements],
                value.to_local().clone(),
            )
    return out


@pytest.mark.parametrize(
    ("ws", "strategy", "placements"),
    [(3, "FULL_SHARD", ["S(0)"]), (2, "NO_SHARD", ["R"]), (1, "SHARD_GRAD_OP", ["R"])],
)
def test_sharded_state_dict_is_dtensors_with_global_shapes(run_ranks, ws, strategy, placements):
    full = make_model().state_dict()
    for rank, got in enumerate(run_ranks(_sharded_layout, ws, strategy)):
        assert set(got) == {k for k in full if k != "offset"}  # buffers stay plain tensors
        for key, (shape, kinds, local) in got.items():
            assert shape == tuple(full[key].shape), key
            if full[key].dim() == 0 or placements == ["R"]:  # whole on every rank
                assert set(kinds) == {"R"} and torch.equal(local, full[key])
                continue
            assert kinds == placements, key
            chunks = torch.chunk(full[key], ws)
            want = chunks[rank] if rank < len(chunks) else full[key][:0]
            assert torch.equal(local, want), key


def test_hybrid_sharded_state_dict_replicates_across_hosts(run_ranks):
    full = make_model().state_dict()
    results = run_ranks(_sharded_layout, 4, "HYBRID_SHARD", local_world_size=2)
    for rank, got in enumerate(results):
        _, kinds, local = got["blocks.0.up.weight"]
        assert kinds == ["R", "S(0)"]
        assert torch.equal(local, torch.chunk(full["blocks.0.up.weight"], 2)[rank % 2])


def _dcp_save(rank, ws, path, face):
    import torch.distributed.checkpoint as dcp

    model, optimizer = model_and_optimizer(face)
    train(model, optimizer, batches(ws), rank, ws)
    with state_dict_type(model, SHARDED):
        states = {"model": model.state_dict(), "optim": optim_state_dict(model, optimizer)}
    dcp.save(states, checkpoint_id=path)
    return full_state(model)


def _dcp_load_and_train(rank, ws, path, face, strategy):
    import torch.distributed.checkpoint as dcp

    model, optimizer = model_and_optimizer(face, strategy, seed=7)
    train(
        model, optimizer, batches(ws, steps=1), rank, ws
    )  # optimizer state exists, then is replaced
    with state_dict_type(model, SHARDED):
        states = {"model": model.state_dict(), "optim": optim_state_dict(model, optimizer)}
        dcp.load(states, checkpoint_id=path)
        model.load_state_dict(states["model"])
        optimizer.load_state_dict(optim_state_dict_to_load(model, optimizer, states["optim"]))
    loaded = full_state(model)
    train(model, optimizer, batches(ws, steps=2, seed=5), rank, ws)
    return loaded, full_state(model)


def _continued_reference(saved_ws: int, ws: int) -> dict[str, torch.Tensor]:
    model = make_model()
    optimizer = OPTIMIZERS["adam"](model.parameters())
    train(model, optimizer, batches(saved_ws))
    train(model, optimizer, batches(ws, steps=2, seed=5))
    return model.state_dict()


@pytest.mark.parametrize(
    ("face", "strategy", "load_ws"),
    [("wrapper", "FULL_SHARD", 3), ("wrapper", "NO_SHARD", 1), ("fully_shard", "SHARD_GRAD_OP", 3)],
)
def test_dcp_save_on_two_ranks_load_on_another_world_size(
    run_ranks, tmp_path, face, strategy, load_ws
):
    path = str(tmp_path / "checkpoint")
    saved = run_ranks(_dcp_save, 2, path, face)[0]
    assert_state_equal(saved, reference(2, "adam"))
    want = _continued_reference(2, load_ws)
    for loaded, trained in run_ranks(_dcp_load_and_train, load_ws, path, face, strategy):
        assert_state_equal(loaded, saved)
        assert_state_equal(trained, want)  # the optimizer state came back too


# ---- optimizer state, full ----------------------------------------------------------------------


def _full_optim(rank, ws):
    model, optimizer = model_and_optimizer("wrapper")
    train(model, optimizer, batches(ws), rank, ws)
    return full_state(model), optim_state_dict(model, optimizer)


def _load_full_optim(rank, ws, states, optim_states):
    model, optimizer = model_and_optimizer("wrapper", seed=7)
    model.load_state_dict(states)
    optimizer.load_state_dict(optim_state_dict_to_load(model, optimizer, optim_states))
    train(model, optimizer, batches(ws, steps=2, seed=5), rank, ws)
    return full_state(model)


def test_full_optimizer_state_dict_round_trip(run_ranks):
    states, optim_states = run_ranks(_full_optim, 2)[0]
    ref = make_model()
    ref_optimizer = OPTIMIZERS["adam"](ref.parameters())
    train(ref, ref_optimizer, batches(2))
    names = [name for name, _ in ref.named_parameters()]
    ref_state = ref_optimizer.state_dict()["state"]
    assert sorted(optim_states["state"]) == sorted(names[i] for i in ref_state)
    for index, entry in ref_state.items():
        for key, value in entry.items():
            torch.testing.assert_close(optim_states["state"][names[index]][key], value)
    assert optim_states["param_groups"][0]["params"] == names
    for got in run_ranks(_load_full_optim, 3, states, optim_states):
        assert_state_equal(got, _continued_reference(2, 3))
