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


def _documented_fsdp1_reload(rank, ws, path):
    """torch's FSDP docs' reload (``load_sharded_optimizer_state_dict``), as written there: its
    optimizer state comes back as ShardedTensors chunked over the ranks (issue 27)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict

    model, optimizer = model_and_optimizer("wrapper", "FULL_SHARD", seed=7)
    with FSDP.state_dict_type(model, SHARDED):
        model_state_dict = model.state_dict()
        checkpoint = {"model": model_state_dict}
        dcp.load(state_dict=checkpoint, storage_reader=dcp.FileSystemReader(path))
        model.load_state_dict(checkpoint["model"])
        optim_state = load_sharded_optimizer_state_dict(
            model_state_dict, optimizer_key="optim", storage_reader=dcp.FileSystemReader(path)
        )
        kinds = {
            type(v).__name__ for e in optim_state["optim"]["state"].values() for v in e.values()
        }
        assert ShardedTensor.__name__ in kinds, kinds
        flattened_osd = FSDP.optim_state_dict_to_load(model, optimizer, optim_state["optim"])
        optimizer.load_state_dict(flattened_osd)
    loaded = full_state(model)
    train(model, optimizer, batches(ws, steps=2, seed=5), rank, ws)
    return loaded, full_state(model)


@pytest.mark.parametrize("load_ws", [2, 3])
def test_fsdp1_documented_sharded_optimizer_reload(run_ranks, tmp_path, load_ws):
    path = str(tmp_path / "checkpoint")
    saved = run_ranks(_dcp_save, 2, path, "wrapper")[0]
    want = _continued_reference(2, load_ws)
    for loaded, trained in run_ranks(_documented_fsdp1_reload, load_ws, path):
        assert_state_equal(loaded, saved)
        assert_state_equal(trained, want)  # Adam's moments came back, not zeros


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


# ---- local state dicts, settings, re-keying ------------------------------------------------------


def _local_round_trip(rank, ws):
    from shardkit.fsdp import (
        LocalOptimStateDictConfig,
        LocalStateDictConfig,
        OptimStateKeyType,
        StateDictSettings,
    )

    model, optimizer = model_and_optimizer("wrapper")
    train(model, optimizer, batches(ws), rank, ws)
    previous = FSDP.set_state_dict_type(model, StateDictType.LOCAL_STATE_DICT)
    settings = FSDP.get_state_dict_type(model)
    states = {k: v.clone() for k, v in model.state_dict().items()}
    optim_states = optim_state_dict(model, optimizer)
    fresh, fresh_optimizer = model_and_optimizer("wrapper", seed=7)
    train(fresh, fresh_optimizer, batches(ws, steps=1), rank, ws)
    FSDP.set_state_dict_type(fresh, StateDictType.LOCAL_STATE_DICT)
    fresh.load_state_dict(states)
    fresh_optimizer.load_state_dict(optim_state_dict_to_load(fresh, fresh_optimizer, optim_states))
    FSDP.set_state_dict_type(fresh, StateDictType.FULL_STATE_DICT)
    train(fresh, fresh_optimizer, batches(ws, steps=2, seed=5), rank, ws)
    by_id = FSDP.rekey_optim_state_dict(
        optim_states, OptimStateKeyType.PARAM_ID, model, optim=optimizer
    )
    by_name = FSDP.rekey_optim_state_dict(by_id, OptimStateKeyType.PARAM_NAME, model)
    return {
        "previous": previous.state_dict_type,
        "settings": settings
        == StateDictSettings(
            StateDictType.LOCAL_STATE_DICT, LocalStateDictConfig(), LocalOptimStateDictConfig()
        ),
        "shapes": {k: tuple(v.shape) for k, v in states.items()},
        "rekeyed": by_id["state"].keys() == optimizer.state_dict()["state"].keys()
        and by_id["param_groups"][0]["params"]
        == optimizer.state_dict()["param_groups"][0]["params"]
        and by_name["state"].keys() == optim_states["state"].keys(),
        "trained": full_state(fresh),
    }


def test_local_state_dict_round_trip_and_settings(run_ranks):
    for rank, out in enumerate(run_ranks(_local_round_trip, 3)):
        assert out["previous"] is StateDictType.FULL_STATE_DICT and out["settings"]
        # this rank's rows, as plain tensors: 11 rows over 3 ranks are 4, 4, 3
        assert out["shapes"]["blocks.0.up.weight"] == ((4, 7) if rank < 2 else (3, 7))
        assert out["rekeyed"]
        assert_state_equal(out["trained"], _continued_reference(3, 3))


def test_state_dict_config_must_match_the_type():
    from shardkit.fsdp import LocalStateDictConfig

    with (
        pytest.raises(
            ValueError,
            match=r"LocalStateDictConfig does not go with SHARDED_STATE_DICT; use "
            r"ShardedStateDictConfig and ShardedOptimStateDictConfig with SHARDED_STATE_DICT",
        ),
        state_dict_type(torch.nn.Linear(2, 2), SHARDED, LocalStateDictConfig()),
    ):
        pass


# ---- FSDP2: torch's own state dicts -------------------------------------------------------------


def _plain_dcp(rank, ws, path, save):
    """``model.state_dict()`` and ``optimizer.state_dict()`` as they are (DTensors), through DCP."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor

    model, optimizer = model_and_optimizer("fully_shard", seed=0 if save else 7)
    if save:
        train(model, optimizer, batches(ws), rank, ws)
        osd = optimizer.state_dict()
        index = [name for name, _ in model.named_parameters()].index("embed.bias")
        entry = osd["state"][index]
        from shardkit.fsdp import ShardedOptimStateDictConfig, StateDictSettings

        layout = (
            type(entry["exp_avg"]) is DTensor,
            tuple(entry["exp_avg"].shape),
            type(entry["step"]),
            # fully_shard's form, reported in FSDP1's words (optimizer state offloaded)
            FSDP.get_state_dict_type(model)
            == StateDictSettings(SHARDED, ShardedStateDictConfig(), ShardedOptimStateDictConfig()),
        )
        dcp.save({"model": model.state_dict(), "optim": osd}, checkpoint_id=path)
        return layout, full_state(model)
    train(model, optimizer, batches(ws, steps=1), rank, ws)  # state exists, then is replaced
    states = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.load(states, checkpoint_id=path)
    model.load_state_dict(states["model"])
    optimizer.load_state_dict(states["optim"])
    steps = {float(entry["step"]) for entry in optimizer.state.values()}
    loaded = full_state(model)
    train(model, optimizer, batches(ws, steps=2, seed=5), rank, ws)
    return steps, loaded, full_state(model)


def test_fsdp2_plain_state_dicts_through_dcp_on_another_world_size(run_ranks, tmp_path):
    path = str(tmp_path / "checkpoint")
    (layout, saved), *_ = run_ranks(_plain_dcp, 2, path, True)
    assert layout == (True, (7,), torch.Tensor, True)  # embed.bias's Adam moment: a global DTensor
    assert_state_equal(saved, reference(2, "adam"))
    for steps, loaded, trained in run_ranks(_plain_dcp, 3, path, False):
        assert steps == {3.0}  # the step counters came back
        assert_state_equal(loaded, saved)
        assert_state_equal(trained, _continued_reference(2, 3))
