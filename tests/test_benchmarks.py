"""The benchmark scripts still run (at toy sizes, without TorchRec) and write reports whose
numbers hang together: the arguments given, the machine, one row per contender with positive,
finite times and throughputs that follow from them, skipped contenders said to be skipped. So
the commands in benchmarks/results/ keep working, and keep measuring what they claim."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from tests.scripts import run_script

pytestmark = pytest.mark.slow  # make test-slow (see tests/conftest.py OPT_IN)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> str:
    return run_script(BENCHMARKS / script, *args)


def _positive(*values: float) -> bool:
    return all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in values)


def _machine(machine: dict) -> None:
    assert machine["torch"] == torch.__version__ and machine["cpu_count"] >= 1
    assert machine["torchrec"] is None  # these runs are shardkit's side only
    # the CPU's name, ISA flags and huge page mode: a ratio holds for one machine (issue 25)
    assert set(machine) >= {"cpu_model", "cpu_family", "cpu_model_id", "isa", "thp", "threads"}
    assert isinstance(machine["isa"], list) and machine["thp"]


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


def test_bench_ebc_quick_names_the_machine(tmp_path):
    """--quick (at a toy scale): four points with both optimizers, compiled shardkit against
    FBGEMM only, and the machine's line at the top of the report."""
    from shardkit.bench import machine_info, machine_line

    out = tmp_path / "quick.md"
    _run("bench_ebc.py", "--quick", "--scale", "0.001", "--out", str(out))
    report = json.loads(out.with_suffix(".json").read_text())
    _machine(report["machine"])
    points = [p["point"] for p in report["points"]]
    assert [(p["dim"], p["ids"], p["optimizer"]) for p in points] == [
        (dim, ids, optimizer)
        for dim, ids in ((64, "uniform"), (64, "power-law"), (16, "uniform"), (256, "uniform"))
        for optimizer in ("rowwise_adagrad", "sgd")
    ]
    assert [list(p["results"]) for p in report["points"]] == [
        ["shardkit compiled", "torchrec (FBGEMM)"]
    ] * 8
    assert report["args"]["rounds"] == 3
    line = machine_line(machine_info()).split("; ")[0]  # the CPU and its flags
    assert f"Machine: {line}" in out.read_text()


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
        "--warmup", "1", "--rounds", "1", "--types", "data_parallel",
        "--optimizers", "sgd", "--out", str(out),
    )  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["args"]["threads"] == 1, "one thread per rank unless --threads says otherwise"
    _machine(report["machine"])
    contenders = [(r["type"], r["library"], r["loop"]) for r in report["rows"]]
    # one optimizer only: every contender's turn starts fresh ranks, the slow part of this test
    assert contenders == [
        ("data_parallel (sgd)", "shardkit", loop) for loop in ("plain", "pipeline")
    ] + [
        ("-", "torchrec", "-"),
    ], "each loop kind runs on its own; torchrec is skipped where not installed"
    for summary in (report, report["cpu"]):  # wall time, and CPU time of all ranks
        for row in summary["rows"][:2]:
            assert len(row["ms_rounds"]) == 1 and row["ms_per_step"] > 0
    assert report["rows"][2]["skipped"] == "torchrec not importable"
    assert report["ratios"] == [], "no ratio without the other library"
    assert "| data_parallel (sgd) | shardkit | plain |" in out.read_text()


def test_bench_dmp_as_written_runs_the_torchrec_program_on_shardkit(tmp_path):
    """The TorchRec program under ``shardkit run`` (TorchRec absent: shardkit's side only)."""
    out = tmp_path / "as_written.md"
    _run(
        "bench_dmp_as_written.py", "--types", "row_wise", "--loops", "pipeline", "--rounds", "1",
        "--rows", "500", "--batch", "16", "--steps", "2", "--warmup", "1", "--out", str(out),
    )  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    _machine(report["machine"])
    (result,) = report["results"]
    assert result["case"] == ["row_wise", "pipeline", "rowwise_adagrad"] and not result["torchrec"]
    (run,) = result["shardkit"]
    assert _positive(run["median_ms"], *run["cpu_ms_per_rank"]), run
    assert run["types"] == ["row_wise"] and run["kernels"] == ["fused"], run
    assert len(run["losses"]) == 3 and all(math.isfinite(x) for x in run["losses"])
    assert "| row_wise | pipeline | rowwise_adagrad | - |" in out.read_text()


