"""`WarmupOptimizer` (rates by stage, resumed from a checkpoint) and `GradientClippingOptimizer`
(local and across ranks) against TorchRec's documented formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from shardkit.optim import (
    GradientClipping,
    GradientClippingOptimizer,
    KeyedOptimizerWrapper,
    WarmupOptimizer,
    WarmupPolicy,
    WarmupStage,
)


def _keyed(params: dict[str, torch.nn.Parameter], lr: float = 1.0) -> KeyedOptimizerWrapper:
    return KeyedOptimizerWrapper(params, lambda p: torch.optim.SGD(p, lr=lr))


def _step(optimizer, params, grad: float = 1.0) -> None:
    for p in params.values():
        p.grad = torch.full_like(p, grad)
    optimizer.step()


@pytest.mark.parametrize(
    ("stage", "formula"),
    [
        (WarmupStage(WarmupPolicy.LINEAR, max_iters=4, value=0.2), lambda t: 0.2 + 0.8 * t / 4),
        (WarmupStage(WarmupPolicy.CONSTANT, max_iters=4, value=0.3), lambda t: 0.3),
        (WarmupStage(WarmupPolicy.POLY, max_iters=4, value=2.0), lambda t: (1 - t / 4) ** 2),
        (WarmupStage(WarmupPolicy.STEP, max_iters=4, value=0.5, decay_iters=2),
         lambda t: 0.5 ** (t // 2)),
        (WarmupStage(WarmupPolicy.INVSQRT, max_iters=4), lambda t: 1 / math.sqrt(max(t, 1))),
        (WarmupStage(WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS, max_iters=4, value=0.1,
                     sgdr_period=3),
         lambda t: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t % 3) / 3))),
        (WarmupStage(WarmupPolicy.INTERPOLATE, max_iters=4, value=1.0, end_value=0.0,
                     start_interpolating_iters=1),
         lambda t: 1.0 - (t - 1) / 3),
        (WarmupStage(WarmupPolicy.LINEAR, max_iters=4, value=0.0, lr_scale=2.0),
         lambda t: 2.0 * t / 4),
    ],
)  # fmt: skip
def test_rate_follows_the_stage_formula_then_stays_at_lr(stage, formula):
    params = {"w": torch.nn.Parameter(torch.zeros(2))}
    optimizer = WarmupOptimizer(_keyed(params), [stage], lr=0.5)
    seen = []
    for t in range(7):
        seen.append((t, optimizer.param_groups[0]["lr"]))
        _step(optimizer, params)
    for t, lr in seen:
        expected = 0.5 * formula(t) if t <= 4 else 0.5
        assert lr == pytest.approx(expected), f"iteration {t}"


def test_stages_chain_and_the_parameters_move_by_the_scheduled_rate():
    params = {"w": torch.nn.Parameter(torch.zeros(1))}
    stages = [
        WarmupStage(WarmupPolicy.LINEAR, max_iters=2, value=0.5),
        WarmupStage(WarmupPolicy.CONSTANT, max_iters=4, value=0.1),
    ]
    optimizer = WarmupOptimizer(_keyed(params), stages, lr=1.0)
    rates = []
    for _ in range(6):
        rates.append(optimizer.param_groups[0]["lr"])
        _step(optimizer, params, grad=1.0)
    assert rates == pytest.approx([0.5, 0.75, 1.0, 0.1, 0.1, 1.0])
    torch.testing.assert_close(params["w"].detach(), -torch.tensor([sum(rates)]))


def test_the_schedule_resumes_from_a_checkpoint():
    params = {"w": torch.nn.Parameter(torch.zeros(1))}
    stages = [WarmupStage(WarmupPolicy.LINEAR, max_iters=10, value=0.0)]
    optimizer = WarmupOptimizer(_keyed(params), stages, lr=1.0)
    for _ in range(3):
        _step(optimizer, params)
    saved = optimizer.state_dict()
    assert saved["state"]["__warmup"]["warmup"].tolist() == [3, 0]
    again = {"w": torch.nn.Parameter(torch.zeros(1))}
    resumed = WarmupOptimizer(_keyed(again), stages, lr=1.0)
    assert resumed.param_groups[0]["lr"] == 0.0
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["lr"] == pytest.approx(0.3)


def test_bad_stages_are_refused():
    with pytest.raises(ValueError, match=r"stage 1 ends at max_iters=2, not after the previous "):
        WarmupOptimizer(_keyed({"w": torch.nn.Parameter(torch.zeros(1))}),
                        [WarmupStage(max_iters=3), WarmupStage(max_iters=2)])  # fmt: skip
    with pytest.raises(ValueError, match=r"INTERPOLATE\) needs start_interpolating_iters"):
        WarmupStage(WarmupPolicy.INTERPOLATE, max_iters=3)


def _params(seed: int) -> dict[str, torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = {n: torch.nn.Parameter(torch.randn(3, 2, generator=g)) for n in ("a", "b")}
    for p in params.values():
        p.grad = torch.randn(3, 2, generator=g) * 5
    return params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, "inf"])
def test_norm_clipping_matches_torch(norm_type):
    ours, theirs = _params(0), _params(0)
    optimizer = GradientClippingOptimizer(
        _keyed(ours, lr=0.1), clipping=GradientClipping.NORM, max_gradient=1.0, norm_type=norm_type
    )
    optimizer.step()
    total = torch.nn.utils.clip_grad_norm_(list(theirs.values()), 1.0, norm_type=float(norm_type))
    torch.optim.SGD(theirs.values(), lr=0.1).step()
    torch.testing.assert_close(optimizer.last_total_grad_norm, total)
    for name in ours:
        torch.testing.assert_close(ours[name].grad, theirs[name].grad)
        torch.testing.assert_close(ours[name], theirs[name])


def test_value_clipping_and_tracking():
    ours = _params(1)
    before = torch.cat([p.grad.flatten() for p in ours.values()])
    optimizer = GradientClippingOptimizer(
        _keyed(ours), clipping=GradientClipping.VALUE, max_gradient=0.5, track_grad_norm=True
    )
    optimizer.step()
    torch.testing.assert_close(optimizer.last_total_grad_norm, before.norm())
    after = torch.cat([p.grad.flatten() for p in ours.values()])
    torch.testing.assert_close(after, before.clamp(-0.5, 0.5))
    with pytest.raises(ValueError, match=r"max_gradient must be > 0, got 0"):
        GradientClippingOptimizer(_keyed(_params(2)), max_gradient=0)


def _global_clip(rank: int, world_size: int, norm_type: float):
    """A [6, 2] table sharded by rows over the ranks plus a replicated bias: the clipped
    gradients must be the unsharded model's."""
    full = _params(7)
    rows = 6 // world_size
    table = torch.nn.Parameter(torch.zeros(rows, 2))
    g = torch.Generator().manual_seed(3)
    full_grad = torch.randn(6, 2, generator=g) * 4
    table.grad = full_grad[rank * rows : (rank + 1) * rows].clone()
    bias = full["a"]
    optimizer = GradientClippingOptimizer(
        _keyed({"table": table, "bias": bias}),
        clipping=GradientClipping.NORM,
        max_gradient=1.0,
        norm_type=norm_type,
        enable_global_grad_clip=True,
        param_to_pgs={table: [dist.group.WORLD]},
    )
    optimizer.clip_grad_norm_()
    return optimizer.compute_total_grad_norm()[0], table.grad, bias.grad, full_grad


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_global_clipping_over_sharded_rows_matches_the_unsharded_model(run_ranks, norm_type):
    results = run_ranks(_global_clip, 2, norm_type)
    full_grad = results[0][3]
    bias = _params(7)["a"]  # the same replicated parameter and gradient as on every rank
    table = torch.nn.Parameter(torch.zeros(6, 2))
    table.grad = full_grad.clone()
    torch.nn.utils.clip_grad_norm_([table, bias], 1.0, norm_type=norm_type)
    torch.testing.assert_close(torch.cat([r[1] for r in results]), table.grad)
    for result in results:
        torch.testing.assert_close(result[2], bias.grad)
        assert float(result[0]) <= 1.0 + 1e-4  # the norm after clipping
