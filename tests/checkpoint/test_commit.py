"""Publishing a checkpoint directory (`commit`): a failure at any point leaves a complete
checkpoint where ``latest`` points, also when the same step is saved again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardkit.checkpoint import _store


def _checkpoint(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "data").write_text(text)
    return path


def test_saving_a_step_again_replaces_it_and_leaves_nothing_aside(tmp_path):
    _store.commit(_checkpoint(tmp_path / ".tmp-1", "old"), tmp_path / "step-1", keep=2)
    _store.commit(_checkpoint(tmp_path / ".tmp-1", "new"), tmp_path / "step-1", keep=2)
    assert (tmp_path / "step-1" / "data").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-1"]


def test_a_failed_rename_keeps_the_old_checkpoint_of_that_step(tmp_path, monkeypatch):
    _store.commit(_checkpoint(tmp_path / ".tmp-1", "old"), tmp_path / "step-1", keep=2)
    replace = os.replace

    def failing(src, dst):
        if Path(src).name == ".tmp-1":
            raise OSError("disk full")
        replace(src, dst)

    monkeypatch.setattr(_store.os, "replace", failing)
    with pytest.raises(OSError, match="disk full"):
        _store.commit(_checkpoint(tmp_path / ".tmp-1", "new"), tmp_path / "step-1", keep=2)
    assert (tmp_path / "step-1" / "data").read_text() == "old"
    assert _store.latest(tmp_path) == tmp_path / "step-1"
    assert (tmp_path / ".tmp-1" / "data").read_text() == "new", "the new files stay for a retry"
