"""``shardkit plan``: a model file of tables in, the stats table out; the plan as JSON and a
per-rank chart as PNG on request. No processes, no memory for the tables."""

from __future__ import annotations

import json
import sys

import pytest

from shardkit.cli import main
from shardkit.cli._plan import load_model
from shardkit.cli._units import size
from shardkit.planner import ShardingType, _machine
from shardkit.types import ShardingPlan

MODEL = {
    "batch_size": 256,
    "tables": [
        {"name": "user", "rows": 10_000_000, "dim": 128, "pooling_factor": 1},
        {
            "name": "item",
            "rows": 5_000_000,
            "dim": 128,
            "pooling_factor": 20,
            "features": ["a", "b"],
        },
        {"name": "small", "rows": 100, "dim": 16},
        {"name": "seq", "rows": 100_000, "dim": 64, "pooled": False, "data_type": "fp16"},
        {"name": "forced", "rows": 5000, "dim": 64, "sharding_types": ["row_wise"]},
    ],
}


@pytest.fixture
def model_json(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(MODEL))
    return path


def test_plan_prints_stats_and_writes_the_plan(model_json, tmp_path, capsys):
    out, stats = tmp_path / "plan.json", tmp_path / "stats.json"
    args = [str(model_json), "--world-size", "1024", "--local-world-size", "8", "--hbm-cap", "80G"]
    assert main(["plan", *args, "--output", str(out), "--stats-json", str(stats)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(
        "sharding plan: 5 tables in 1 module(s) on 1024 ranks (128 host(s) x 8), cuda, batch "
        "size 256"
    )
    assert "memory per rank: 80 GiB hbm (given)" in text and "imbalance (max/mean)" in text
    plan = ShardingPlan.from_json(out.read_text())
    tables = plan.plan[""]
    assert list(tables) == ["user", "item", "small", "seq", "forced"]
    assert tables["forced"].sharding_type == ShardingType.ROW_WISE
    sizes = [s.shard_sizes[0] for s in tables["forced"].sharding_spec.shards]
    assert len(sizes) == 1024 and sum(sizes) == 5000 and set(sizes) == {4, 5}
    data = json.loads(stats.read_text())
    assert data["world_size"] == 1024 and len(data["ranks"]) == 1024 and data["batch_size"] == 256


def test_yaml_models_and_a_list_of_tables(tmp_path, capsys):
    yaml = pytest.importorskip("yaml")
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(MODEL["tables"]))
    assert (
        main(
            [
                "plan",
                str(path),
                "--world-size",
                "4",
                "--compute-device",
                "cpu",
                "--batch-size",
                "64",
            ]
        )
        == 0
    )
    assert (
        "5 tables in 1 module(s) on 4 ranks (1 host(s) x 4), cpu, batch size 64 per rank"
        in capsys.readouterr().out
    )
    tables, constraints, batch = load_model(path)
    assert [t.name for t in tables] == ["user", "item", "small", "seq", "forced"] and batch is None
    assert constraints["item"].pooling_factors == (20.0, 20.0)
    assert type(tables[3]).__name__ == "EmbeddingConfig" and tables[3].data_type.value == "FP16"


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ([{"name": "a", "rows": 10}], r"table 0 \('a'\): missing \['dim'\]"),
        (
            [{"name": "a", "rows": 10, "dim": 4, "colour": "red"}],
            r"table 0 \('a'\): unknown keys \['colour'\]; known: \[",
        ),
        (
            [{"name": "a", "rows": 0, "dim": 4}],
            r"table 0 \('a'\): table 'a': num_embeddings must be >= 1, got 0",
        ),
        ([{"name": "a", "rows": 10, "dim": 4, "data_type": "fp12"}], r"table 0 \('a'\): 'FP12'"),
        (
            [{"name": "a", "rows": 10, "dim": 4, "sharding_types": ["diagonal"]}],
            r"unknown sharding type 'diagonal'",
        ),
        ([], r"expected a list of tables, or a mapping with a 'tables' list"),
    ],
)
def test_bad_model_files_are_explained(tmp_path, capsys, tables, message):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"tables": tables}))
    assert main(["plan", str(path), "--world-size", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardkit plan: ") and str(path) in err
    assert pytest.importorskip("re").search(message, err), err


@pytest.mark.parametrize(
    ("device", "expected"), [("cuda", "32 GiB hbm (given)"), ("cpu", "128 GiB ddr (given)")]
)
def test_plans_for_a_cluster_default_to_torchrecs_memory_not_this_machines(
    model_json, capsys, monkeypatch, device, expected
):
    """``shardkit plan`` plans for any cluster: this machine's memory means nothing there."""

    def unread():
        raise AssertionError("shardkit plan must not read this machine's memory")

    monkeypatch.setattr(_machine, "host_memory", unread)
    monkeypatch.setattr(_machine, "gpu_memory", unread)
    args = ["plan", str(model_json), "--world-size", "64", "--compute-device", device]
    assert main(args) == 0
    assert f"memory per rank: {expected}" in capsys.readouterr().out


def test_a_plan_that_does_not_fit_exits_with_the_planner_error(model_json, capsys):
    assert main(["plan", str(model_json), "--world-size", "2", "--hbm-cap", "1G"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardkit plan: no sharding plan") and "table 'user'" in err


def test_the_chart_is_drawn(model_json, tmp_path, capsys, monkeypatch):
    """The PNG shows each rank's memory against the memory for tables, and its cost split into
    lookups and communication: the bars carry the stats' numbers."""
    plt = pytest.importorskip("matplotlib.pyplot")
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to read it back
    png = tmp_path / "plan.png"
    args = ["plan", str(model_json), "--world-size", "16", "--local-world-size", "8"]
    stats_json = tmp_path / "stats.json"
    assert main([*args, "--png", str(png), "--stats-json", str(stats_json)]) == 0
    assert f"drew {png}" in capsys.readouterr().out
    stats = json.loads(stats_json.read_text())
    (figure,) = figures
    memory, cost = figure.axes
    gib = 1024**3
    heights = [bar.get_height() for bar in memory.patches]
    assert heights == pytest.approx([r["memory"] / gib for r in stats["ranks"]])
    (line,) = memory.get_lines()  # the memory the tables may use
    assert list(line.get_ydata()) == pytest.approx([stats["available"] / gib] * 2)
    bars = cost.patches
    assert len(bars) == 2 * 16
    assert [b.get_height() for b in bars[:16]] == pytest.approx(
        [r["compute"] for r in stats["ranks"]]
    )
    assert [b.get_height() for b in bars[16:]] == pytest.approx(
        [r["comms"] for r in stats["ranks"]]
    )
    assert [b.get_y() for b in bars[16:]] == pytest.approx([r["compute"] for r in stats["ranks"]])
    assert [b.get_x() + b.get_width() / 2 for b in bars[:16]] == pytest.approx(range(16))
    assert "5 tables on 16 ranks" in memory.get_title()
    image = plt.imread(png)
    assert image.shape[:2] == (600, 800)  # 8 x 6 inches at 100 dpi
    assert len({tuple(pixel) for pixel in image.reshape(-1, image.shape[2])[::7].tolist()}) > 20


def test_the_chart_needs_the_plot_extra(model_json, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert main(["plan", str(model_json), "--world-size", "2", "--png", "x.png"]) == 1
    assert (
        "drawing the plan needs matplotlib: pip install 'shardkit[plot]'" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [("80G", 80 << 30), ("512MiB", 512 << 20), ("1.5T", int(1.5 * (1 << 40))), ("1024", 1024)],
)
def test_sizes(text, value):
    assert size(text) == value
