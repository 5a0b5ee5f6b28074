"""What rank 0 shows while it trains: a progress bar with loss and samples/s (tqdm when the
``progress`` extra is installed, else a log line every few seconds)."""

from __future__ import annotations

import logging
import time

__all__ = ["Progress"]

logger = logging.getLogger("shardkit.train")


class Progress:
    def __init__(self, total: int | None, epoch: int, *, enabled: bool) -> None:
        self._bar = None
        self._last_log = time.monotonic()
        self._total, self._epoch, self._enabled = total, epoch, enabled
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                logger.info("install shardkit[progress] for a progress bar")
            else:
                self._bar = tqdm(
                    total=total, desc=f"epoch {epoch}", unit="step", leave=True, dynamic_ncols=True
                )

    def update(self, step: int, loss: float, samples_per_s: float) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix(
                loss=f"{loss:.4f}", samples_s=f"{samples_per_s:,.0f}", refresh=False
            )
            self._bar.update(1)
        elif time.monotonic() - self._last_log > 5:
            self._last_log = time.monotonic()
            logger.info(
                "epoch %d step %d/%s loss %.4f %s samples/s",
                self._epoch, step, self._total, loss, f"{samples_per_s:,.0f}",
            )  # fmt: skip

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
