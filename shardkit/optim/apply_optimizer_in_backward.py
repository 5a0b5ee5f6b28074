"""``torchrec.optim.apply_optimizer_in_backward``: see [Note: in-backward markers]."""

from shardkit.optim._in_backward import apply_optimizer_in_backward

__all__ = ["apply_optimizer_in_backward"]
