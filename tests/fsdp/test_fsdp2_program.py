"""FSDP2 programs, written as for torch, train as the single-process model does (issue 18).

torch's own utilities on ``fully_shard``'s DTensor parameters give global answers:
``torch.nn.utils.clip_grad_norm_`` returns the unsharded model's norm (to 1e-6) with and without
mixed precision, for FULL_SHARD and HSDP; the FSDP1 wrapper's own ``clip_grad_norm_`` does the
same. A program in torchtitan's style (per-block ``fully_shard``, bf16 parameters with float32
reduction, gradient accumulation with ``set_requires_gradient_sync(False)``, clipping, AdamW,
``torch.distributed.checkpoint`` save and load of model and optimizer through
``torch.distributed.checkpoint.state_dict``) gives the single-process losses and norms step for
step on 1-3 ranks, resumes from its checkpoint, and a checkpoint saved on 2 ranks loads on 3.
"""

from __future__ import annotations

import pytest
import torch

from shardkit.fsdp import (
    FullyShardedDataParallel,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from shardkit.fsdp.wrap import ModuleWrapPolicy
from tests.fsdp.emulate import averaged_grads, one_thread, train_reference
from tests.fsdp.models import Block, fsdp2_kwargs, loss_fn, make_model, shard_blocks

BF16 = torch.bfloat16
MAX_NORM = 0.5  # below the gradients' norm (about 3-6): clipping really scales them
MICRO = 2  # micro-batches per optimizer step
ROWS = 12  # global rows per micro-batch, on any world size 1-4


def _data(steps: int, seed: int = 1) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    return [
        [
            (torch.randn(ROWS, 5, generator=g), torch.randn(ROWS, 3, generator=g))
            for _ in range(MICRO)
        ]
        for _ in range(steps)
    ]


def _chunk(batch, rank, ws):
    return tuple(t.chunk(ws)[rank] for t in batch)


# ---- gradient clipping --------------------------------------------------------------------------


def _clip(rank, ws, face, strategy, mp, per_host):
    torch.set_num_threads(1)
    if face == "fully_shard":
        policy = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=torch.float32) if mp else None
        kwargs = fsdp2_kwargs(strategy, ws, per_host=per_host)
        model = shard_blocks(make_model(), **kwargs, **({"mp_policy": policy} if mp else {}))
    else:
        model = FullyShardedDataParallel(
            make_model(),
            sharding_strategy=ShardingStrategy[strategy],
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            mixed_precision=MixedPrecision(param_dtype=BF16, reduce_dtype=torch.float32)
            if mp
            else None,
        )
    x, y = _data(1)[0][0]
    loss_fn(model, *_chunk((x, y), rank, ws)).backward()
    if face == "fully_shard":
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        norm = norm.full_tensor()
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
    else:
        norm = model.clip_grad_norm_(MAX_NORM)
        grads = _wrapper_grads(model)
    return float(norm), grads


def _wrapper_grads(model):
    from shardkit.fsdp import summon_full_params

    with summon_full_params(model, with_grads=True):
        return {
            n.replace("_fsdp_wrapped_module.", ""): p.grad.clone()
            for n, p in model.named_parameters()
            if p.grad is not None
        }


@pytest.mark.parametrize("mp", [False, True])
@pytest.mark.parametrize(
    ("face", "strategy", "ws", "per_host"),
    [
        ("fully_shard", "FULL_SHARD", 2, None),
        ("fully_shard", "HYBRID_SHARD", 4, 2),
        ("wrapper", "FULL_SHARD", 3, None),
        ("wrapper", "HYBRID_SHARD", 4, 2),
    ],
)
def test_clip_grad_norm_is_the_global_norm(run_ranks, face, strategy, ws, per_host, mp):
    ref = make_model()
    x, y = _data(1)[0][0]
    with one_thread():
        averaged_grads(ref, [(x, y)], ws, param_dtype=BF16 if mp else None)
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
    results = run_ranks(_clip, ws, face, strategy, mp, per_host, local_world_size=per_host)
    for norm, grads in results:
        assert norm == pytest.approx(float(want), rel=1e-6, abs=1e-6)
        for name, param in ref.named_parameters():
            if param.grad is not None:
                torch.testing.assert_close(grads[name], param.grad, rtol=1e-5, atol=1e-6)
    assert float(want) > 2 * MAX_NORM  # the gradients were scaled


