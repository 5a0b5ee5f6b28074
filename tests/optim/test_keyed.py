"""Keyed optimizers (TorchRec's `KeyedOptimizer` family): state by name, strict in-place loads,
`CombinedOptimizer` of a list or of pairs, wrappers that delegate."""

from __future__ import annotations

import pytest
import torch

from shardkit.optim import (
    CombinedOptimizer,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    OptimizerWrapper,
)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


def _adam(model: torch.nn.Module) -> KeyedOptimizerWrapper:
    return KeyedOptimizerWrapper(
        dict(model.named_parameters()), lambda params: torch.optim.Adam(params, lr=0.1)
    )


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(5, 3, generator=g)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


def test_wrapper_trains_as_the_wrapped_optimizer_and_keys_state_by_name():
    ours, theirs = _model(), _model()
    keyed = _adam(ours)
    plain = torch.optim.Adam(theirs.parameters(), lr=0.1)
    _train(ours, keyed, 3)
    _train(theirs, plain, 3)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b)
    state = keyed.state_dict()
    assert sorted(state) == ["state"]  # param groups only with save_param_groups(True)
    assert sorted(state["state"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert sorted(state["state"]["0.weight"]) == ["exp_avg", "exp_avg_sq", "step"]
    keyed.save_param_groups(True)
    groups = keyed.state_dict()["param_groups"]
    assert groups[0]["params"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert groups[0]["lr"] == 0.1


def test_load_copies_in_place_and_training_continues_identically():
    model, twin = _model(), _model()
    keyed = _adam(model)
    _train(model, keyed, 2)
    twin.load_state_dict(model.state_dict())
    other = _adam(twin)
    other.init_state()  # creates the (lazy) Adam state, so that the load can fill it in place
    live = other.state[twin[0].weight]["exp_avg"]
    other.load_state_dict(keyed.state_dict())
    assert other.state[twin[0].weight]["exp_avg"] is live
    torch.testing.assert_close(other.state_dict()["state"], keyed.state_dict()["state"])
    _train(model, keyed, 2, seed=5)
    _train(twin, other, 2, seed=5)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b)


def test_load_is_strict():
    model = _model()
    trained = _adam(model)
    _train(model, trained, 1)
    fresh = _adam(_model())
    with pytest.raises(ValueError, match=r"the optimizer holds state for 0 parameter\(s\), the "
                       r"saved state for 4; run a step \(or init_state\(\)\) first"):  # fmt: skip
        fresh.load_state_dict(trained.state_dict())
    fresh.init_state()
    renamed = {"state": {f"x.{k}": v for k, v in trained.state_dict()["state"].items()}}
    with pytest.raises(ValueError, match=r"no saved state for '0.weight'"):
        fresh.load_state_dict(renamed)
    short = trained.state_dict()
    del short["state"]["0.bias"]["exp_avg"]
    with pytest.raises(ValueError, match=r"'0.bias' has state \['exp_avg', 'exp_avg_sq', 'step'\]"):
        fresh.load_state_dict(short)


def test_saved_param_groups_are_restored_by_parameter_names():
    model = _model()
    keyed = _adam(model)
    keyed.save_param_groups(True)
    keyed.init_state()
    saved = keyed.state_dict()
    saved["param_groups"][0]["lr"] = 0.5
    keyed.load_state_dict(saved)
    assert keyed.param_groups[0]["lr"] == 0.5
    saved["param_groups"][0]["params"] = ["0.weight"]
    with pytest.raises(ValueError, match=r"no saved param group for '0.bias/0.weight/2.bias"):
        keyed.load_state_dict(saved)


def test_state_keys_must_be_params():
    p, q = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    with pytest.raises(ValueError, match=r"1 state key\(s\) are not among params"):
        KeyedOptimizer({"p": p}, {q: {}}, [{"params": [p]}])
    with pytest.raises(NotImplementedError, match=r"fixed set of named parameters"):
        KeyedOptimizer({"p": p}, {}, [{"params": [p]}]).add_param_group({"params": [q]})


@pytest.mark.parametrize("form", ["list", "pairs", "mixed"])
def test_combined_optimizer_takes_a_list_or_pairs(form):
    model = _model()
    first = KeyedOptimizerWrapper(
        dict(model[0].named_parameters()), lambda p: torch.optim.SGD(p, lr=0.1)
    )
    second = KeyedOptimizerWrapper(
        dict(model[2].named_parameters()), lambda p: torch.optim.Adam(p, lr=0.01)
    )
    optims = {
        "list": [first, second],
        "pairs": [("a", first), ("b", second)],
        "mixed": [("a", first), second],
    }[form]
    if form == "list":
        with pytest.raises(ValueError, match=r"parameter key 'weight' appears in two optimizers"):
            CombinedOptimizer(optims)
        return
    combined = CombinedOptimizer(optims)
    expected = {"pairs": ["a.bias", "a.weight", "b.bias", "b.weight"],
                "mixed": ["a.bias", "a.weight", "bias", "weight"]}[form]  # fmt: skip
    assert sorted(combined.params) == expected
    reference = _model()
    sgd = torch.optim.SGD(reference[0].parameters(), lr=0.1)
    adam = torch.optim.Adam(reference[2].parameters(), lr=0.01)
    _train(model, combined, 3)
    _train(reference, _Both(sgd, adam), 3)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b)
    # plain SGD keeps no state; Adam's is under its key
    assert sorted(combined.state_dict()["state"]) == [k for k in expected if "a." not in k]


class _Both:
    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def zero_grad(self):
        for o in self.optimizers:
            o.zero_grad()

    def step(self):
        for o in self.optimizers:
            o.step()


def test_an_lr_scheduler_on_the_combination_sets_every_inner_rate():
    model = _model()
    combined = CombinedOptimizer(
        [
            ("dense", _adam(model)),
            ("head", torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1.0)),
        ]
    )
    scheduler = torch.optim.lr_scheduler.StepLR(combined, step_size=1, gamma=0.5)
    _train(model, combined, 1)
    scheduler.step()
    assert [g["lr"] for g in combined.param_groups] == [0.05, 0.5]
    assert sorted(combined.params)[-1] == "head.0"  # a plain optimizer: keyed by position


def test_optimizer_wrapper_delegates():
    model = _model()
    inner = _adam(model)
    wrapper = OptimizerWrapper(inner)
    assert wrapper.params is inner.params and wrapper.param_groups is inner.param_groups
    _train(model, wrapper, 1)
    assert wrapper.state_dict()["state"].keys() == inner.state_dict()["state"].keys()
    with pytest.raises(TypeError, match=r"OptimizerWrapper wraps a KeyedOptimizer, got SGD"):
        OptimizerWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
