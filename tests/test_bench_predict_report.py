"""benchmarks/bench_predict.py's report (issue 29), without running its steps: fast, unlike
the benchmarks' smoke runs in test_benchmarks.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_bench_predict_scores_the_resampled_prediction_of_the_fastest_round():
    """Each row's re-sampled prediction is that of the round it is measured by (the fastest
    wall round against the wall, the fastest CPU round against the proxy), beside the
    calibrated profile's ([Note: re-sampled profile])."""
    spec = importlib.util.spec_from_file_location("_bench_predict", BENCHMARKS / "bench_predict.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]
    row = {
        "case": "dmp", "world": 2, "hosts": 1, "type": "row_wise", "predicted_ms": 150.0,
        "phases": {"embedding": 1.0}, "torchrec_ms": None,
        "rounds": [130.0, 100.0], "cpu_rounds": [50.0, 90.0], "resampled_rounds": [60.0, 110.0],
    }  # fmt: skip
    report = {
        "args": {"rounds": 2, "iters": 4, "warmup": 2},
        "profile": {"identity": {}, "cores": 2},
        "machine": {"host": "h"},
        "load_average": {"before": [0.0] * 3, "after": [0.0] * 3},
        "rows": [row],
    }
    text = bench.render(report)
    assert "| 150.0 | +50% | 110.0 | +10% |" in text  # round 2 is the wall's fastest
    assert "Against wall: 0 of 1 cases within 20%" in text
    assert "re-sampled around the steps: 1 of 1 cases within 20%" in text
    # against the CPU-time proxy: round 1 (50 ms), whose re-sample is 60 ms: +20%
    assert (
        "Against alone (CPU), predicted from the profile re-sampled around the steps: 1 of 1"
        in text
    )
    row["resampled_rounds"] = [70.0, 110.0]
    assert (
        "Against alone (CPU), predicted from the profile re-sampled around the steps: 0 of 1"
        in (bench.render(report))
    )
    # without --resample no row has re-samples: no re-sampled columns, no line for them
    del row["resampled_rounds"]
    text = bench.render(report)
    assert "re-sampled" not in text.lower()
    assert "| 150.0 | +50% | 50.0 | +200% |" in text  # predicted, error, then alone (CPU)