def test_bench_dmp_compares_each_loop_with_the_same_loop():
    spec = importlib.util.spec_from_file_location("_dmp_report", BENCHMARKS / "_dmp_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    times = {
        ("table_wise", "shardkit", "plain"): [10.0, 12.0],
        ("table_wise", "torchrec", "plain"): [20.0, 20.0],
        ("table_wise", "shardkit", "pipeline"): [30.0, 30.0],
        ("table_wise", "torchrec", "pipeline"): [15.0, 10.0],
    }
    summary = report.summarize(times, {}, ["table_wise"])
    assert summary["ratios"] == [
        {"type": "table_wise", "loop": "plain", "ratio": 11 / 20, "ratio_rounds": [0.5, 0.6]},
        {"type": "table_wise", "loop": "pipeline", "ratio": 30 / 12.5, "ratio_rounds": [2.0, 3.0]},
    ], "never the better shardkit loop against TorchRec's"
    assert summary["compiled"] == [], "no compiled loop ran"


def test_bench_dmp_reports_compiled_against_the_same_librarys_eager_step():
    spec = importlib.util.spec_from_file_location("_dmp_report", BENCHMARKS / "_dmp_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    times = {
        ("row_wise", "shardkit", "plain"): [10.0, 20.0],
        ("row_wise", "shardkit", "compiled"): [9.0, 30.0],
        ("row_wise", "torchrec", "plain"): [40.0, 40.0],
    }
    summary = report.summarize(times, {("row_wise", "torchrec", "compiled"): "no"}, ["row_wise"])
    assert summary["compiled"] == [
        {"type": "row_wise", "library": "shardkit", "ratio": 19.5 / 15, "ratio_rounds": [0.9, 1.5]}
    ], "compiled against its own library's plain loop, round by round"
    args = {"world_size": 2, "threads": 1, "tables": 2, "rows": 10, "dim": 4, "batch": 8,
            "ids_per_bag": 2, "iters": 2, "warmup": 1, "rounds": 2}  # fmt: skip
    text = report.render({"args": args, "machine": {}, **summary})
    assert "| sharding type | plain loop | compiled |" in text
    assert "| row_wise | shardkit | 1.30 | 0.90, 1.50 |" in text


def test_bench_fsdp_runs_the_small_model(tmp_path):
    out = tmp_path / "fsdp.json"
    _run(
        "bench_fsdp.py", "--model", "cnn", "--contenders", "shardkit-full,torch-ddp",
        "--warmup", "1", "--steps", "1", "--json", str(out),
    )  # fmt: skip
    data = json.loads(out.read_text())
    assert (data["repeat"], data["warmup"], data["steps"]) == (1, 1, 1)
    assert data["environment"]["torch"] == torch.__version__
    runs = {(r["model"], r["contender"]): r for r in data["runs"]}
    assert set(runs) == {("cnn", "shardkit-full"), ("cnn", "torch-ddp")}
    for run in runs.values():
        assert run["repeat"] == 0 and len(run["ranks"]) == 2
        for rank in run["ranks"]:
            assert _positive(rank["step_s"], rank["cpu_s"], rank["state_mb"], rank["peak_rss_mb"])
            assert len(rank["step_s_all"]) == data["steps"] and rank["step_s"] in rank["step_s_all"]
            assert rank["peak_rss_mb"] >= rank["process_rss_mb"] > 0
    # full sharding on 2 ranks keeps half of what each DDP rank holds (parameters, gradients,
    # optimizer state), give or take the padding of the flat shards
    sharded = runs["cnn", "shardkit-full"]["ranks"][0]["state_mb"]
    replicated = runs["cnn", "torch-ddp"]["ranks"][0]["state_mb"]
    assert sharded == pytest.approx(replicated / 2, rel=0.01)


