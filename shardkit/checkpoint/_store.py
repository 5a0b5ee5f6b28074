"""Checkpoint directories: written atomically, verified before they are read.

[Note: atomic checkpoints]
A checkpoint is a directory ``<root>/step-<N>`` holding torch.distributed.checkpoint's files
(every rank writes its own shards, in parallel) and ``shardkit.json``, a manifest of every file
with its size and SHA-256. It is written as ``<root>/.tmp-step-<N>``; once all ranks are done,
rank 0 writes the manifest, renames the directory (atomic on one file system) and replaces
``<root>/latest`` (a one-line file) with ``os.replace``. A crash at any point leaves ``latest``
naming the previous, complete checkpoint; leftovers of a failed save start with ``.tmp-``.
A save of a step that already exists moves the old copy aside (``<root>/.old-step-<N>``) before
renaming the new one in; a crash between those two renames leaves ``latest`` naming a missing
``step-<N>``, so `latest` falls back to the copy aside (complete: it was published whole), and
the next commit drops whatever is left aside.
Reading checks every file against the manifest first: a truncated or corrupted file is an error
naming the file, never a partial load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "commit",
    "latest",
    "prepare",
    "verify",
    "write_manifest",
]

MANIFEST = "shardkit.json"

logger = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupted, or does not fit the model."""


def prepare(root: str | os.PathLike, step: int) -> tuple[Path, Path]:
    """(temporary, final) directories of step ``step``'s checkpoint; the temporary one fresh."""
    root = Path(root)
    final = root / f"step-{step:08d}"
    temporary = root / f".tmp-step-{step:08d}"
    if temporary.exists():
        shutil.rmtree(temporary)
    temporary.mkdir(parents=True)
    return temporary, final


def file_digests(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of ``names`` in ``directory``."""
    out = {}
    for name in names:
        path = directory / name
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        out[name] = {"size": path.stat().st_size, "sha256": digest.hexdigest()}
    return out


def write_manifest(directory: Path, files: dict[str, dict[str, Any]], info: dict[str, Any]) -> None:
    """Write ``shardkit.json`` (the files and what the checkpoint holds), durably."""
    path = directory / MANIFEST
    with open(path, "w") as f:
        json.dump({"format": 1, "files": files, **info}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def commit(temporary: Path, final: Path, *, keep: int) -> Path:
    """Publish a complete checkpoint: rename it into place, point ``latest`` at it, and drop
    all but it and the ``keep - 1`` highest other steps. See [Note: atomic checkpoints]."""
    aside = None
    if final.exists():  # a save of the same step again: keep the old one until the new is in
        aside = final.with_name(f".old-{final.name}")
        if aside.exists():
            shutil.rmtree(aside)
        os.replace(final, aside)
    try:
        os.replace(temporary, final)
    except BaseException:
        if aside is not None:
            os.replace(aside, final)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    root = final.parent
    pointer = root / ".latest.tmp"
    with open(pointer, "w") as f:
        f.write(final.name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer, root / "latest")
    for stale in root.glob(".old-step-*"):  # a re-save that died between its renames
        shutil.rmtree(stale, ignore_errors=True)
    # This one stays whatever its number (a resume from an earlier step saves a lower one)
    steps = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != final.name)
    for old in steps[: max(0, len(steps) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(root: str | os.PathLike) -> Path | None:
    """The checkpoint ``<root>/latest`` names, or None when there is none yet."""
    pointer = Path(root) / "latest"
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    path = Path(root) / name
    aside = Path(root) / f".old-{name}"
    if not path.is_dir() and aside.is_dir():  # See [Note: atomic checkpoints]
        logger.warning(
            "%s names %r, which a re-save of that step moved aside and died before replacing; "
            "reading the copy aside, %s",
            pointer,
            name,
            aside,
        )
        return aside
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {name!r}, which is not a directory in {root}")
    return path


def verify(directory: str | os.PathLike, names: list[str] | None = None) -> dict[str, Any]:
    """Check files of a checkpoint (default: all) against its manifest; returns the manifest."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.exists():
        raise CheckpointError(
            f"{directory} has no {MANIFEST}: it is not a shardkit checkpoint, or its save did "
            "not finish"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{manifest_path} is corrupted: {exc}") from None
    expected = manifest["files"]
    for name in names if names is not None else sorted(expected):
        path = directory / name
        if not path.exists():
            raise CheckpointError(f"checkpoint {directory}: file {name} is missing")
        actual = file_digests(directory, [name])[name]
        if actual["size"] != expected[name]["size"]:
            raise CheckpointError(
                f"checkpoint {directory}: file {name} has {actual['size']} bytes, the manifest "
                f"says {expected[name]['size']}: it is truncated or was replaced"
            )
        if actual["sha256"] != expected[name]["sha256"]:
            raise CheckpointError(
                f"checkpoint {directory}: file {name} is corrupted (SHA-256 differs from the "
                "manifest)"
            )
    return manifest
