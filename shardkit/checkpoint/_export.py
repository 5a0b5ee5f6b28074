"""One file <-> a checkpoint directory, with no processes.

`export_checkpoint` writes the unsharded model (every table whole, dense parameters) as a plain
``torch.save`` state dict that a single-process model loads; `import_checkpoint` turns such a
file back into a checkpoint directory that `load` (and ``--resume``) read, in any sharding.
Both import torch.distributed.checkpoint when called (as `shardkit.checkpoint.save` does).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from shardkit.checkpoint._store import (
    CheckpointError,
    commit,
    file_digests,
    latest,
    prepare,
    verify,
    write_manifest,
)

__all__ = ["export_checkpoint", "import_checkpoint"]


def export_checkpoint(checkpoint: str | os.PathLike, output: str | os.PathLike) -> dict:
    """Write the model of ``checkpoint`` (a ``step-*`` directory or a root with ``latest``)
    as one unsharded state dict file; returns that state dict."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    directory = Path(checkpoint)
    if (directory / "latest").exists():
        directory = latest(directory)  # type: ignore[assignment]
    verify(directory)
    with tempfile.TemporaryDirectory() as scratch:
        everything = Path(scratch) / "all.pt"
        dcp_to_torch_save(directory, everything)
        state = torch.load(everything, weights_only=False)
    model = state.get("model", state)
    model = {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
    torch.save(model, output)
    return model


def import_checkpoint(
    state_file: str | os.PathLike, root: str | os.PathLike, *, step: int = 0
) -> Path:
    """Turn an unsharded state dict file (as `export_checkpoint` writes, or any plain model's
    ``state_dict()``) into checkpoint ``<root>/step-<step>`` that `load` reads."""
    from torch.distributed.checkpoint.format_utils import torch_save_to_dcp

    state = _read_state_dict(Path(state_file))
    if "model" not in state:
        state = {"model": state}
    temporary, final = prepare(root, step)  # written aside, published whole by commit
    with tempfile.TemporaryDirectory() as scratch:
        wrapped = Path(scratch) / "model.pt"
        torch.save(state, wrapped)
        torch_save_to_dcp(wrapped, temporary)
    names = sorted(n for n in os.listdir(temporary) if n != "shardkit.json")
    write_manifest(temporary, file_digests(temporary, names), {"step": step, "imported": True})
    existing = len(list(Path(root).glob("step-*")))
    return commit(temporary, final, keep=existing + 1)  # keeps every checkpoint already there


def _read_state_dict(path: Path) -> dict:
    """A ``torch.save``'d state dict (names -> tensors, or ``{"model": ...}``), or a
    `CheckpointError` that says what the file is instead."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file (give a .pt file written by torch.save)")
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # unpickling fails in many ways (not a zip, not a pickle, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path} is not a state dict written by torch.save ({first[:200]}); give the file "
            "of torch.save(model.state_dict(), path) or of shardkit export"
        ) from None
    model = state.get("model", state) if isinstance(state, dict) else None
    if (
        not isinstance(model, dict)
        or not model
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items())
    ):
        raise CheckpointError(
            f"{path} holds a {type(state).__name__}, not a state dict (parameter names -> "
            "tensors); give the file of torch.save(model.state_dict(), path)"
        )
    return state
