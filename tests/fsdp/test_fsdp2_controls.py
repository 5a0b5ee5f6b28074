"""`FSDPModule`'s controls, with FSDP2's names and semantics: each test observes what the control
changes (gathers, reductions, which tensors the modules hold), so it fails if the control were a
no-op, and checks that training still equals the single-process model."""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from torch import nn

from shardkit.fsdp import (
    FSDPModule,
    UnshardHandle,
    fully_shard,
    register_fsdp_forward_method,
)
from shardkit.fsdp._state import get_state
from tests.fsdp.models import (
    OPTIMIZERS,
    TOL,
    Block,
    assert_state_equal,
    batches,
    local,
    loss_fn,
    make_model,
    reference,
    shard_blocks,
    train,
)
from tests.fsdp.sharded import full_state


def _count(module_path: str, name: str):
    """Patch ``module_path.comm.<name>`` to count its calls (the real one still runs)."""
    import importlib

    comm = importlib.import_module(module_path).comm
    return mock.patch.object(comm, name, wraps=getattr(comm, name))


# ---- unshard / reshard --------------------------------------------------------------------------


def _unshard(rank, ws):
    model = shard_blocks(make_model())
    block = model.blocks[0]
    group = get_state(block).group
    out = {"full": block.up.weight.full_tensor().clone()}
    handle = block.unshard(async_op=True)
    out["handle"] = type(handle).__name__
    out["pending"] = group.buckets[0]._gather is not None  # the gather was started
    out["before_wait"] = type(block.up.weight).__name__
    handle.wait()
    out["after_wait"] = (type(block.up.weight).__name__, block.up.weight.detach().clone())
    out["sibling"] = get_state(model.blocks[1]).group.is_unsharded  # not recursive
    block.reshard()
    out["resharded"] = (type(block.up.weight).__name__, group.is_unsharded)
    out["sync"] = block.unshard()
    out["sync_type"] = type(block.up.weight).__name__
    block.reshard()
    return out


def test_unshard_and_reshard(run_ranks):
    assert issubclass(UnshardHandle, object)
    for out in run_ranks(_unshard, 2):
        assert out["handle"] == "UnshardHandle" and out["pending"]
        assert out["before_wait"] == "DTensor"
        kind, value = out["after_wait"]
        assert kind == "Parameter"
        torch.testing.assert_close(value, out["full"])
        assert not out["sibling"]
        assert out["resharded"] == ("DTensor", False)
        assert out["sync"] is None and out["sync_type"] == "Parameter"


# ---- gradient sync and accumulation -------------------------------------------------------------


def _no_sync(rank, ws, recurse):
    model = shard_blocks(make_model())
    with _count("shardkit.fsdp._flat", "reduce_scatter_tensor") as scatter:
        model.set_requires_gradient_sync(False, recurse=recurse)
        loss_fn(model, *local(batches(ws)[0], rank, ws)).backward()
        calls = scatter.call_count
    grads = {n: p.grad is not None for n, p in model.named_parameters()}
    return calls, grads


def test_set_requires_gradient_sync_skips_communication(run_ranks):
    for calls, grads in run_ranks(_no_sync, 2, True):
        assert calls == 0
        assert not any(grads.values()), grads  # the gradients wait on the gathered parameters
    for calls, grads in run_ranks(_no_sync, 2, False):  # only the root stops syncing
        assert calls == 2  # the blocks' reduce-scatters
        assert grads["blocks.0.up.weight"] and not grads["head.weight"]


# ---- reshard after backward -------------------------------------------------------------------


def _keep_after_backward(rank, ws):
    model = shard_blocks(make_model())
    optimizer = OPTIMIZERS["sgd"](model.parameters())
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)  # holds no shards
    model.set_reshard_after_backward(False)
    first, second = (local(b, rank, ws) for b in batches(ws, steps=2))
    loss_fn(model, *first).backward()
    kept = [get_state(m).group.is_unsharded for m in (model, *model.blocks)]
    other.step()  # leaves the shards, and so what backward kept, alone
    with _count("shardkit.fsdp._flat", "all_gather_into_tensor") as gather:
        model(first[0])
        without_step = gather.call_count
    optimizer.zero_grad()
    loss_fn(model, *first).backward()
    optimizer.step()  # the shards change: the next forward must gather again
    optimizer.zero_grad()
    with _count("shardkit.fsdp._flat", "all_gather_into_tensor") as gather:
        loss_fn(model, *second).backward()
        after_step = gather.call_count
    optimizer.step()
    hooks = [
        (len(o._optimizer_step_pre_hooks), len(o._optimizer_step_post_hooks))
        for o in (optimizer, other)
    ]
    return kept, without_step, after_step, hooks, full_state(model)


