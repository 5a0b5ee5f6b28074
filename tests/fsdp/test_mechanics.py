"""How units behave inside an iteration: shard layout, freeing, the bound on gathered units,
prefetch, gradient accumulation, clipping, summoning full parameters, eval, repeated forwards.
Numbers are compared with the unsharded model (float32, `models.TOL`)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from shardkit.fsdp import (
    BackwardPrefetch,
    FullyShardedDataParallel,
    ShardingStrategy,
    fully_shard,
    summon_full_params,
)
from shardkit.fsdp._state import get_state
from shardkit.fsdp.wrap import ModuleWrapPolicy
from tests.fsdp.models import (
    OPTIMIZERS,
    TOL,
    Block,
    ToyNet,
    assert_state_equal,
    batches,
    local,
    loss_fn,
    make_model,
    reference,
)
from tests.fsdp.sharded import full_state

FSDP = FullyShardedDataParallel


def _wrapped(strategy="FULL_SHARD", **kwargs):
    return FSDP(
        make_model(),
        sharding_strategy=ShardingStrategy[strategy],
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        **kwargs,
    )


def _units(model):
    return get_state(model).context.units


# ---- layout and freeing -------------------------------------------------------------------------


def _shapes(rank, ws):
    model = _wrapped()
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    values = {name: p.detach().clone() for name, p in model.named_parameters()}
    return shapes, values


def test_each_rank_keeps_torch_chunk_rows(run_ranks):
    results = run_ranks(_shapes, 3)
    full = make_model().state_dict()
    for rank, (shapes, values) in enumerate(results):
        for name, value in values.items():
            key = name.replace("_fsdp_wrapped_module.", "")
            if full[key].dim() == 0:  # 0-dim parameters are kept whole on every rank
                assert shapes[name] == ()
                torch.testing.assert_close(value, full[key])
                continue
            chunks = torch.chunk(full[key], 3)
            want = chunks[rank] if rank < len(chunks) else full[key][:0]
            assert shapes[name] == tuple(want.shape), name
            torch.testing.assert_close(value, want)
    # 7 rows over 3 ranks: 3, 3, 1; 3 rows: 1, 1, 1
    assert results[2][0]["_fsdp_wrapped_module.embed.weight"] == (1, 5)
    assert results[0][0]["_fsdp_wrapped_module.head.bias"] == (1,)


def _gathered_storage(rank, ws, strategy):
    model = _wrapped(strategy)
    x, y = local(batches(ws)[0], rank, ws)
    loss = loss_fn(model, x, y)
    after_forward = {u.name: u.group.is_unsharded for u in _units(model)}
    loss.backward()
    after_backward = {u.name: u.group.is_unsharded for u in _units(model)}
    shapes_ok = all(
        tuple(getattr(sp.slots[0].module, sp.slots[0].attr).shape) == sp.local_shape
        for u in _units(model)
        for sp in u.group.params
    )
    return after_forward, after_backward, shapes_ok


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_gathered_parameters_are_freed(run_ranks, strategy):
    for after_forward, after_backward, shapes_ok in run_ranks(_gathered_storage, 2, strategy):
        root = after_forward.pop("ToyNet")
        assert root, "the outermost unit keeps its parameters for the backward that follows"
        if strategy == "FULL_SHARD":
            assert not any(after_forward.values()), after_forward
        else:
            assert all(after_forward.values()), after_forward
        assert not any(after_backward.values()), after_backward
        assert shapes_ok, "after backward every module attribute holds the shard again"


# ---- bounded gathering and prefetch ---------------------------------------------------------


class Stack(nn.Module):
    def __init__(self, depth=6):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(*[Block(5, 9) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x)


def _observe(rank, ws, forward_prefetch, backward_prefetch):
    model = FSDP(
        Stack(),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        forward_prefetch=forward_prefetch,
        backward_prefetch=None
        if backward_prefetch is None
        else BackwardPrefetch[backward_prefetch],
    )
    units = _units(model)
    blocks = [u for u in units if u.name.startswith("blocks.")]
    seen = {"max_forward": 0, "max_backward": 0, "next_forward": [], "next_backward": []}

    def count():
        return sum(u.group.is_unsharded for u in units)

    for i, block in enumerate(model.blocks):
        inner = block.module.up

        def forward_hook(module, args, out, i=i):
            seen["max_forward"] = max(seen["max_forward"], count())
            if i + 1 < len(blocks):
                seen["next_forward"].append(blocks[i + 1].group.is_unsharded)
            out.register_hook(lambda grad, i=i: backward_hook(i))

        def backward_hook(i):
            seen["max_backward"] = max(seen["max_backward"], count())
            if i > 0:
                seen["next_backward"].append(blocks[i - 1].group.is_unsharded)

        inner.register_forward_hook(forward_hook)
    x = torch.randn(4, 5)
    for _ in range(2):  # the second iteration knows the order
        seen.update(max_forward=0, max_backward=0, next_forward=[], next_backward=[])
        model(x).sum().backward()
    return seen


@pytest.mark.parametrize(
    ("forward_prefetch", "backward_prefetch", "bound"),
    [(True, "BACKWARD_PRE", 3), (False, None, 2), (False, "BACKWARD_POST", 2)],
)
def test_gathered_units_are_bounded_and_prefetched(
    run_ranks, forward_prefetch, backward_prefetch, bound
):
    for seen in run_ranks(_observe, 2, forward_prefetch, backward_prefetch):
        # the root unit (no parameters here) + the unit computing + the one being prefetched
        assert seen["max_forward"] <= bound and seen["max_backward"] <= bound, seen
        assert all(seen["next_forward"]) == forward_prefetch, seen["next_forward"]
        if backward_prefetch == "BACKWARD_PRE":
            assert all(seen["next_backward"]), "the next unit's gather overlaps this backward"
        else:
            assert not any(seen["next_backward"]), seen["next_backward"]


def _train_prefetch(rank, ws, forward_prefetch, backward_prefetch):
    model = _wrapped(
        forward_prefetch=forward_prefetch,
        backward_prefetch=None
        if backward_prefetch is None
        else BackwardPrefetch[backward_prefetch],
    )
    optimizer = OPTIMIZERS["adam"](model.parameters())
    for batch in batches(ws):
        optimizer.zero_grad()
        loss_fn(model, *local(batch, rank, ws)).backward()
        optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize(
    ("forward_prefetch", "backward_prefetch"),
    [(True, "BACKWARD_PRE"), (True, "BACKWARD_POST"), (False, None)],
)
def test_prefetch_does_not_change_results(run_ranks, forward_prefetch, backward_prefetch):
    for got in run_ranks(_train_prefetch, 3, forward_prefetch, backward_prefetch):
        assert_state_equal(got, reference(3, "adam"))


# ---- gradient accumulation, clipping ------------------------------------------------------------


def _accumulate(rank, ws, face):
    model = make_model()
    if face == "wrapper":
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
    else:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = OPTIMIZERS["sgd"](model.parameters())
    *early, last = batches(ws, steps=3)
    for batch in early:
        if face == "wrapper":
            with model.no_sync():
                loss_fn(model, *local(batch, rank, ws)).backward()
        else:
            model.set_requires_gradient_sync(False)
            loss_fn(model, *local(batch, rank, ws)).backward()
            model.set_requires_gradient_sync(True)
    loss_fn(model, *local(last, rank, ws)).backward()
    optimizer.step()
    return full_state(model)


@pytest.mark.parametrize("face", ["wrapper", "fully_shard"])
def test_no_sync_accumulates_like_single_process(run_ranks, face):
    ref = make_model()
    optimizer = OPTIMIZERS["sgd"](ref.parameters())
    for batch in batches(2, steps=3):
        loss_fn(ref, *batch).backward()
    optimizer.step()
    for got in run_ranks(_accumulate, 2, face):
        assert_state_equal(got, ref.state_dict())


def _clip(rank, ws, norm_type, strategy):
    model = _wrapped(strategy)
    loss_fn(model, *local(batches(ws)[0], rank, ws)).backward()
    total = model.clip_grad_norm_(0.05, norm_type)
    with summon_full_params(model, with_grads=True):
        grads = {
            n.replace("_fsdp_wrapped_module.", ""): p.grad.clone()
            for n, p in model.named_parameters()
            if p.grad is not None
        }
    return total, grads


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
@pytest.mark.parametrize(
    ("ws", "strategy"), [(2, "FULL_SHARD"), (3, "SHARD_GRAD_OP"), (3, "NO_SHARD")]
)
def test_clip_grad_norm_uses_the_global_norm(run_ranks, ws, strategy, norm_type):
    ref = make_model()
    loss_fn(ref, *batches(ws)[0]).backward()
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05, norm_type)
    for total, grads in run_ranks(_clip, ws, norm_type, strategy):
        torch.testing.assert_close(total, want, **TOL)
        for name, param in ref.named_parameters():
            if param.grad is not None:
                torch.testing.assert_close(grads[name], param.grad, **TOL)


# ---- summon_full_params, eval, repeated forwards, tied weights ----------------------------------


def _summon(rank, ws):
    model = _wrapped()
    out = {}
    with summon_full_params(model):
        out["shape"] = tuple(model.blocks[0].up.weight.shape)
        with torch.no_grad():
            model.blocks[0].up.weight.fill_(0.5)
    out["after"] = tuple(model.blocks[0].up.weight.shape)
    with summon_full_params(model, rank0_only=True, writeback=False):
        out["rank0_only"] = tuple(model.blocks[0].up.weight.shape)
    out["state"] = model.state_dict()
    return out


def test_summon_full_params_shows_and_writes_back(run_ranks):
    for rank, out in enumerate(run_ranks(_summon, 3)):
        assert out["shape"] == (11, 7)
        assert out["after"] == ((4, 7) if rank < 2 else (3, 7))
        assert out["rank0_only"] == ((11, 7) if rank == 0 else out["after"])
        assert torch.all(out["state"]["blocks.0.up.weight"] == 0.5)


def _eval(rank, ws, strategy):
    model = _wrapped(strategy)
    model.eval()
    with torch.no_grad():
        out = model(batches(ws)[0][0])
    return out, any(u.group.is_unsharded for u in _units(model))


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_eval_without_grad_frees_everything(run_ranks, strategy):
    want = make_model().eval()(batches(2)[0][0])
    for out, still_gathered in run_ranks(_eval, 2, strategy):
        torch.testing.assert_close(out, want.detach(), **TOL)
        assert not still_gathered


def _two_forwards(rank, ws, strategy):
    model = _wrapped(strategy)
    optimizer = OPTIMIZERS["adam"](model.parameters())
    first, second = batches(ws, steps=2)
    loss = loss_fn(model, *local(first, rank, ws)) + loss_fn(model, *local(second, rank, ws))
    loss.backward()
    optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_two_forwards_then_one_backward(run_ranks, strategy):
    ref = make_model()
    optimizer = OPTIMIZERS["adam"](ref.parameters())
    first, second = batches(2, steps=2)
    (loss_fn(ref, *first) + loss_fn(ref, *second)).backward()
    optimizer.step()
    for got in run_ranks(_two_forwards, 2, strategy):
        assert_state_equal(got, ref.state_dict())


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encode = nn.Linear(5, 5)
        self.decode = nn.Linear(5, 5)
        self.decode.weight = self.encode.weight

    def forward(self, x):
        return self.decode(torch.tanh(self.encode(x)))


def _tied(rank, ws):
    model = FSDP(Tied())
    optimizer = OPTIMIZERS["adam"](model.parameters())
    x = torch.randn(ws * 2, 5, generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        optimizer.zero_grad()
        model(x.chunk(ws)[rank]).pow(2).mean().backward()
        optimizer.step()
    return model.state_dict()


def test_tied_parameters_in_one_unit(run_ranks):
    ref = Tied()
    optimizer = OPTIMIZERS["adam"](ref.parameters())
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        optimizer.zero_grad()
        ref(x).pow(2).mean().backward()
        optimizer.step()
    for got in run_ranks(_tied, 3):
        assert_state_equal(got, ref.state_dict())
        assert torch.equal(got["encode.weight"], got["decode.weight"])


class CheckpointedNet(ToyNet):
    """ToyNet whose blocks recompute their forward during backward (non-reentrant checkpoint)."""

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        hidden = self.embed(x) + self.frozen
        for block in self.blocks:
            hidden = checkpoint(block, hidden, use_reentrant=False)
        return self.head(hidden) * self.scale + self.offset


def _checkpointed(rank, ws):
    torch.manual_seed(0)
    model = CheckpointedNet()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = OPTIMIZERS["adam"](model.parameters())
    ctx = get_state(model).context
    states = []  # the tree's training state each time block 0 runs
    model.blocks[0].register_forward_pre_hook(lambda *_: states.append(ctx.state.name))
    for batch in batches(ws):
        optimizer.zero_grad()
        loss_fn(model, *local(batch, rank, ws)).backward()
        optimizer.step()
    units = [get_state(model), get_state(model.blocks[0]), get_state(model.blocks[1])]
    order = [units.index(unit) for unit in ctx.forward_order]
    return states, order, ctx.state.name, full_state(model)


def test_activation_checkpointing_inside_units(run_ranks):
    """Checkpointing calls the units themselves again in backward: a re-forward (see [Note:
    training state]) that leaves the forward order, which steers prefetching, alone."""
    for states, order, after, got in run_ranks(_checkpointed, 2):
        assert states == ["FORWARD", "RE_FORWARD"] * 3  # forward and recomputation, 3 steps
        assert order == [0, 1, 2]  # the root, blocks 0 and 1: the forward's, not a re-forward's
        assert after == "IDLE"
        assert_state_equal(got, reference(2, "adam"))


def _log_lines(rank, ws):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("shardkit.fsdp")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        _wrapped()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    return [r.getMessage() for r in records]


def test_structural_decisions_are_logged(run_ranks):
    lines = run_ranks(_log_lines, 2)[0]
    assert any(
        "auto-wrap with ModuleWrapPolicy({Block}): 2 unit(s) inside ToyNet: blocks.0, blocks.1"
        in line
        for line in lines
    ), lines
    assert any(
        line.startswith("unit 'blocks.0': 6 parameter(s)") and "FULL_SHARD over 2 rank(s)" in line
        for line in lines
    ), lines


def _checkpoint_wrapped(rank, ws, face):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    from shardkit.fsdp import optim_state_dict

    model = make_model()
    if face == "fully_shard":  # torchtitan's order: checkpointing first, then fully_shard
        model.blocks = nn.Sequential(*[checkpoint_wrapper(block) for block in model.blocks])
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    else:  # FSDP1's order: wrap, then checkpoint the wrapped blocks
        model = _wrapped()
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    optimizer = OPTIMIZERS["sgd"](model.parameters())
    ctx = get_state(model).context
    states = []  # the tree's training state each time block 0's layer runs
    model.blocks[0].up.register_forward_hook(lambda *_: states.append(ctx.state.name))
    for batch in batches(ws):
        optimizer.zero_grad()
        loss_fn(model, *local(batch, rank, ws)).backward()
        optimizer.step()
    names = sorted(optim_state_dict(model, optimizer)["state"])
    return states, list(model.state_dict()), names, full_state(model)


@pytest.mark.parametrize("face", ["fully_shard", "wrapper"])
def test_checkpoint_wrapper_per_block(run_ranks, face):
    """Activation checkpointing per block (torch's checkpoint_wrapper): the forward of each block
    runs again in backward, training equals the unsharded model, and state dict keys and
    optimizer state names are the unsharded model's. The recomputation runs inside the unit
    (the wrapper recomputes the module it wraps, not the unit's forward): no re-forward."""
    want = reference(2, "sgd")
    for states, keys, names, state in run_ranks(_checkpoint_wrapped, 2, face):
        assert states == ["FORWARD", "BACKWARD"] * 3  # forward and recomputation, 3 steps
        assert keys == list(want)
        assert names == sorted(n for n, p in make_model().named_parameters() if p.requires_grad)
        assert_state_equal(state, want)


def _custom_policy(rank, ws):
    from shardkit.fsdp import MixedPrecision
    from shardkit.fsdp.wrap import CustomPolicy

    low = MixedPrecision(param_dtype=torch.bfloat16)

    def per_unit(module):
        if module is model.blocks[1]:
            return {"mixed_precision": low}
        return isinstance(module, Block)

    model = make_model()
    wrapped = FSDP(model, auto_wrap_policy=CustomPolicy(per_unit))
    dtypes = [get_state(b).config.precision.param_dtype for b in wrapped.blocks]
    try:
        FSDP(make_model(), auto_wrap_policy=CustomPolicy(lambda m: {"sharding_strategy": None}))
    except ValueError as exc:
        return dtypes, str(exc)


def test_custom_policy_overrides_per_unit(run_ranks):
    dtypes, message = run_ranks(_custom_policy, 2)[0]
    assert dtypes == [None, torch.bfloat16]
    assert message.startswith(
        "CustomPolicy overrides ['sharding_strategy'] for a unit; shardkit takes per-unit "
        "mixed_precision, cpu_offload, backward_prefetch, forward_prefetch"
    )
