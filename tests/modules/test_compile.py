"""Every unsharded module and model under `torch.compile`: no graph break, and the compiled
module computes what the eager one does, outputs, gradients, fused table updates and optimizer
state, on both embedding kernels (see [Note: collections under torch.compile])."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit.kernels import use_kernel
from tests.modules import pt2_models
from tests.modules.pt2_models import ADAGRAD, CASES, PER_ID, loss_of, tensors_of


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # each test compiles the same forwards anew: no recompile limit
    yield
    torch._dynamo.reset()


def _explain(
    module: torch.nn.Module, inputs: tuple
) -> torch._dynamo.backends.debugging.ExplainOutput:
    return torch._dynamo.explain(module)(*inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_graph_breaks(name):
    """`torch._dynamo.explain` with dynamo's default config; per-id outputs (their sizes are the
    data's) with ``capture_scalar_outputs``, which ``fullgraph=True`` implies."""
    build, inputs = CASES[name]
    module = build(ADAGRAD)
    with torch._dynamo.config.patch(capture_scalar_outputs=name in PER_ID):
        found = _explain(module, inputs(0))
    assert found.graph_break_count == 0, [str(b.reason)[:300] for b in found.break_reasons]
    assert found.graph_count == 1


def _train(module, inputs, steps, *, compiled_from=None):
    outputs = []
    for step in range(steps):
        args = inputs(step)
        out = module(*args)
        outputs.append([t.detach().clone() for t in tensors_of(out)])
        loss_of(out).backward()
    return outputs


def _state(module) -> dict[str, torch.Tensor]:
    state = {n: p.detach().clone() for n, p in module.named_parameters()}
    state.update({f"{n}.grad": p.grad.clone() for n, p in module.named_parameters()
                  if p.grad is not None})  # fmt: skip
    for name, sub in module.named_modules():
        fused = getattr(sub, "fused_optimizer", None)
        if fused is not None and not isinstance(fused, property):
            for key, per_param in fused.state_dict()["state"].items():
                for field, value in per_param.items():
                    state[f"{name}.{key}.{field}"] = torch.as_tensor(value).clone()
    return state


# The default run's share of the grid (its time budget): a pooled collection in a model, a
# sequence and a managed-collision collection, both kernels, fused and dense; `pytest -m
# pt2_grid` runs all of it (and Inductor).
DEFAULT = {("ec", "dense", "eager"), ("mc_ebc", "fused", "eager"),
           ("dlrm", "fused", "compiled")}  # fmt: skip


def _grid():
    for name in sorted(CASES):
        for fused in (None, ADAGRAD):
            for kernel in ("eager", "compiled"):
                mode = "fused" if fused else "dense"
                marks = () if (name, mode, kernel) in DEFAULT else (pytest.mark.pt2_grid,)
                yield pytest.param(name, fused, kernel, id=f"{name}-{mode}-{kernel}", marks=marks)


@pytest.mark.parametrize(("name", "fused", "kernel"), list(_grid()))
def test_compiled_trains_as_eager(name, fused, kernel):
    """Three steps: outputs, parameters, dense gradients and fused optimizer state equal
    (``aot_eager``: AOTAutograd's capture, functionalization and mutations, without Inductor's
    C++ build; `test_inductor_trains_as_eager` runs Inductor)."""
    build, inputs = CASES[name]
    with use_kernel(kernel):
        eager = build(fused)
        compiled = copy.deepcopy(eager)
        runner = torch.compile(compiled, backend="aot_eager", fullgraph=True, dynamic=True)
        expected = _train(eager, inputs, 3)
        got = _train(runner, inputs, 3)
    for want, have in zip(expected, got):
        for a, b in zip(want, have, strict=True):
            torch.testing.assert_close(b, a)
    want, have = _state(eager), _state(compiled)
    assert want.keys() == have.keys()
    for key in want:
        torch.testing.assert_close(have[key], want[key], msg=key)


BAD_ID = r"feature 'b' \(table 't1'\): id 70 at position 0 of the feature's values is out of range"


@pytest.mark.parametrize("kernel", [pytest.param("eager", marks=pytest.mark.pt2_grid), "compiled"])
def test_a_bad_id_is_refused_with_the_eager_message(kernel):
    """The id check runs inside the compiled module (no graph break) and raises what eager
    raises; a good batch afterwards still runs."""
    module = pt2_models.ebc(fused=ADAGRAD)
    runner = torch.compile(module, backend="aot_eager", fullgraph=True, dynamic=True)
    bad = pt2_models.kjt(0, keys=["b"], offset=70)
    with use_kernel(kernel):
        for fn in (module, runner):
            with pytest.raises(ValueError, match=BAD_ID):
                fn(pt2_models.KeyedJaggedTensor.concat([pt2_models.kjt(1, keys=["a", "c"]), bad]))
        runner(pt2_models.kjt(2)).values().sum().backward()


def test_learning_rate_and_steps_are_read_when_the_step_runs():
    """A scheduler's new learning rate and Adam's step count reach the compiled backward (they
    are read when it runs, not frozen into the graph)."""
    adam = {"optimizer": "adam", "learning_rate": 0.1}
    eager = pt2_models.ebc(fused=adam)
    compiled = copy.deepcopy(eager)
    runner = torch.compile(compiled, backend="aot_eager", fullgraph=True, dynamic=True)
    for step, lr in enumerate([0.1, 0.01, 0.5]):
        for module in (eager, compiled):
            for group in module.fused_optimizer.param_groups:
                group["lr"] = lr
        eager(pt2_models.kjt(step)).values().sum().backward()
        runner(pt2_models.kjt(step)).values().sum().backward()
    for key, value in _state(eager).items():
        torch.testing.assert_close(_state(compiled)[key], value, msg=key)


@pytest.mark.pt2_grid
@pytest.mark.parametrize("name", ["ebc_weighted_mean", "dlrm"])
def test_inductor_trains_as_eager(name):
    """Inductor (the default backend: C++ for the dense part around the tables' operator, the
    tables and optimizer state passed to the fused update in place, not copied)."""
    build, inputs = CASES[name]
    eager = build(ADAGRAD)
    compiled = copy.deepcopy(eager)
    runner = torch.compile(compiled, fullgraph=True, dynamic=True)
    for want, have in zip(_train(eager, inputs, 2), _train(runner, inputs, 2)):
        for a, b in zip(want, have, strict=True):
            torch.testing.assert_close(b, a)
    for key, value in _state(eager).items():
        torch.testing.assert_close(_state(compiled)[key], value, msg=key)