def test_set_reshard_after_backward_keeps_parameters_until_the_shards_change(run_ranks):
    ref = make_model()
    optimizer = OPTIMIZERS["sgd"](ref.parameters())
    first, second = batches(2, steps=2)
    loss_fn(ref, *first).backward()
    optimizer.zero_grad()
    loss_fn(ref, *first).backward()
    optimizer.step()
    optimizer.zero_grad()
    loss_fn(ref, *second).backward()
    optimizer.step()
    for kept, without_step, after_step, hooks, state in run_ranks(_keep_after_backward, 2):
        assert all(kept), kept
        assert without_step == 0  # the forward used what backward kept (another optimizer ran)
        assert hooks == [(1, 1), (0, 0)]  # step hooks on the optimizer of shards only
        assert after_step > 0  # stale after the optimizer step: gathered again
        assert_state_equal(state, ref.state_dict())


# ---- last backward ------------------------------------------------------------------------------


def _not_last(rank, ws):
    model = shard_blocks(make_model())
    optimizer = OPTIMIZERS["sgd"](model.parameters())
    ctx = get_state(model).context
    lingering = []
    for batch in batches(ws):
        optimizer.zero_grad()
        model.set_is_last_backward(False)
        loss_fn(model, *local(batch, rank, ws)).backward()
        lingering.append((bool(ctx._pending_reduce), model.head.weight.grad is None))
        optimizer.step()  # waits for the reduction left in flight
    model.set_is_last_backward(True)
    loss_fn(model, *local(batches(ws)[0], rank, ws)).backward()
    return lingering, bool(ctx._pending_reduce), full_state(model)


def test_set_is_last_backward_leaves_the_last_reduction_in_flight(run_ranks):
    for lingering, pending_after_last, state in run_ranks(_not_last, 2):
        assert all(pending and no_grad for pending, no_grad in lingering), lingering
        assert not pending_after_last
        assert_state_equal(state, reference(2, "sgd"))


# ---- explicit prefetch --------------------------------------------------------------------------


class Stack(nn.Module):
    def __init__(self, depth=4):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(*[Block(5, 9) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x)


def _prefetch(rank, ws, explicit):
    model = shard_blocks(Stack())
    blocks = list(model.blocks)
    states = [get_state(b).group for b in blocks]
    if explicit:
        blocks[0].set_modules_to_forward_prefetch([blocks[1], blocks[2]])
        blocks[3].set_modules_to_backward_prefetch([blocks[2], blocks[1]])
    seen = {}

    def in_forward(module, args, out):
        seen.setdefault("forward", states[2].is_unsharded)

    def in_backward(module, args, out):
        def hook(grad):
            seen.setdefault("backward", states[1].is_unsharded)

        out.register_hook(hook)

    blocks[0].up.register_forward_hook(in_forward)

    blocks[3].up.register_forward_hook(in_backward)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(rank))
    model(x).sum().backward()  # the first iteration: no order recorded yet
    return seen


def test_explicit_prefetch_gathers_the_modules_named(run_ranks):
    for seen in run_ranks(_prefetch, 2, True):
        assert seen == {"forward": True, "backward": True}
    for seen in run_ranks(_prefetch, 2, False):  # the defaults reach one unit ahead at most
        assert seen == {"forward": False, "backward": False}


def _prefetch_training(rank, ws):
    model = shard_blocks(make_model())
    model.set_modules_to_forward_prefetch([model.blocks[0], model.blocks[1]])
    model.blocks[1].set_modules_to_backward_prefetch([model.blocks[0]])
    train(model, OPTIMIZERS["sgd"](model.parameters()), batches(ws), rank, ws)
    return full_state(model)


def test_explicit_prefetch_does_not_change_results(run_ranks):
    for got in run_ranks(_prefetch_training, 3):
        assert_state_equal(got, reference(3, "sgd"))


# ---- reshard after forward, reset ---------------------------------------------------------------


def _reshard_after_forward(rank, ws):
    model = shard_blocks(make_model())
    model.set_reshard_after_forward(True, recurse=False)
    model.blocks[0].set_reshard_after_forward(False)
    loss = loss_fn(model, *local(batches(ws)[0], rank, ws))
    after_forward = [get_state(m).group.is_unsharded for m in (model, *model.blocks)]
    loss.backward()
    return after_forward


