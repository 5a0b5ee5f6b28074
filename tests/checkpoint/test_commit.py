"""Publishing a checkpoint directory (`commit`): a failure at any point leaves a complete
checkpoint where ``latest`` points, also when the same step is saved again (and the process
dies between its two renames)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from shardkit import checkpoint as ckpt
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


class _Died(BaseException):
    """The process dies: no handler runs anything after it."""


def test_a_resave_that_dies_between_its_renames_leaves_latest_readable(tmp_path, monkeypatch):
    _store.commit(_checkpoint(tmp_path / ".tmp-1", "old"), tmp_path / "step-1", keep=2)
    replace, renames = os.replace, []

    def dying(src, dst):  # the old copy goes aside, then the process dies
        if renames:
            raise _Died
        renames.append((Path(src).name, Path(dst).name))
        replace(src, dst)

    monkeypatch.setattr(_store.os, "replace", dying)
    with pytest.raises(_Died):
        _store.commit(_checkpoint(tmp_path / ".tmp-1", "new"), tmp_path / "step-1", keep=2)
    monkeypatch.undo()
    assert renames == [("step-1", ".old-step-1")] and not (tmp_path / "step-1").exists()
    assert (tmp_path / "latest").read_text().strip() == "step-1"
    assert (_store.latest(tmp_path) / "data").read_text() == "old"
    _store.commit(tmp_path / ".tmp-1", tmp_path / "step-1", keep=2)  # the retry
    assert (_store.latest(tmp_path) / "data").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-1"]


def _resave_dies_then_load(rank: int, world_size: int, root: str):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ckpt.save(root, step=1, model=model, extra={"epoch": 1})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    replace, renames = os.replace, []

    def dying(src, dst):  # the old copy of step 1 goes aside, then the process dies
        if renames:
            raise _Died
        renames.append(Path(dst).name)
        replace(src, dst)

    _store.os.replace = dying
    try:
        with pytest.raises(_Died):
            ckpt.save(root, step=1, model=model, extra={"epoch": 2})
    finally:
        _store.os.replace = replace
    assert renames == [".old-step-00000001"]
    fresh = torch.nn.Linear(3, 2)
    extra = ckpt.load(root, model=fresh)
    assert extra["epoch"] == 1
    torch.testing.assert_close(fresh.state_dict(), saved, rtol=0, atol=0)


def test_load_after_a_resave_died_between_its_renames_reads_the_old_copy(run_ranks, tmp_path):
    run_ranks(_resave_dies_then_load, 1, str(tmp_path))


def test_a_lower_step_saved_after_a_resume_is_kept_and_latest(tmp_path):
    """Steps 8 and 10, then a resume from an earlier checkpoint saves step 6 (keep=2): step 6
    and the highest other (10) stay, and ``latest`` names step 6."""
    for step in (8, 10, 6):
        temporary = _checkpoint(tmp_path / f".tmp-step-{step:08d}", str(step))
        _store.commit(temporary, tmp_path / f"step-{step:08d}", keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000006",
                                                         "step-00000010"]  # fmt: skip
    assert (_store.latest(tmp_path) / "data").read_text() == "6"


def test_save_refuses_keep_below_one(tmp_path):
    with pytest.raises(ValueError, match=r"keep must be an int >= 1 \(this checkpoint and"):
        ckpt.save(tmp_path, step=1, model=torch.nn.Linear(1, 1), keep=0)