# ---- an FSDP2 program in torchtitan's style -----------------------------------------------------


def _program(rank, ws, mp, path, start, stop, save_at):
    """Train steps ``[start, stop)`` (loading the checkpoint at ``path`` first when start > 0),
    saving one after step ``save_at``. Returns per step (global loss, norm), and the full model
    and optimizer state after loading."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    torch.set_num_threads(1)
    policy = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=torch.float32)
    model = shard_blocks(make_model(), **({"mp_policy": policy} if mp else {}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    loaded = None
    if start > 0:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        loaded = _snapshot(
            get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
        )
    out = []
    data = _data(stop)
    for step in range(start, stop):
        total = torch.zeros(())
        for index, batch in enumerate(data[step]):
            model.set_requires_gradient_sync(index == MICRO - 1)
            loss = loss_fn(model, *_chunk(batch, rank, ws)) / MICRO
            loss.backward()
            total += loss.detach().float()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(total)
        out.append((float(total) / ws, float(norm.full_tensor())))
        if step + 1 == save_at:
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
            saved = _snapshot(
                get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
            )
    return out, loaded, saved if save_at else None


def _snapshot(state):
    """A copy: state dict values share storage with the parameters (whole ones here)."""
    return tuple(_copy(part) for part in state)


def _copy(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _reference(mp, world_size_of, steps):
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    return train_reference(
        model,
        optimizer,
        _data(steps),
        world_size_of,
        param_dtype=BF16 if mp else None,
        max_norm=MAX_NORM,
    )


STEPS, SAVE_AT = 4, 2
# float32: sharded and single-process runs differ in summation order only; bfloat16: the ranks'
# bf16 kernels and the emulation's agree closely but not to the bit
LOSS_TOL = {False: {"rel": 1e-5, "abs": 1e-6}, True: {"rel": 1e-3, "abs": 1e-4}}


def _assert_steps(got, want, mp):
    assert len(got) == len(want)
    for (loss, norm), (want_loss, want_norm) in zip(got, want):
        assert loss == pytest.approx(want_loss, **LOSS_TOL[mp])
        assert norm == pytest.approx(want_norm, **LOSS_TOL[mp])


@pytest.mark.parametrize("mp", [False, True])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_fsdp2_program_matches_single_process(run_ranks, tmp_path, ws, mp):
    want = _reference(mp, lambda step: ws, STEPS)
    results = run_ranks(_program, ws, mp, str(tmp_path / "ckpt"), 0, STEPS, SAVE_AT)
    for steps, _, _ in results:
        _assert_steps(steps, want, mp)
    assert want[-1][0] < want[0][0] and all(norm > MAX_NORM for _, norm in want)


def _assert_state_equal(got, want):
    model_got, optim_got = got
    model_want, optim_want = want
    assert list(model_got) == list(model_want)
    for key, value in model_want.items():
        torch.testing.assert_close(model_got[key], value, msg=key)
    assert optim_got["param_groups"] == optim_want["param_groups"]
    assert optim_got["state"].keys() == optim_want["state"].keys()
    for name, entry in optim_want["state"].items():
        assert entry.keys() == optim_got["state"][name].keys()
        for key, value in entry.items():  # step counters included
            torch.testing.assert_close(optim_got["state"][name][key], value, msg=f"{name} {key}")


@pytest.mark.parametrize("mp", [False, True])
@pytest.mark.parametrize(("save_ws", "load_ws"), [(2, 2), (2, 3)])
def test_fsdp2_program_resumes_from_its_checkpoint(run_ranks, tmp_path, save_ws, load_ws, mp):
    path = str(tmp_path / "ckpt")
    first = run_ranks(_program, save_ws, mp, path, 0, SAVE_AT, SAVE_AT)
    resumed = run_ranks(_program, load_ws, mp, path, SAVE_AT, STEPS, 0)
    want = _reference(mp, lambda step: save_ws if step < SAVE_AT else load_ws, STEPS)
    _assert_steps(first[0][0], want[:SAVE_AT], mp)
    saved = first[0][2]
    for steps, loaded, _ in resumed:
        _assert_state_equal(loaded, saved)  # the whole state, step counters included
        assert all(float(entry["step"]) == SAVE_AT for entry in loaded[1]["state"].values())
        _assert_steps(steps, want[SAVE_AT:], mp)
