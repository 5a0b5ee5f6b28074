"""Exact area under the ROC curve, over every rank's examples.

[Note: exact AUC]
AUC is the probability that a random positive scores above a random negative, ties counting one
half (Mann-Whitney U), which equals the trapezoidal area under the ROC curve. With weights:

    AUC = sum over positives i, negatives j of w_i w_j [s_i > s_j] + 1/2 w_i w_j [s_i = s_j]
          ------------------------------------------------------------------------------
                                  (sum_i w_i) (sum_j w_j)

Computed in O(n log n): sort the scores, group equal scores, and for each group add its
positive weight times (the negative weight below it + half its own negative weight). It is a
statistic of all examples together, so ranks cannot combine partial AUCs: ``compute()`` gathers
every rank's (score, label, weight) rows (uneven counts allowed), 24 bytes per example, and every
rank computes the same exact value. Soft labels ``y`` in [0, 1] count as ``y`` positive and
``1 - y`` negative.
"""

from __future__ import annotations

import math

import torch

from shardkit.metrics._inputs import prepare
from shardkit.metrics._ranks import Group, gather_rows

__all__ = ["AUC", "auc_score"]


def auc_score(
    scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None
) -> float:
    """Exact (weighted) ROC AUC of one set of examples; see [Note: exact AUC].

    Args:
        scores: ``[n]`` any monotone score (logits or probabilities give the same AUC).
        labels: ``[n]`` in {0, 1} (or soft, in [0, 1]).
        weights: ``[n]`` >= 0, default 1.

    Returns:
        The AUC, or ``nan`` when the positive or the negative weight is 0 (undefined).
    """
    scores = scores.detach().to(torch.float64).reshape(-1)
    labels = labels.detach().to(torch.float64).reshape(-1)
    weights = torch.ones_like(scores) if weights is None else weights.detach().to(torch.float64)
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    positive = (weights * labels)[order]
    negative = (weights * (1.0 - labels))[order]
    _, group = torch.unique_consecutive(sorted_scores, return_inverse=True)
    num_groups = int(group.max()) + 1 if group.numel() else 0
    positive_per_group = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, positive)
    negative_per_group = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, negative)
    negative_below = torch.cumsum(negative_per_group, 0) - negative_per_group
    area = (positive_per_group * (negative_below + 0.5 * negative_per_group)).sum().item()
    total = positive.sum().item() * negative.sum().item()
    return area / total if total > 0 else math.nan


class AUC:
    """ROC AUC over every update on every rank, exact (see [Note: exact AUC]).

    Memory: 24 bytes per example kept on this rank, and on every rank during ``compute()`` for
    all ranks' examples (a validation set of 10M examples: 240 MB, freed after).

    Args:
        from_logits: accepted for symmetry with the other metrics; AUC only ranks the scores,
            so logits and probabilities give the same value.
        group: the ranks to combine (default: the world, when a process group is up).
    """

    def __init__(self, *, from_logits: bool = True, group: Group = None) -> None:
        self.from_logits = from_logits
        self.group = group
        self._rows: list[torch.Tensor] = []  # [B, 3]: score, label, weight

    def update(
        self,
        predictions: torch.Tensor,
        labels: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> None:
        """Keep a batch: ``predictions`` ``[B]`` or ``[B, 1]``, ``labels`` ``[B]``, ``weights``
        ``[B]`` (default 1; 0 ignores an example, e.g. padding)."""
        inputs = prepare("AUC", predictions, labels, weights, from_logits=self.from_logits)
        self._rows.append(torch.stack([inputs.scores, inputs.labels, inputs.weights], dim=1))

    def compute(self) -> float:
        """The AUC of every rank's examples together (a collective: every rank must call it);
        ``nan`` if there is no positive or no negative weight."""
        local = torch.cat(self._rows) if self._rows else torch.zeros(0, 3, dtype=torch.float64)
        rows = gather_rows(local, self.group)
        return auc_score(rows[:, 0], rows[:, 1], rows[:, 2])

    def reset(self) -> None:
        """Forget every update (on this rank)."""
        self._rows = []
