"""Log loss, normalised entropy, accuracy and `BinaryMetrics`: formulas, weights, errors, and
across 1-3 ranks against one process on the concatenated examples."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from shardkit.metrics import Accuracy, BinaryMetrics, LogLoss, NormalizedEntropy, auc_score

WORLD_SIZES = [1, 2, 3]


def _examples(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=g) < 0.25).float()
    logits = 2 * labels - 1 + 1.5 * torch.randn(n, generator=g)
    weights = (torch.rand(n, generator=g) < 0.8).float()  # some zero-weight (padding)
    return logits, labels, weights


def reference(logits, labels, weights) -> dict[str, float]:
    """The single-process formulas, written out."""
    w, y, p = weights.double(), labels.double(), torch.sigmoid(logits.double())
    log_loss = float((w * -(y * p.log() + (1 - y) * (1 - p).log())).sum() / w.sum())
    base = float((w * y).sum() / w.sum())
    entropy = -(base * math.log(base) + (1 - base) * math.log(1 - base))
    return {
        "auc": auc_score(logits, labels, weights),
        "log_loss": log_loss,
        "normalized_entropy": log_loss / entropy,
        "accuracy": float((w * ((p > 0.5) == (y > 0.5)).double()).sum() / w.sum()),
        "num_examples": float(w.sum()),
        "base_rate": base,
    }


def test_each_metric_is_its_formula():
    logits, labels, weights = _examples(0, 300)
    expected = reference(logits, labels, weights)
    for cls, key in [(LogLoss, "log_loss"), (NormalizedEntropy, "normalized_entropy"),
                     (Accuracy, "accuracy")]:  # fmt: skip
        metric = cls()
        for start in range(0, 300, 64):
            rows = slice(start, start + 64)
            metric.update(logits[rows], labels[rows], weights[rows])
        assert metric.compute() == pytest.approx(expected[key], rel=1e-12), key
    both = BinaryMetrics()
    both.update(logits.unsqueeze(1), labels, weights)
    assert both.compute() == pytest.approx(expected, rel=1e-12)


def test_log_loss_matches_torch_and_probabilities_match_logits():
    logits, labels, _ = _examples(1, 50)
    metric = LogLoss()
    metric.update(logits, labels)
    torch_value = F.binary_cross_entropy_with_logits(logits.double(), labels.double())
    assert metric.compute() == pytest.approx(float(torch_value), rel=1e-12)
    from_probs = BinaryMetrics(from_logits=False)
    from_probs.update(torch.sigmoid(logits.double()), labels)
    from_logits = BinaryMetrics()
    from_logits.update(logits, labels)
    assert from_probs.compute() == pytest.approx(from_logits.compute(), rel=1e-9)


def test_undefined_values_are_nan_and_reset_forgets():
    metric = BinaryMetrics()
    assert all(math.isnan(v) for k, v in metric.compute().items() if k != "num_examples")
    metric.update(torch.tensor([2.0, -1.0]), torch.ones(2))  # one class only
    values = metric.compute()
    assert math.isnan(values["auc"]) and math.isnan(values["normalized_entropy"])
    assert values["accuracy"] == 0.5 and values["base_rate"] == 1.0
    entropy = NormalizedEntropy()
    entropy.update(torch.tensor([2.0]), torch.zeros(1))
    assert math.isnan(entropy.compute())
    metric.reset()
    assert metric.compute()["num_examples"] == 0.0


def test_probabilities_of_exactly_0_and_1_are_clipped():
    metric = LogLoss(from_logits=False)
    metric.update(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0]))
    assert metric.compute() == pytest.approx(-math.log(1e-12), rel=1e-6)


def test_accuracy_threshold():
    metric = Accuracy(threshold=0.8, from_logits=False)
    metric.update(torch.tensor([0.7, 0.9]), torch.tensor([1.0, 1.0]))
    assert metric.compute() == 0.5


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((torch.zeros(2, 2), torch.zeros(2)), ValueError, r"LogLoss.update: predictions must be \[B\] or \[B, 1\], got shape \(2, 2\)"),
        ((torch.zeros(3), torch.zeros(2)), ValueError, r"LogLoss.update: labels must have shape \(3,\) like the predictions, got \(2,\)"),
        ((torch.zeros(3), torch.zeros(3), torch.ones(3, 1)), ValueError, r"weights must have shape \(3,\) like the predictions, got \(3, 1\)"),
        (([0.5], torch.zeros(1)), TypeError, r"LogLoss.update: predictions must be a torch.Tensor, got list"),
    ],
)  # fmt: skip
def test_update_errors(args, error, match):
    with pytest.raises(error, match=match):
        LogLoss().update(*args)


def test_threshold_errors():
    with pytest.raises(ValueError, match=r"Accuracy: threshold must be in \(0, 1\), got 1.5"):
        Accuracy(threshold=1.5)
    with pytest.raises(ValueError, match=r"BinaryMetrics: threshold must be in \(0, 1\), got 0.0"):
        BinaryMetrics(threshold=0.0)


def _counts(world_size: int) -> list[int]:
    return [
        0 if (r == world_size - 1 and world_size > 2) else 40 + 13 * r for r in range(world_size)
    ]


def _rank_metrics(rank: int, world_size: int):
    logits, labels, weights = _examples(50 + rank, _counts(world_size)[rank])
    together = BinaryMetrics()
    single = [LogLoss(), NormalizedEntropy(), Accuracy()]
    for start in range(0, logits.numel(), 16):
        rows = slice(start, start + 16)
        together.update(logits[rows], labels[rows], weights[rows])
        for metric in single:
            metric.update(logits[rows], labels[rows], weights[rows])
    return together.compute(), [metric.compute() for metric in single]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_across_ranks_equals_one_process(run_ranks, world_size):
    parts = [_examples(50 + r, n) for r, n in enumerate(_counts(world_size))]
    expected = reference(*(torch.cat(column) for column in zip(*parts)))
    for together, single in run_ranks(_rank_metrics, world_size):
        assert together == pytest.approx(expected, rel=1e-12)
        keys = ["log_loss", "normalized_entropy", "accuracy"]
        assert single == pytest.approx([expected[k] for k in keys], rel=1e-12)
