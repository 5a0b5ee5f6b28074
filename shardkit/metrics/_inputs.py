"""The arguments of ``update``: shapes checked (free), values turned into float64 per-example
probabilities' building blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["PROB_EPS", "Inputs", "prepare"]

# Probabilities are clipped to [PROB_EPS, 1 - PROB_EPS] before log loss (only given
# probabilities; logits go through the exact log-sigmoid).
PROB_EPS = 1e-12


class Inputs:
    """One update's examples, detached, float64, flat ``[B]``."""

    def __init__(self, scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                 from_logits: bool) -> None:  # fmt: skip
        self.scores = scores  # what was given: logits or probabilities
        self.labels = labels
        self.weights = weights
        self.from_logits = from_logits

    def probabilities(self) -> torch.Tensor:
        return torch.sigmoid(self.scores) if self.from_logits else self.scores

    def cross_entropy(self) -> torch.Tensor:
        """``[B]`` per-example binary cross-entropy, unweighted."""
        if self.from_logits:
            return F.binary_cross_entropy_with_logits(self.scores, self.labels, reduction="none")
        clipped = self.scores.clamp(PROB_EPS, 1.0 - PROB_EPS)
        return F.binary_cross_entropy(clipped, self.labels, reduction="none")


def prepare(
    owner: str,
    scores: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor | None,
    *,
    from_logits: bool,
) -> Inputs:
    """Check shapes (``scores`` ``[B]`` or ``[B, 1]``, ``labels`` and ``weights`` ``[B]``) and
    convert. Values are not checked: that would sync with the device on every update."""
    for name, tensor in (("predictions", scores), ("labels", labels), ("weights", weights)):
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"{owner}.update: {name} must be a torch.Tensor, got {type(tensor).__name__}"
            )
    if scores.dim() == 2 and scores.size(1) == 1:
        scores = scores.squeeze(1)  # a model's [B, 1] logits
    if scores.dim() != 1:
        raise ValueError(
            f"{owner}.update: predictions must be [B] or [B, 1], got shape {tuple(scores.shape)}"
        )
    batch_size = scores.size(0)
    for name, tensor in (("labels", labels), ("weights", weights)):
        if tensor is not None and tuple(tensor.shape) != (batch_size,):
            raise ValueError(
                f"{owner}.update: {name} must have shape ({batch_size},) like the predictions, "
                f"got {tuple(tensor.shape)}"
            )
    with torch.no_grad():
        scores = scores.detach().to(torch.float64)
        labels = labels.detach().to(device=scores.device, dtype=torch.float64)
        if weights is None:
            weights = torch.ones_like(scores)
        else:
            weights = weights.detach().to(device=scores.device, dtype=torch.float64)
    return Inputs(scores, labels, weights, from_logits)