def test_set_reshard_after_forward(run_ranks):
    for after_forward in run_ranks(_reshard_after_forward, 2):
        # the root frees its parameters now (default: keeps them); block 0 keeps its own
        assert after_forward == [False, True, False]


class Boom(RuntimeError):
    pass


def _reset(rank, ws):
    model = shard_blocks(make_model())
    optimizer = OPTIMIZERS["sgd"](model.parameters())

    def boom(module, args, output):
        raise Boom("in forward")

    handle = model.blocks[1].register_forward_hook(boom)
    with pytest.raises(Boom):
        model(local(batches(ws)[0], rank, ws)[0])
    stuck = any(get_state(m).group.is_unsharded for m in (model, *model.blocks))
    handle.remove()
    model.reset_iter_state()
    freed = not any(get_state(m).group.is_unsharded for m in (model, *model.blocks))
    train(model, optimizer, batches(ws), rank, ws)
    return stuck, freed, full_state(model)


def test_reset_iter_state_after_a_forward_that_raised(run_ranks):
    for stuck, freed, state in run_ranks(_reset, 2):
        assert stuck and freed
        assert_state_equal(state, reference(2, "sgd"))


# ---- forward methods ----------------------------------------------------------------------------


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(5, 7)

    def forward(self, x):
        return self.proj(x).relu()

    def encode(self, x):
        return self.proj(x) * 2


def _forward_method(rank, ws, register):
    model = Encoder()
    fully_shard(model)
    if register:
        register_fsdp_forward_method(model, "encode")
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    try:
        return model.encode(x)
    except Exception as exc:  # torch's DTensor dispatch error
        return str(exc)


def test_register_fsdp_forward_method(run_ranks):
    want = Encoder().encode(torch.randn(3, 5, generator=torch.Generator().manual_seed(1)))
    for got in run_ranks(_forward_method, 2, True):
        torch.testing.assert_close(got, want.detach(), **TOL)
    for got in run_ranks(_forward_method, 2, False):  # DTensor weights meet a plain input
        assert isinstance(got, str) and "DTensor" in got, got
    plain = Encoder()
    register_fsdp_forward_method(plain, "encode")  # not an FSDPModule: nothing changes
    assert plain.encode.__func__ is Encoder.encode


# ---- the class swap, unsupported controls -------------------------------------------------------


def _swap(rank, ws):
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    fully_shard(model)
    out = {
        "class": type(model).__name__,
        "mro2": type(model).__mro__[2] is nn.Sequential,
        "slice": type(model[1:]).__name__,
    }
    for call in (
        lambda: copy.deepcopy(model),
        lambda: model.set_custom_all_gather(None),
        lambda: model.to(torch.float64),
    ):
        try:
            call()
        except (TypeError, NotImplementedError, ValueError) as exc:
            out.setdefault("errors", []).append(str(exc))
    return out


def test_class_swap_and_refusals(run_ranks):
    out = run_ranks(_swap, 2)[0]
    assert out["class"] == "FSDPSequential" and out["mro2"]
    assert out["slice"] == "Sequential"  # containers' new instances are plain modules
    assert isinstance(FSDPModule, type)
    deep, custom, move = out["errors"]
    assert deep.startswith("FSDPSequential is fully sharded and cannot be deep-copied")
    assert custom.startswith("FSDPModule.set_custom_all_gather is not offered by shardkit: ")
    assert move == (
        "unit 'Sequential' holds parameter '0.weight' as a torch.float32 shard on cpu; moving "
        "it to torch.float64 on cpu is not supported: build the model on its device and dtype "
        "before sharding it (or on the meta device, then to_empty(device=...) on that device), "
        "and use MixedPrecisionPolicy / MixedPrecision for lower-precision compute"
    )


def _to_empty(rank, ws, states):
    from tests.fsdp.models import ToyNet

    with torch.device("meta"):
        model = ToyNet()
    shard_blocks(model)
    params = list(model.parameters())
    model.to_empty(device="cpu")  # FSDP2's meta-device init: then load or initialise
    same_objects = all(a is b for a, b in zip(params, model.parameters()))
    model.load_state_dict(states)
    train(model, OPTIMIZERS["sgd"](model.parameters()), batches(ws), rank, ws)
    return same_objects, full_state(model)


def test_to_empty_then_load_state_dict(run_ranks):
    states = make_model().state_dict()
    for same_objects, state in run_ranks(_to_empty, 3, states):
        assert same_objects  # an optimizer built before to_empty would still hold them
        assert_state_equal(state, reference(3, "sgd"))
