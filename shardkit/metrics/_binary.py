"""`BinaryMetrics`: everything a click-through model's validation reports, in one pass."""

from __future__ import annotations

import torch

from shardkit.metrics._auc import AUC
from shardkit.metrics._inputs import prepare
from shardkit.metrics._ranks import Group, sum_over_ranks
from shardkit.metrics._sums import binary_entropy, safe_ratio

__all__ = ["BinaryMetrics"]


class BinaryMetrics:
    """AUC, log loss, normalised entropy and accuracy of a binary classifier, across ranks.

    One ``update`` per batch; ``compute()`` costs two collectives (one all-reduce of 4 sums, one
    all-gather for the exact AUC) and returns the values of one process that saw every rank's
    examples::

        metrics = BinaryMetrics()
        for batch in validation:
            metrics.update(model(batch.dense_features, batch.sparse_features), batch.labels,
                           batch.weights)
        metrics.compute()  # {"auc": 0.91, "log_loss": 0.31, "normalized_entropy": 0.57, ...}

    Args:
        from_logits: ``update`` gets logits (default) or probabilities.
        threshold: the probability above which a prediction counts as 1, for accuracy.
        group: the ranks to combine (default: the world, when a process group is up).
    """

    def __init__(
        self, *, from_logits: bool = True, threshold: float = 0.5, group: Group = None
    ) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"BinaryMetrics: threshold must be in (0, 1), got {threshold}")
        self.from_logits = from_logits
        self.threshold = threshold
        self.group = group
        self._auc = AUC(from_logits=from_logits, group=group)
        self._sums = torch.zeros(4, dtype=torch.float64)  # w * ce, w, w * y, w * correct

    def update(
        self,
        predictions: torch.Tensor,
        labels: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> None:
        """Add a batch: ``predictions`` ``[B]`` or ``[B, 1]``, ``labels`` ``[B]`` in {0, 1},
        ``weights`` ``[B]`` (default 1; 0 ignores an example, e.g. padding)."""
        inputs = prepare("BinaryMetrics", predictions, labels, weights,
                         from_logits=self.from_logits)  # fmt: skip
        with torch.no_grad():
            w, y = inputs.weights, inputs.labels
            correct = ((inputs.probabilities() > self.threshold) == (y > 0.5)).to(torch.float64)
            stats = torch.stack([(w * inputs.cross_entropy()).sum(), w.sum(), (w * y).sum(),
                                 (w * correct).sum()])  # fmt: skip
        self._sums = self._sums.to(stats.device) + stats
        self._auc.update(inputs.scores, y, w)

    def compute(self) -> dict[str, float]:
        """``auc``, ``log_loss``, ``normalized_entropy``, ``accuracy``, ``num_examples`` (the
        weight sum) and ``base_rate`` over all ranks; undefined values are ``nan``. A
        collective: every rank must call it."""
        ce, weight, positive, correct = sum_over_ranks(self._sums, self.group).tolist()
        log_loss = safe_ratio(ce, weight)
        base_rate = safe_ratio(positive, weight)
        entropy = binary_entropy(base_rate) if weight > 0 else 0.0
        return {
            "auc": self._auc.compute(),
            "log_loss": log_loss,
            "normalized_entropy": safe_ratio(log_loss, entropy),
            "accuracy": safe_ratio(correct, weight),
            "num_examples": weight,
            "base_rate": base_rate,
        }

    def reset(self) -> None:
        """Forget every update (on this rank)."""
        self._auc.reset()
        self._sums = torch.zeros(4, dtype=torch.float64)
