"""Which checkpoint a run resumes from, found and verified before ranks start.

``--resume`` takes the latest checkpoint of ``--checkpoint-dir`` (none yet: start afresh);
``--resume-from`` a step number there or a checkpoint directory. Either is verified (every file
against its manifest) first: a missing or corrupted one is refused with the newest intact
checkpoint named, so the user can go back to it (``--resume-from <its step>``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from shardkit.checkpoint import CheckpointError, latest, verify
from shardkit.train._config import TrainConfig

__all__ = ["resume_point"]

logger = logging.getLogger(__name__)


def resume_point(config: TrainConfig) -> Path | None:
    """The verified checkpoint to resume from, or None (no resuming, or nothing to resume)."""
    found: Path | None
    if config.resume_from is not None:
        found = _named(config)
    elif config.resume:
        try:
            found = latest(config.checkpoint_dir)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}; {_newest_intact(config.checkpoint_dir, None)}") from None
        if found is None:
            return None
    else:
        return None
    try:
        verify(found)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}; {_newest_intact(found.parent, found)}") from None
    return found


def _named(config: TrainConfig) -> Path:
    text = str(config.resume_from)
    path = config.checkpoint_dir / f"step-{int(text):08d}" if text.isdigit() else Path(text)
    if (path / "latest").exists():  # a root of checkpoints: its latest
        found = latest(path)
        assert found is not None
        return found
    if not path.is_dir():
        steps = sorted(p.name for p in config.checkpoint_dir.glob("step-*") if p.is_dir())
        raise CheckpointError(
            f"--resume-from {text}: no checkpoint at {path}; {config.checkpoint_dir} has "
            f"{steps or 'none'} (give a step number, a step-* directory or a checkpoint root)"
        )
    return path


def _newest_intact(root: Path, bad: Path | None) -> str:
    """'the newest intact checkpoint is ...' (or that there is none), for an error message."""
    for candidate in sorted((p for p in root.glob("step-*") if p.is_dir()), reverse=True):
        if bad is not None and candidate.resolve() == bad.resolve():
            continue
        try:
            verify(candidate)
        except CheckpointError:
            continue
        step = int(candidate.name.rsplit("-", 1)[-1])
        return (f"the newest intact checkpoint is {candidate}: resume from it with "
                f"--resume-from {step}")  # fmt: skip
    return f"{root} holds no intact checkpoint: train afresh (without --resume)"
