"""Exact AUC: against the O(n^2) pair count, and across 1-3 ranks against one process on the
concatenated examples."""

from __future__ import annotations

import math

import pytest
import torch

from shardkit.metrics import AUC, auc_score

WORLD_SIZES = [1, 2, 3]


def pair_count_auc(scores, labels, weights=None) -> float:
    """The definition: weighted share of (positive, negative) pairs ranked right, ties 1/2."""
    s, y = scores.double(), labels.double()
    w = torch.ones_like(s) if weights is None else weights.double()
    positive, negative = w * y, w * (1 - y)
    above = (s[:, None] > s[None, :]).double() + 0.5 * (s[:, None] == s[None, :]).double()
    return float(positive @ above @ negative / (positive.sum() * negative.sum()))


def _examples(seed: int, n: int, *, ties: bool = True):
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=g) < 0.3).float()
    scores = labels + torch.randn(n, generator=g)
    if ties:
        scores = (scores * 4).round() / 4  # many equal scores
    weights = torch.rand(n, generator=g) * 2
    return scores, labels, weights


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_pair_count(seed):
    scores, labels, weights = _examples(seed, 200)
    assert auc_score(scores, labels) == pytest.approx(pair_count_auc(scores, labels), abs=1e-12)
    assert auc_score(scores, labels, weights) == pytest.approx(
        pair_count_auc(scores, labels, weights), abs=1e-12
    )
    soft = torch.rand(200, generator=torch.Generator().manual_seed(seed))
    assert auc_score(scores, soft) == pytest.approx(pair_count_auc(scores, soft), abs=1e-12)


def test_known_values():
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert auc_score(torch.tensor([0.1, 0.2, 0.3, 0.4]), labels) == 1.0
    assert auc_score(torch.tensor([0.4, 0.3, 0.2, 0.1]), labels) == 0.0
    assert auc_score(torch.zeros(4), labels) == 0.5
    assert auc_score(torch.tensor([0.1, 0.4, 0.35, 0.8]), labels) == 0.75
    assert math.isnan(auc_score(torch.tensor([0.1, 0.2]), torch.ones(2)))  # no negatives
    assert math.isnan(auc_score(torch.zeros(0), torch.zeros(0)))
    # zero weight removes an example; logits and probabilities rank alike
    scores = torch.tensor([0.1, 0.9, 0.35, 0.8])
    assert auc_score(scores, labels, torch.tensor([1.0, 0.0, 1.0, 1.0])) == 1.0
    metric = AUC(from_logits=False)
    metric.update(torch.sigmoid(scores), labels)
    assert metric.compute() == auc_score(scores, labels)


def test_accumulates_and_resets():
    scores, labels, weights = _examples(7, 90)
    metric = AUC()
    for part in range(3):
        rows = slice(30 * part, 30 * (part + 1))
        metric.update(scores[rows].unsqueeze(1), labels[rows], weights[rows])  # [B, 1] logits
    assert metric.compute() == pytest.approx(auc_score(scores, labels, weights), abs=1e-12)
    metric.reset()
    assert math.isnan(metric.compute())


def _counts(world_size: int) -> list[int]:
    """Uneven examples per rank, one rank with none when there are several."""
    return [0 if (r == 1 and world_size > 1) else 17 + 9 * r for r in range(world_size)]


def _rank_auc(rank: int, world_size: int):
    scores, labels, weights = _examples(100 + rank, _counts(world_size)[rank])
    metric = AUC()
    for start in range(0, scores.numel(), 8):
        stop = start + 8
        metric.update(scores[start:stop], labels[start:stop], weights[start:stop])
    return metric.compute()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_across_ranks_equals_one_process(run_ranks, world_size):
    parts = [_examples(100 + r, n) for r, n in enumerate(_counts(world_size))]
    scores, labels, weights = (torch.cat(column) for column in zip(*parts))
    expected = pair_count_auc(scores, labels, weights)
    results = run_ranks(_rank_auc, world_size)
    assert results == [pytest.approx(expected, abs=1e-12)] * world_size


def _rank_auc_empty(rank: int, world_size: int):
    return AUC().compute()


def test_no_examples_on_any_rank_is_nan(run_ranks):
    assert all(math.isnan(v) for v in run_ranks(_rank_auc_empty, 2))
