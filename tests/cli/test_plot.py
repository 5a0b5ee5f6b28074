"""``shardkit plot RUN_DIR``: a run's curves as one PNG, from its metrics.jsonl."""

from __future__ import annotations

import struct
import sys

import pytest

from shardkit.cli import main
from shardkit.metrics import JsonlWriter


def _metrics(run):
    with JsonlWriter(run / "metrics.jsonl", rank=0) as log:
        for step in range(10, 101, 10):
            log.write({"kind": "train", "epoch": step // 50, "step": step, "loss": 1 / step,
                       "samples_per_s": 1000.0 + step})  # fmt: skip
        for step in (50, 100):
            log.write({"kind": "validation", "epoch": step // 50 - 1, "step": step, "auc": 0.7,
                       "log_loss": 0.5, "data_samples_per_s": 5000.0,
                       "epoch_samples_per_s": 900.0})  # fmt: skip


def test_plot_draws_a_png_of_the_run(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    _metrics(run)
    assert main(["plot", str(run)]) == 0
    png = run / "metrics.png"
    assert f"drew {png}" in capsys.readouterr().out
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1100, 700)  # 11 x 7 inches at 100 dpi
    assert main(["plot", str(run / "metrics.jsonl"), "--output", str(tmp_path / "x.png")]) == 0
    assert (tmp_path / "x.png").stat().st_size > 20_000


def test_plot_refusals(tmp_path, capsys, monkeypatch):
    assert main(["plot", str(tmp_path)]) == 2
    assert "metrics.jsonl does not exist: give a run's --checkpoint-dir" in capsys.readouterr().err
    _metrics(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plot", str(tmp_path)]) == 2
    assert "drawing needs matplotlib: pip install 'shardkit[plot]'" in capsys.readouterr().err
