"""Asking for a fused optimizer: TorchRec's fused_params dict and apply_optimizer_in_backward."""

from __future__ import annotations

import pytest
import torch

from shardkit.optim import (
    EmbOptimType,
    FusedOptimizerConfig,
    RowWiseAdagrad,
    apply_optimizer_in_backward,
)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, EmbOptimType.EXACT_ROWWISE_ADAGRAD),
        ("rowwise_adagrad", EmbOptimType.EXACT_ROWWISE_ADAGRAD),
        ("EXACT_ROW_WISE_ADAGRAD", EmbOptimType.EXACT_ROWWISE_ADAGRAD),
        ("sgd", EmbOptimType.EXACT_SGD),
        ("adagrad", EmbOptimType.EXACT_ADAGRAD),
        ("adam", EmbOptimType.ADAM),
    ],
)
def test_fused_params(name, kind):
    config = FusedOptimizerConfig.from_fused_params(
        {"optimizer": name, "learning_rate": 0.05, "eps": 1e-6, "weight_decay": 0.1}
    )
    assert config.optimizer is kind
    assert (config.learning_rate, config.eps, config.weight_decay) == (0.05, 1e-6, 0.1)


@pytest.mark.parametrize(
    ("params", "error", "pattern"),
    [
        (
            {"optimizer": "sgd", "learning_rate": 0.1, "learnin_rate": 0.2},
            ValueError,
            r"unknown fused_params key\(s\) \['learnin_rate'\]; the fused optimizer understands",
        ),
        (
            {"optimizer": "sgd", "learning_rate": 0.1, "cache_load_factor": 0.2},
            ValueError,
            r"fused_params key 'cache_load_factor' \(0.2\): UVM caching is not in shardkit: "
            r"every table lives whole",
        ),
        (
            {"optimizer": "sgd", "stochastic_rounding": True},
            ValueError,
            r"fused_params key 'stochastic_rounding' \(True\): FBGEMM's stochastic rounding",
        ),
        ({"learning_rate": 0.1}, ValueError, r"fused_params needs 'optimizer'"),
        ({"optimizer": "madgrad"}, ValueError, r"unknown fused optimizer .madgrad.; choose one of"),
        (
            {"optimizer": "sgd", "learning_rate": -1},
            ValueError,
            r"learning_rate must be >= 0, got -1",
        ),
        ({"optimizer": "adam", "beta1": 1.0}, ValueError, r"beta1 must be in \[0, 1\), got 1.0"),
        ({"optimizer": "adagrad", "eps": 0}, ValueError, r"eps must be > 0, got 0"),
    ],
)
def test_fused_params_errors(params, error, pattern):
    with pytest.raises(error, match=pattern):
        FusedOptimizerConfig.from_fused_params(params)


@pytest.mark.parametrize(
    ("cls", "kwargs", "expected"),
    [
        (torch.optim.SGD, {"lr": 0.3}, {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.3}),
        (
            torch.optim.Adagrad,
            {"lr": 0.2, "eps": 1e-5, "initial_accumulator_value": 0.1},
            {
                "optimizer": EmbOptimType.EXACT_ADAGRAD,
                "learning_rate": 0.2,
                "eps": 1e-5,
                "initial_accumulator_value": 0.1,
            },
        ),
        (
            RowWiseAdagrad,
            {"lr": 0.1},
            {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1},
        ),
        (
            torch.optim.Adam,
            {"lr": 1e-3, "betas": (0.8, 0.9)},
            {"optimizer": EmbOptimType.ADAM, "learning_rate": 1e-3, "beta1": 0.8, "beta2": 0.9},
        ),
        (
            torch.optim.SparseAdam,
            {"lr": 1e-3},
            {"optimizer": EmbOptimType.ADAM, "learning_rate": 1e-3},
        ),
    ],
)
def test_from_optimizer_class(cls, kwargs, expected):
    config = FusedOptimizerConfig.from_optimizer_class(cls, kwargs)
    for key, value in expected.items():
        assert getattr(config, key) == value


@pytest.mark.parametrize(
    ("cls", "kwargs", "pattern"),
    [
        (
            torch.optim.RMSprop,
            {"lr": 0.1},
            r"RMSprop cannot run fused in the embedding kernel; use one of",
        ),
        (
            torch.optim.SGD,
            {"lr": 0.1, "nesterov": True},
            r"SGD kwargs \['nesterov'\] are not supported fused",
        ),
        (
            torch.optim.SGD,
            {"lr": 0.1, "momentum": 0.9},
            r"SGD momentum \(0.9\) is not supported fused",
        ),
        (
            torch.optim.Adagrad,
            {"lr_decay": 0.1},
            r"Adagrad lr_decay \(0.1\) is not supported fused",
        ),
    ],
)
def test_from_optimizer_class_errors(cls, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        FusedOptimizerConfig.from_optimizer_class(cls, kwargs)


def test_rowwise_adagrad_plain_optimizer_matches_formula():
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(5, 3))
    start = weight.detach().clone()
    optimizer = RowWiseAdagrad([weight], lr=0.1, eps=1e-8)
    grads = [torch.randn(5, 3) for _ in range(3)]
    expected, acc = start.clone(), torch.zeros(5)
    for grad in grads:
        weight.grad = grad.clone()
        optimizer.step()
        acc += grad.pow(2).mean(1)
        expected -= 0.1 * grad / (acc.sqrt() + 1e-8).unsqueeze(1)
    torch.testing.assert_close(weight.detach(), expected)
    # TorchRec's state layout: a [rows, 1] sum and a step counter
    torch.testing.assert_close(optimizer.state[weight]["sum"], acc.unsqueeze(1))
    assert optimizer.state[weight]["step"].item() == 3


def test_apply_optimizer_in_backward_on_dense_params_steps_in_the_hook():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    apply_optimizer_in_backward(torch.optim.SGD, model.parameters(), {"lr": 0.5})
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    x = torch.randn(8, 4)
    model(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    ref_optimizer.step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert ours.grad is None, "the hook drops the gradient after stepping"
        torch.testing.assert_close(ours, theirs)
        assert ours._optimizer_classes == [torch.optim.SGD]