def test_bench_planner_scores_its_plans(tmp_path):
    out, markdown = tmp_path / "planner.json", tmp_path / "planner.md"
    _run(
        "bench_planner.py", "--skip-speed", "--no-torchrec", "--out", str(out),
        "--markdown", str(markdown),
    )  # fmt: skip
    data = json.loads(out.read_text())
    assert "speed" not in data and data["machine"]["torch"] == torch.__version__
    cases = [(q["case"], q["tables"], q["ranks"]) for q in data["quality"]]
    assert cases == [
        ("criteo_tb_26", 26, 8), ("criteo_tb_26", 26, 16), ("criteo_tb_26", 26, 64),
        ("synthetic_1000", 1000, 8), ("synthetic_1000", 1000, 64), ("synthetic_1000", 1000, 128),
    ]  # fmt: skip
    for q in data["quality"]:
        ours = q["shardkit"]
        assert "torchrec" not in q and ours["fits"], q
        assert _positive(ours["seconds"], ours["max_cost_ms"], ours["max_memory_gib"])
        assert ours["max_cost_ms"] >= ours["mean_cost_ms"] > 0
        assert ours["cost_imbalance"] == pytest.approx(ours["max_cost_ms"] / ours["mean_cost_ms"])
        assert ours["memory_imbalance"] >= 1
        assert sum(ours["sharding_types"].values()) == q["tables"], ours
    text = markdown.read_text()
    assert "criteo_tb_26" in text and "synthetic_1000" in text


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


def test_bench_table_runs_at_toy_size(tmp_path):
    out = tmp_path / "table.md"
    _run("bench_table.py", "--rows", "3000", "--rounds", "1", "--keep", str(tmp_path / "log"),
         "--out", str(out))  # fmt: skip
    assert "| csv | " in out.read_text() and "| parquet | " in out.read_text()
    report = json.loads(out.with_suffix(".json").read_text())
    for name in ("csv", "csv.gz", "parquet"):
        (run,) = report["runs"][name]
        assert run["rows"] == 3000 and 2400 < run["train_rows"] < 3000, run
        assert run["scan_rows_per_s"] > 0 and run["read_rows_per_s"] > 0
    assert (tmp_path / "log" / "ratings.toml").exists()
    first = tmp_path / "first_scan.md"  # the files again, each read by a fresh process
    _run("bench_table.py", "--first-scan", str(tmp_path / "log"), "--rounds", "1", "--out",
         str(first))  # fmt: skip
    runs = json.loads(first.with_suffix(".json").read_text())["first_scan"]["runs"]
    assert sorted((r["kind"], r["file"]) for r in runs) == [
        (kind, f"ratings.{name}") for kind in ("pyarrow", "scan") for name in ("csv.gz", "parquet")
    ]
    assert all(r["rows"] == 3000 and r["wall_s"] > 0 and r["cpu_s"] > 0 for r in runs), runs
    assert "| csv.gz | scan (.) | " in first.read_text()


