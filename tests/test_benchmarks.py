"""The benchmark scripts still run (at toy sizes, without TorchRec) and write their reports, so
the commands in benchmarks/results/ keep working as the code changes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.scripts import run_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> str:
    return run_script(BENCHMARKS / script, *args)


def test_bench_ebc_runs_at_toy_size(tmp_path):
    out = tmp_path / "ebc.md"
    _run(
        "bench_ebc.py", "--tables", "2", "--rows", "1000", "--batch", "32", "--iters", "2",
        "--warmup", "1", "--rounds", "2", "--out", str(out),
    )  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["threads"] == 1, "one thread unless --threads says otherwise"
    assert report["copy_gb_per_s"] > 0
    points = report["points"]
    assert [
        (p["point"]["tables"], p["point"]["rows"], p["point"]["optimizer"]) for p in points
    ] == [
        (2, 1000, "rowwise_adagrad"),
        (2, 1000, "sgd"),
    ]
    for point in points:
        assert point["num_ids"] > point["unique_rows"] > 0 and point["floor_ms"] > 0
        results = point["results"]
        assert list(results) == [
            "shardkit compiled",
            "shardkit eager",
            "torchrec (FBGEMM)",
            "naive dense",
        ]
        if importlib.util.find_spec("torchrec") is None:
            assert results["torchrec (FBGEMM)"] == {
                "skipped": "skipped: torchrec is not importable (use the peers venv)"
            }
        for name in ("shardkit compiled", "shardkit eager", "naive dense"):
            result = results[name]
            assert len(result["times_ms"]) == 4 and len(result["round_medians"]) == 2, result
            assert 0 < result["p25"] <= result["ms"] <= result["p75"], result
            assert result["floor_fraction"] > 0
    report_text = out.read_text()
    assert "| 2 x 1,000 x 64, batch 32, uniform, rowwise_adagrad | " in report_text
    assert "1 thread(s)" in report_text


def test_bench_ebc_sweep_covers_the_issue_grid(tmp_path):
    """--sweep at a toy scale: every axis of issue 11's sweep is there."""
    out = tmp_path / "sweep.md"
    _run(
        "bench_ebc.py", "--sweep", "--scale", "0.0005", "--iters", "1", "--rounds", "1",
        "--warmup", "0", "--contenders", "shardkit compiled", "shardkit eager", "--out", str(out),
    )  # fmt: skip
    points = [p["point"] for p in json.loads(out.with_suffix(".json").read_text())["points"]]
    assert len(points) == 32
    assert {p["optimizer"] for p in points} == {"rowwise_adagrad", "sgd"}
    assert {p["ids"] for p in points} == {"uniform", "power-law"}
    assert {p["dim"] for p in points} == {16, 64, 256}
    assert {(p["tables"], p["rows"]) for p in points} == {(4, 10), (4, 50), (2, 500), (1, 5000)}
    assert {p["batch"] for p in points} == {1, 8}  # 256 and 2048 both scale to 1


def test_bench_dmp_runs_at_toy_size(tmp_path):
    out = tmp_path / "dmp.md"
    _run(
        "bench_dmp.py", "--tables", "2", "--rows", "1000", "--batch", "32", "--iters", "2",
        "--warmup", "1", "--rounds", "1", "--types", "row_wise", "--out", str(out),
    )  # fmt: skip
    report = out.read_text()
    assert "| row_wise | shardkit (pipelined) |" in report
    assert "| row_wise | shardkit (plain loop) |" in report


def test_bench_fsdp_runs_the_small_model(tmp_path):
    out = tmp_path / "fsdp.json"
    _run(
        "bench_fsdp.py", "--model", "cnn", "--contenders", "shardkit-full,torch-ddp",
        "--warmup", "1", "--steps", "1", "--json", str(out),
    )  # fmt: skip
    assert out.read_text().strip()


def test_bench_recorder_runs_at_toy_size(tmp_path):
    out = tmp_path / "recorder.md"
    _run(
        "bench_recorder.py", "--tables", "2", "--rows", "1000", "--batch", "32", "--iters", "2",
        "--warmup", "1", "--rounds", "1", "--calls", "5", "--repeats", "1", "--out", str(out),
    )  # fmt: skip
    assert "| DMP training step | µs/step |" in out.read_text()
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [row["what"].split(" (")[0] for row in rows] == [
        "small all-reduce",
        "the same on 1 rank",
        "small all-to-all",
        "DMP training step",
        "collectives per DMP step",
    ]
    for row in rows[:-1]:
        assert row["recorded"] > 0 and row["not_recorded"] > 0, row
    assert rows[-1]["count"] == [4], rows[-1]  # row-wise: ids, lengths, pooled rows, gradients


def test_bench_mc_runs_at_toy_size(tmp_path):
    out = tmp_path / "mc.md"
    _run(
        "bench_mc.py", "--vocab", "2000", "--rows", "200", "--steps", "6", "--batch", "64",
        "--eval", "256", "--eviction-interval", "2", "--seeds", "0", "--drift", "0", "3",
        "--out", str(out),
    )  # fmt: skip
    report = out.read_text()
    assert "| 0 | mc-distance-lfu |" in report and "| 3 | exact | 0.0% |" in report
    summary = json.loads(out.with_suffix(".json").read_text())["summary"]
    modulo = next(s for s in summary if s["contender"] == "modulo" and s["drift"] == 0)
    lfu = next(s for s in summary if s["contender"] == "mc-lfu" and s["drift"] == 0)
    assert lfu["collided_lookups"]["mean"] < modulo["collided_lookups"]["mean"]


def test_bench_quant_runs_at_toy_size(tmp_path):
    out = tmp_path / "quant.md"
    _run(
        "bench_quant.py", "--models", "adult", "--max-steps", "2", "--repeat", "2", "--rounds",
        "1", "--batch-sizes", "1", "8", "--out", str(out),
    )  # fmt: skip
    report = out.read_text()
    for storage in ("float", "fp16", "int8", "int4"):
        assert f"| adult | {storage} |" in report
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["table_bytes"] for r in rows] == sorted(
        (r["table_bytes"] for r in rows), reverse=True
    )


def test_bench_mc_sharded_runs_at_toy_size(tmp_path):
    out = tmp_path / "mc_sharded.md"
    _run(
        "bench_mc_sharded.py", "--rows", "200", "--vocab", "2000", "--batch", "16", "--steps", "2",
        "--rounds", "1", "--eviction-interval", "2", "--out", str(out),
    )  # fmt: skip
    report = out.read_text()
    assert "| id % rows |" in report and "| managed collision |" in report
