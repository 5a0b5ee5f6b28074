"""The optional tier for ``shardkit.optim``: the same steps through TorchRec's classes and ours
give the same parameters, learning rates and state dicts."""

from __future__ import annotations

import pytest
import torch

from shardkit.optim import (
    CombinedOptimizer,
    GradientClipping,
    GradientClippingOptimizer,
    KeyedOptimizerWrapper,
    RowWiseAdagrad,
    WarmupOptimizer,
    WarmupPolicy,
    WarmupStage,
)
from tests.compat.peers import run_in_torchrec

_TORCHREC = """
from torchrec.optim import (CombinedOptimizer, GradientClipping, GradientClippingOptimizer,
                            KeyedOptimizerWrapper, RowWiseAdagrad, WarmupOptimizer, WarmupPolicy,
                            WarmupStage)
start, grads = inputs["start"], inputs["grads"]

def params():
    return {"a": torch.nn.Parameter(start["a"].clone()), "b": torch.nn.Parameter(start["b"].clone())}

def run(optimizer, ps):
    lrs = []
    for step in grads:
        for name, p in ps.items():
            p.grad = step[name].clone()
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
    return {n: p.detach() for n, p in ps.items()}, lrs

ps = params()
rowwise = RowWiseAdagrad(ps.values(), lr=0.1, lr_decay=0.1, weight_decay=0.01, eps=1e-8)
outputs["rowwise"] = run(rowwise, ps) + ({k: dict(v) for k, v in enumerate(rowwise.state.values())},)
ps = params()
# dict(ps): TorchRec's WarmupOptimizer adds its "__warmup" parameter to the dict it is given
warm = WarmupOptimizer(KeyedOptimizerWrapper(dict(ps), lambda p: torch.optim.SGD(p, lr=1.0)),
                       [WarmupStage(WarmupPolicy.LINEAR, max_iters=2, value=0.5),
                        WarmupStage(WarmupPolicy.POLY, max_iters=4, value=2.0)], lr=0.2)
outputs["warmup"] = run(warm, ps) + (warm.state_dict(),)
ps = params()
clip = GradientClippingOptimizer(KeyedOptimizerWrapper(ps, lambda p: torch.optim.SGD(p, lr=0.1)),
                                 clipping=GradientClipping.NORM, max_gradient=0.5)
outputs["clipping"] = run(clip, ps) + ({},)
ps = params()
first = KeyedOptimizerWrapper({"a": ps["a"]}, lambda p: torch.optim.Adam(p, lr=0.1))
second = KeyedOptimizerWrapper({"b": ps["b"]}, lambda p: torch.optim.Adagrad(p, lr=0.1))
combined = CombinedOptimizer([("x", first), second])
combined.save_param_groups(True)
outputs["combined"] = run(combined, ps) + (combined.state_dict(),)
"""


@pytest.fixture(scope="module")
def torchrec_runs(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    start = {"a": torch.randn(4, 3, generator=g), "b": torch.randn(2, 5, generator=g)}
    grads = [{n: torch.randn_like(t) * 3 for n, t in start.items()} for _ in range(5)]
    sent = {"start": start, "grads": grads}
    return start, grads, run_in_torchrec(_TORCHREC, sent, tmp_path_factory.mktemp("peer"))


def _run(optimizer, params, grads):
    lrs = []
    for step in grads:
        for name, p in params.items():
            p.grad = step[name].clone()
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
    return {n: p.detach() for n, p in params.items()}, lrs


def _params(start):
    return {n: torch.nn.Parameter(t.clone()) for n, t in start.items()}


def _check(theirs, ours_params, ours_lrs):
    their_params, their_lrs, _ = theirs
    for name, value in their_params.items():
        torch.testing.assert_close(ours_params[name], value, msg=name)
    assert ours_lrs == pytest.approx(their_lrs)


def test_rowwise_adagrad(torchrec_runs):
    start, grads, theirs = torchrec_runs
    ps = _params(start)
    rowwise = RowWiseAdagrad(ps.values(), lr=0.1, lr_decay=0.1, weight_decay=0.01, eps=1e-8)
    _check(theirs["rowwise"], *_run(rowwise, ps, grads))
    for index, state in enumerate(rowwise.state.values()):
        torch.testing.assert_close(state, theirs["rowwise"][2][index])


def test_warmup(torchrec_runs):
    start, grads, theirs = torchrec_runs
    ps = _params(start)
    warm = WarmupOptimizer(KeyedOptimizerWrapper(ps, lambda p: torch.optim.SGD(p, lr=1.0)),
                           [WarmupStage(WarmupPolicy.LINEAR, max_iters=2, value=0.5),
                            WarmupStage(WarmupPolicy.POLY, max_iters=4, value=2.0)], lr=0.2)  # fmt: skip
    _check(theirs["warmup"], *_run(warm, ps, grads))
    torch.testing.assert_close(warm.state_dict(), theirs["warmup"][2])


def test_gradient_clipping(torchrec_runs):
    start, grads, theirs = torchrec_runs
    ps = _params(start)
    clip = GradientClippingOptimizer(
        KeyedOptimizerWrapper(ps, lambda p: torch.optim.SGD(p, lr=0.1)),
        clipping=GradientClipping.NORM, max_gradient=0.5,
    )  # fmt: skip
    _check(theirs["clipping"], *_run(clip, ps, grads))


def test_combined_optimizer_state_dict(torchrec_runs):
    start, grads, theirs = torchrec_runs
    ps = _params(start)
    first = KeyedOptimizerWrapper({"a": ps["a"]}, lambda p: torch.optim.Adam(p, lr=0.1))
    second = KeyedOptimizerWrapper({"b": ps["b"]}, lambda p: torch.optim.Adagrad(p, lr=0.1))
    combined = CombinedOptimizer([("x", first), second])
    combined.save_param_groups(True)
    _check(theirs["combined"], *_run(combined, ps, grads))
    ours, expected = combined.state_dict(), theirs["combined"][2]
    torch.testing.assert_close(ours["state"], expected["state"])
    assert sorted(ours["state"]) == ["b", "x.a"]
    assert ours["param_groups"] == expected["param_groups"]