def test_bench_mc_runs_at_toy_size(tmp_path):
    out = tmp_path / "mc.md"
    _run(
        "bench_mc.py", "--vocab", "2000", "--rows", "200", "--steps", "6", "--batch", "64",
        "--eval", "256", "--eviction-interval", "2", "--seeds", "0", "--drift", "0", "3",
        "--out", str(out),
    )  # fmt: skip
    report = out.read_text()
    assert "| 0 | mc-distance-lfu |" in report and "| 3 | exact | 0.0% |" in report
    data = json.loads(out.with_suffix(".json").read_text())
    _machine(data["machine"])
    contenders = ["modulo", "mc-lfu", "mc-lru", "mc-distance-lfu", "exact"]
    assert [(r["drift"], r["contender"]) for r in data["rows"]] == [
        (drift, name) for drift in (0, 3) for name in contenders
    ]
    for row in data["rows"]:
        assert 0 <= row["collided_lookups"] <= 1 and 0 <= row["ids_with_own_row"] <= 1, row
        assert 0 <= row["auc"] <= 1 and 0 <= row["best_auc"] <= 1, row
        assert _positive(row["log_loss"], row["ms_per_step"]), row
    summary = {(s["drift"], s["contender"]): s for s in data["summary"]}
    assert list(summary) == [(r["drift"], r["contender"]) for r in data["rows"]]
    for (drift, name), entry in summary.items():  # one seed: the mean is the run's value
        run = next(r for r in data["rows"] if (r["drift"], r["contender"]) == (drift, name))
        assert entry["auc"] == {"mean": run["auc"], "min": run["auc"], "max": run["auc"]}
        assert entry["auc_over_modulo"]["mean"] == pytest.approx(
            run["auc"] - summary[drift, "modulo"]["auc"]["mean"]
        )
    for drift in (0, 3):  # a table with a row per id never collides; modulo folds 2000 into 200
        assert summary[drift, "exact"]["collided_lookups"]["mean"] == 0
        assert summary[drift, "exact"]["ids_with_own_row"]["mean"] == 1
    modulo, lfu = summary[0, "modulo"], summary[0, "mc-lfu"]
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
    data = json.loads(out.with_suffix(".json").read_text())
    _machine(data["machine"])
    rows = data["rows"]
    assert [(r["model"], r["storage"]) for r in rows] == [
        ("adult", s) for s in ("float", "fp16", "int8", "int4")
    ]
    table_bytes = [r["table_bytes"] for r in rows]
    assert table_bytes == sorted(table_bytes, reverse=True) and len(set(table_bytes)) == 4
    # fp16 halves the float tables (int8/int4 add a scale and bias per row)
    assert table_bytes[1] == table_bytes[0] // 2
    for row in rows:
        assert _positive(row["file_bytes"], row["table_bytes"], row["log_loss"]), row
        assert 0 <= row["auc"] <= 1, row
        assert row["auc_change"] == pytest.approx(row["auc"] - rows[0]["auc"]), row
        assert set(row["lookup_us"]) == {"1", "8"} and _positive(*row["lookup_us"].values()), row
    assert rows[0]["auc_change"] == 0


def test_bench_mc_sharded_runs_at_toy_size(tmp_path):
    out = tmp_path / "mc_sharded.md"
    _run(
        "bench_mc_sharded.py", "--rows", "200", "--vocab", "2000", "--batch", "16", "--steps", "2",
        "--rounds", "1", "--eviction-interval", "2", "--out", str(out),
    )  # fmt: skip
    report = out.read_text()
    assert "| id % rows |" in report and "| managed collision |" in report


def test_bench_dmp_dense_runs_at_toy_size(tmp_path):
    out = tmp_path / "dmp_dense.md"
    _run(
        "bench_dmp_dense.py", "--hidden", "64", "--layers", "1", "--rows", "50", "--batch", "4",
        "--warmup", "1", "--steps", "1", "--rounds", "1", "--out", str(out),
    )  # fmt: skip
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert list(rows) == ["ddp", "fsdp"]
    for row in rows.values():
        assert _positive(row["peak_rss_mb"], row["held_mb"], row["ms_per_step"])
    # each of 2 ranks holds half of the dense state (rounded up per parameter)
    assert rows["fsdp"]["held_mb"] == pytest.approx(rows["ddp"]["held_mb"] / 2, rel=0.05)


def test_bench_qcomm_runs_at_toy_size(tmp_path):
    out = tmp_path / "qcomm.md"
    _run(
        "bench_qcomm.py", "--ranks", "2", "--tables", "2", "--rows", "50", "--dim", "32",
        "--batch", "4", "--steps", "1", "--rounds", "2", "--out", str(out),
    )  # fmt: skip
    rows = json.loads(out.with_suffix(".json").read_text())["results"]["2"]
    assert list(rows) == ["fp32", "fp16", "bf16", "fp8", "int8"]
    for row in rows.values():
        assert _positive(row["bytes_per_step"], row["ms_per_step"])
        assert len(row["loss_curve"]) == 2 and row["max_loss_diff"] < 0.01
    # the 16-bit pooled rows (and their gradients) are half of float32's; ids stay int64
    assert rows["fp16"]["bytes_per_step"] == rows["bf16"]["bytes_per_step"]
    assert rows["fp16"]["bytes_per_step"] < 0.9 * rows["fp32"]["bytes_per_step"]
    # FP8/INT8 rows: a byte per value and 4/8 bytes of scale per 32-wide row
    assert (
        rows["fp8"]["bytes_per_step"]
        < rows["int8"]["bytes_per_step"]
        < rows["fp16"]["bytes_per_step"]
    )


def test_bench_row_buckets_runs_at_toy_size():
    text = _run("bench_row_buckets.py", "--bags", "8", "--shards", "2", "9", "--reps", "1")
    assert text.startswith("Machine: ") and "partition/sort" in text
    assert len(text.strip().splitlines()) == 5


def test_bench_vbe_runs_at_toy_size(tmp_path):
    out = tmp_path / "vbe.md"
    _run(
        "bench_vbe.py", "--sharding", "table_wise", "--batch", "8", "--repeat", "4", "--rows",
        "50", "--dim", "8", "--steps", "1", "--rounds", "1", "--out", str(out),
    )  # fmt: skip
    rows = json.loads(out.with_suffix(".json").read_text())["results"]["table_wise"]
    assert list(rows) == ["vbe", "expanded"]
    for row in rows.values():
        assert _positive(row["input"], row["output"], row["backward"], row["ms_per_step"])
    # 4 user + 4 item features of dim 8, 8 examples: users send 2 rows each, not 8
    assert rows["expanded"]["output"] == rows["expanded"]["backward"] > rows["vbe"]["output"]
    assert rows["vbe"]["input"] < rows["expanded"]["input"]


@pytest.mark.pt2_grid
def test_bench_pt2_runs_at_toy_size(tmp_path):
    out = tmp_path / "pt2.md"
    _run(
        "bench_pt2.py", "--tables", "2", "--rows", "100", "--dim", "4", "--batch", "8",
        "--steps", "2", "--warmup", "1", "--rounds", "2", "--dmp-types", "row_wise",
        "--out", str(out),
    )  # fmt: skip
    data = json.loads(out.with_suffix(".json").read_text())
    _machine(data["machine"])
    assert list(data["results"]) == ["ebc", "dlrm", "dlrm, DMP 2 ranks, row_wise"]
    for row in data["results"].values():
        assert len(row["eager_ms"]) == len(row["compiled_ms"]) == 2
        assert _positive(*row["eager_ms"], *row["compiled_ms"], row["compile_s"]), row
    assert "| dlrm, DMP 2 ranks, row_wise |" in out.read_text()


def test_bench_dmp_as_written_shows_each_rounds_pair():
    """The per-round table pairs each round's TorchRec run with the shardkit run beside it, in
    the order run (issue 25: which row's spread is the machine's and which one library's);
    rows without TorchRec or with a failed run are left out."""
    spec = importlib.util.spec_from_file_location(
        "_as_written", BENCHMARKS / "bench_dmp_as_written.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def run(ms: float, cpu: float) -> dict:
        return {"median_ms": ms, "cpu_ms_per_rank": [cpu - 1, cpu]}

    results = {
        ("column_wise", "plain", "sgd"): {
            "torchrec": [run(120.0, 130.0), run(144.0, 150.0)],
            "shardkit": [run(96.0, 100.0), run(136.8, 140.0)],
        },
        ("row_wise", "plain", "sgd"): {"torchrec": [], "shardkit": [run(90.0, 95.0)]},
        ("table_wise", "plain", "sgd"): {
            "torchrec": [run(100.0, 100.0)],
            "shardkit": [{"failed": "boom"}],
        },
    }
    lines = bench.per_round(results)
    assert lines[3] == "| type | loop | optimizer | round 1 | round 2 |"
    assert lines[5:] == [
        "| column_wise | plain | sgd | 120.0 / 96.0 (0.80); CPU 130.0 / 100.0 | "
        "144.0 / 136.8 (0.95); CPU 150.0 / 140.0 |"
    ]
    assert (
        bench.per_round({("row_wise", "plain", "sgd"): results[("row_wise", "plain", "sgd")]}) == []
    )
