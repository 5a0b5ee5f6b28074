"""``shardkit bench calibrate`` at toy sizes writes a profile the planner loads, and the fit it
uses recovers known coefficients; ``shardkit plan --profile`` and ``--simulate`` print
predictions."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from shardkit.bench import fit_nonnegative
from shardkit.cli import main
from shardkit.planner import COLLECTIVE_KINDS, Topology, load_profile
from shardkit.planner._profile import expected_unique
from tests.planner._profiles import profile as hand_profile
from tests.scripts import ROOT, free_port

TOY = [
    "--optimizers", "exact_sgd", "--dims", "8", "--ids", "256", "1024", "--sizes", "1K", "16K",
    "--repeats", "1", "--copy-bytes", "1M", "--big-table-bytes", "1M",
]  # fmt: skip


def test_fit_recovers_coefficients_and_keeps_them_nonnegative():
    rows = [[1.0, x, x * y] for x in (1, 2, 5, 10) for y in (1, 3)]
    times = [0.5 + 0.2 * x + 0.01 * x * y for _, x, xy in rows for y in [xy / x]]
    assert fit_nonnegative(rows, times) == pytest.approx([0.5, 0.2, 0.01], rel=1e-6)
    # a feature that only makes things faster gets 0, not a negative coefficient
    falling = [0.5 + 1.0 - 0.01 * x for _, x, _ in rows]
    coef = fit_nonnegative(rows, falling)
    assert min(coef) >= 0 and coef[2] == 0
    with pytest.raises(ValueError, match="needs times > 0"):
        fit_nonnegative(rows, [0.0] * len(rows))


def test_switch_wait_is_the_wait_per_extra_rank_sharing_a_core():
    from shardkit.bench._links import fit_switch_wait

    rows = [
        {"world_size": 4, "ms": 3.0, "oversubscription": 2.0},  # 3 ms for 1 extra rank
        {"world_size": 6, "ms": 8.0, "oversubscription": 3.0},  # 4 ms each for 2
        {"world_size": 8, "ms": 30.0, "oversubscription": 4.0},  # 10 ms each for 3
    ]
    assert fit_switch_wait(rows) == pytest.approx(4.0)  # the median
    assert fit_switch_wait([{"world_size": 2, "ms": 5.0, "oversubscription": 1.0}]) == 0.0
    assert fit_switch_wait([]) == 0.0
    from shardkit.bench import format_profile

    said = "ranks beyond the 4 cores: each collective waits 2.00 ms per extra rank sharing a core"
    assert said in format_profile(hand_profile(switch_wait_ms=2.0))
    assert "beyond the" not in format_profile(hand_profile())  # not measured: nothing said


def test_link_fit_takes_out_the_page_faults_it_timed():
    from shardkit.bench._links import fit_links

    # the wire: 1 ms + bytes / 1e6 bytes/ms; at 4e7 bytes (past a 3e7-byte threshold) the
    # reduce-scatter also faulted its receive buffer: 4e7 x 1e-6 ms per byte, twice over for
    # 4 ranks of 1 thread on 2 cores (see [Note: fresh pages])
    rows = [
        {"kind": kind, "bytes": n, "world_size": 4, "ms": 1.0 + n / 1e6 + extra}
        for kind, faults in (("reduce_scatter", 80.0), ("all_to_all", 0.0))
        for n, extra in ((1e5, 0.0), (1e6, 0.0), (4e7, faults))
    ]
    fits = {f.kind: f for f in fit_links(rows, "intra", (30_000_000, 1e-6), 1 / 2)}
    for kind in ("reduce_scatter", "all_to_all"):
        assert (fits[kind].latency_ms, fits[kind].bytes_per_ms) == pytest.approx((1.0, 1e6))
    # without the fresh-page cost the faults bend the fit
    bent = {f.kind: f for f in fit_links(rows, "intra")}
    assert bent["reduce_scatter"].bytes_per_ms < 0.7e6


def test_fresh_pages_line_in_the_profile():
    from dataclasses import replace

    from shardkit.bench import format_profile

    said = "buffers of 32 MiB or more: fresh pages, 0.60 ms per MiB"
    prof = replace(hand_profile(), fresh_buffer_bytes=32 << 20, fresh_page_ms_per_byte=0.6 / 2**20)
    assert said in format_profile(prof)
    assert "fresh pages" not in format_profile(hand_profile())


def test_bucketing_cost_per_id_is_measured_and_printed():
    from dataclasses import replace

    import torch

    from shardkit.bench import format_profile
    from shardkit.bench._calibrate import CalibrationConfig, bucket_cost

    # a counting partition: some ns per id on any CPU (the bags' and call's cost cancel)
    per_id = bucket_cost(CalibrationConfig(repeats=3), torch.device("cpu"))
    assert 1e-8 < per_id < 1e-3, per_id
    prof = replace(hand_profile(), bucket_ms_per_id=9.1e-6)
    assert "row-wise bucketing: 9.1 ns per id" in format_profile(prof)
    assert "bucketing" not in format_profile(hand_profile())


def test_fit_leaves_out_a_point_another_process_slowed():
    rows = [[1.0, x] for x in range(1, 11)]
    times = [1.0 + 0.5 * x for x in range(1, 11)]
    times[4] *= 20  # one point caught another process's time slice
    assert fit_nonnegative(rows, times, outliers=True) == pytest.approx([1.0, 0.5], rel=1e-6)
    assert fit_nonnegative(rows, times) != pytest.approx([1.0, 0.5], rel=1e-4)


@pytest.mark.slow
def test_calibrate_at_toy_sizes(tmp_path, capsys):
    out = tmp_path / "profile.json"
    status = main(
        [
            "bench", "calibrate", "--out", str(out), "--optimizers", "exact_sgd",
            "--dims", "8", "16", "--ids", "256", "1024", "--sizes", "1K", "16K",
            "--world-sizes", "2", "--repeats", "1", "--copy-bytes", "1M",
            "--big-table-bytes", "1M",
        ]
    )  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    for says in ("memory copy bandwidth", "linear layer", "kernel exact_sgd", "all_to_all x 2",
                 "sharded step overhead", f"wrote {out}"):  # fmt: skip
        assert says in printed
    profile = load_profile(out)
    assert profile.compute_device == "cpu" and profile.backend == "gloo"
    assert {(f.kind, f.world_size) for f in profile.links} == {(k, 2) for k in COLLECTIVE_KINDS}
    assert [k.optimizer for k in profile.kernels] == ["exact_sgd"]
    # dims x ids x 2 tables, then the miss curve's 6 (1/64 to all of the 1 MiB big table)
    assert len(profile.points["kernel:exact_sgd"]) == 2 * 2 * 2 + 6
    identity = dict(profile.identity)
    assert identity["torch"] and identity["backend"] == "gloo" and identity["cpu_model"]
    assert profile.memory_bw > 0 and profile.matmul_flops > 0 and profile.cache_bytes > 0
    assert Topology.from_profile(profile, world_size=2).profile == profile
    # the noisy points sampled over the run (5 by default): the spread recorded and said
    assert profile.spread["matmul_flops"][2] == 5 and "over 5 samples)" in printed


@pytest.mark.slow
def test_calibrate_under_torchrun_on_two_hosts_measures_the_links_between_them(tmp_path):
    """What torchrun --nnodes 2 --nproc-per-node 1 gives each agent's rank (its environment):
    the world's collectives are the links between hosts, and the host's own come from fresh
    ranks that rank 0 spawns."""
    out, port = tmp_path / "cluster.json", str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
        env.update(LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        command = [sys.executable, "-m", "shardkit", "bench", "calibrate", "--out", str(out)]
        command += [*TOY, "--world-sizes", "2"]
        procs.append(
            subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        )
    outputs = [p.communicate(timeout=280)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "2 ranks in 2 host(s) of 1" in outputs[0] and f"wrote {out}" in outputs[0]
    assert f"wrote {out}" not in outputs[1]  # rank 0 alone writes
    links = {(f.kind, f.world_size, f.scope) for f in load_profile(out).links}
    assert links == {(k, 2, s) for k in COLLECTIVE_KINDS for s in ("intra", "inter")}


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "model.json"
    tables = [{"name": f"t{i}", "rows": 10_000, "dim": 64, "pooling_factor": 5} for i in range(4)]
    model.write_text(json.dumps({"batch_size": 256, "tables": tables}))
    prof = tmp_path / "profile.json"
    hand_profile().save(prof)
    return model, prof


def test_plan_with_profile(files, capsys):
    model, prof = files
    status = main(["plan", str(model), "--world-size", "2", "--profile", str(prof),
                   "--dense-params", "1000", "--optimizer", "exact_sgd"])  # fmt: skip
    assert status == 0
    out = capsys.readouterr().out
    assert "predicted step" in out and "[profile: hand-written]" in out and "step ms" in out


def test_simulate_prints_both_curves(files, tmp_path, capsys):
    model, prof = files
    curves = tmp_path / "sim.json"
    status = main(
        [
            "plan", str(model), "--profile", str(prof), "--simulate", "--ranks-per-host", "4",
            "--inter-bw", "10G", "--inter-latency-us", "50", "--sizes", "8", "16", "32",
            "--optimizer", "exact_sgd", "--simulation-json", str(curves),
        ]
    )  # fmt: skip
    assert status == 0
    out = capsys.readouterr().out
    assert "strong scaling" in out and "weak scaling" in out and "[Note: simulated scaling]" in out
    data = json.loads(curves.read_text())
    assert [p["world_size"] for p in data["weak"]] == [8, 16, 32]
    assert [p["batch_size"] for p in data["strong"]] == [256, 128, 64]  # 256 x 8 in all
    assert all(p["step_ms"] > 0 and p["samples_per_s"] > 0 for p in data["weak"])
    assert [p["num_hosts"] for p in data["weak"]] == [2, 4, 8]


def test_simulate_needs_a_profile_and_the_links_between_hosts(files, capsys):
    model, prof = files
    assert main(["plan", str(model), "--simulate"]) == 1
    assert "--simulate needs --profile" in capsys.readouterr().err
    assert main(["plan", str(model), "--simulate", "--profile", str(prof)]) == 1
    assert "--simulate needs the links between hosts" in capsys.readouterr().err
    assert main(["plan", str(model), "--profile", str(prof)]) == 1
    assert "--world-size is required" in capsys.readouterr().err


def test_kernel_fit_recovers_its_coefficients_and_the_miss_curve():
    from shardkit.bench._kernel_fit import fit_kernel
    from shardkit.planner import KernelFit, miss_fraction

    # points as calibrate times them (dims x ids x a cached and a large table, 20 or 2 ids per
    # bag), their times from known coefficients with the plain miss fraction; then the curve's
    # tables, where a missed row costs what m = 0.1 and 0.6 (forward), 0.3 and 0.9 (backward)
    # say, not what the cache size alone would
    cache = 1 << 20
    truth = KernelFit(
        "exact_sgd", (0.05, 1e-6, 2e-8, 3e-8, 4e-6, 5e-8), (0.02, 3e-6, 1e-8, 2e-8, 6e-6, 7e-8, 9e-8)
    )  # fmt: skip

    def point(ids: int, rows: int, dim: int, pooling: int, m=None) -> dict:
        bags, touched = ids // pooling, rows * dim * 4 + ids // pooling * dim * 4
        unique = expected_unique(ids, rows)
        m_f, m_b = m or (miss_fraction(touched, cache),) * 2
        return {
            "ids": ids, "rows": rows, "dim": dim, "bags": bags, "unique": unique,
            "touched": touched, "forward_ms": truth.forward_ms(ids, bags, dim, miss=m_f),
            "backward_ms": truth.backward_ms(ids, unique, dim, miss=m_b, bags=bags),
        }  # fmt: skip

    points = [
        point(ids, rows, dim, 20 if (d + i) % 2 == 0 else 2)
        for d, dim in enumerate((16, 64, 128))
        for i, ids in enumerate((4096, 32768))
        for rows in (ids // 4, 8 * cache // (4 * dim))
    ]
    curve = [
        point(32768, 4 * cache // 256, 64, 20, (0.1, 0.3)),
        point(32768, 8 * cache // 256, 64, 20, (0.6, 0.9)),
    ]
    for p in curve:
        p["curve"] = True
    fit = fit_kernel("exact_sgd", points + curve, cache)
    assert fit.forward == pytest.approx(truth.forward, rel=1e-6)
    assert fit.backward == pytest.approx(truth.backward, rel=1e-6)  # b6, the bags' gradients
    assert [p[0] for p in fit.miss_curve] == [p["touched"] for p in curve]
    assert [p[1:] for p in fit.miss_curve] == [pytest.approx((0.1, 0.3)), pytest.approx((0.6, 0.9))]


def test_a_kernel_point_whose_output_faults_fresh_pages_has_them_taken_out():
    import torch

    from shardkit.bench._calibrate import CalibrationConfig, _kernel_point

    # 128 bags x 8 columns x 4 bytes = 4,096 bytes of pooled output per call; see
    # [Note: fresh pages]: at 1 ms per byte from 1,000 bytes that is 4,096 ms of faults, more
    # than the call took, so its forward is left at the floor; under a higher threshold, none
    config = CalibrationConfig(repeats=1)
    point = _kernel_point(config, "exact_sgd", torch.device("cpu"), 256, 64, 8, 2, (1000, 1.0))
    assert point["fresh_ms"] == 4096.0 and point["forward_ms"] == 1e-4
    kept = _kernel_point(config, "exact_sgd", torch.device("cpu"), 256, 64, 8, 2, (4097, 1.0))
    assert kept["fresh_ms"] == 0.0 and kept["forward_ms"] > 1e-4


def test_a_profile_keeps_its_samples_spread_and_older_profiles_load_without_one(tmp_path):
    from dataclasses import replace

    from shardkit.bench import format_profile
    from shardkit.planner import MachineProfile

    sampled = replace(
        hand_profile(switch_wait_ms=1.5),
        spread={"matmul_flops": (6.1e7, 7.8e7, 5), "switch_wait_ms": (0.9, 2.3, 5),
                "tiny_step_ms": (1.4, 2.4, 5)},
    )  # fmt: skip
    path = tmp_path / "p.json"
    sampled.save(path)
    assert load_profile(path).spread == sampled.spread
    said = format_profile(sampled)
    assert "matmul 1000.0 GFLOP/s (61.0-78.0 over 5 samples)" in said
    assert "1.50 ms per extra rank sharing a core (0.90-2.30 over 5 samples)" in said
    assert "its smallest model's step over 5 samples: 1.40-2.40 ms" in said
    # a profile calibrate wrote before it sampled (committed with issue 29's quiet reports)
    older = load_profile(ROOT / "benchmarks/results/predict_profile_recal_1811.json")
    assert older.spread == {} and "samples" not in format_profile(older)
    with pytest.raises(ValueError, match=r"spread\['matmul_flops'\] must be \(lowest, highest"):
        MachineProfile.from_dict({**sampled.to_dict(), "spread": {"matmul_flops": [2, 1, 5]}})


def test_samples_of_one_point_count_as_their_median():
    from shardkit.bench._links import fit_links, fit_switch_wait
    from shardkit.bench._overhead import _OVERHEAD_POINTS, fit_overhead

    # three samples of each size; one of them caught a slow spell (3x): the median ignores it
    rows = [
        {"kind": "all_to_all", "bytes": n, "world_size": 2, "scope": "intra", "sample": k,
         "ms": (1.0 + n / 1e6) * (3.0 if k == 1 and n == 1e6 else 1.0)}
        for k in range(3) for n in (1e4, 1e6, 4e6)
    ]  # fmt: skip
    (fit,) = fit_links(rows, "intra")
    assert (fit.latency_ms, fit.bytes_per_ms) == pytest.approx((1.0, 1e6))
    waits = [{"world_size": 4, "oversubscription": 2.0, "ms": ms, "sample": k}
             for k, ms in enumerate((1.0, 5.0, 1.2))]  # fmt: skip
    waits.append({"world_size": 8, "oversubscription": 4.0, "ms": 6.0, "sample": 0})
    assert fit_switch_wait(waits) == pytest.approx((1.2 + 2.0) / 2)  # 4 ranks' median: 1.2
    kernel = hand_profile().kernels[0]
    steps = [
        {"features": f, "batch": b, "dim": d, "sample": k,
         "ms": (1.0 + 0.1 * f) * (2.0 if k == 2 else 1.0)}
        for k in range(3) for f, b, d in _OVERHEAD_POINTS
    ]  # fmt: skip
    once = [r for r in steps if r["sample"] == 0]
    assert fit_overhead(steps, kernel, []) == pytest.approx(fit_overhead(once, kernel, []))


def test_calibrate_samples_its_noisy_points_between_the_kernel_points(monkeypatch):
    """Each noisy point is sampled ``samples`` times, the samples spread over the run (a piece
    of the kernel's points between each two), and the profile keeps their median and spread."""
    import shardkit.bench._calibrate as cal
    from shardkit.bench._overhead import _OVERHEAD_POINTS

    timeline: list[str] = []
    matmul = iter([6e7, 9e7, 7e7])  # the median is the middle one, 7e7

    def kernel_point(config, name, device, ids, rows, dim, pooling, fresh):
        timeline.append("kernel")
        return {"ids": ids, "rows": rows, "unique": min(ids, rows), "bags": ids // pooling,
                "dim": dim, "touched": rows * dim * 8, "forward_ms": 1e-5 * ids * dim,
                "backward_ms": 2e-5 * ids * dim, "fresh_ms": 0.0}  # fmt: skip

    class Ranks:
        def __init__(self, config, local_links):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def overhead(self, k):
            timeline.append("overhead")
            return [{"features": f, "batch": b, "dim": d, "ms": 2.0 + k, "sample": k}
                    for f, b, d in _OVERHEAD_POINTS]  # fmt: skip

        def kernels_together(self):
            timeline.append("together")
            return 3.0  # ms, with the other ranks running it too

        def collectives(self, k):
            timeline.append("collectives")
            return [{"kind": cal.SCHEDULING_WAIT, "world_size": 4, "ms": (1.0, 3.0, 2.0)[k],
                     "oversubscription": 2.0, "sample": k, "scope": "intra"}]  # fmt: skip

    def sampled(name, value):
        def measure(config, device):
            timeline.append(name)
            return value()

        return measure

    monkeypatch.setattr(cal, "_kernel_point", kernel_point)
    monkeypatch.setattr(cal, "_Ranks", Ranks)
    monkeypatch.setattr(cal, "memory_bandwidth", sampled("copy", lambda: 1e7))
    monkeypatch.setattr(cal, "matmul_throughput", sampled("matmul", lambda: next(matmul)))
    monkeypatch.setattr(cal, "bucket_cost", sampled("bucket", lambda: 1e-5))
    monkeypatch.setattr(cal, "fresh_pages", lambda config, device: (0, 0.0))
    alone = iter([2.0, 1.5, 2.5])  # ms: x1.5, x2, x1.2
    monkeypatch.setattr(cal, "kernel_call_ms", lambda optimizer, repeats: next(alone))
    config = cal.CalibrationConfig(optimizers=("exact_sgd",), dims=(8,), ids=(256, 1024),
                                   samples=3, big_table_bytes=1 << 20)  # fmt: skip
    said: list[str] = []
    profile = cal._calibrate_host(config, said.append, [], local_links=True)
    kernels = len(cal.kernel_shapes(config, cal.cache_bytes("cpu")))
    assert timeline.count("kernel") == kernels and timeline.count("matmul") == 3
    # never two samples of a point back to back: kernel points between each two
    starts = [i for i, what in enumerate(timeline) if what == "copy"]
    assert all("kernel" in timeline[a:b] for a, b in itertools.pairwise(starts))
    assert profile.matmul_flops == 7e7 and profile.spread["matmul_flops"] == (6e7, 9e7, 3)
    assert profile.switch_wait_ms == 2.0 and profile.spread["switch_wait_ms"] == (1.0, 3.0, 3)
    assert profile.spread["tiny_step_ms"] == (2.0, 4.0, 3)
    assert profile.kernels_together == 1.5 and profile.spread["kernels_together"] == (1.2, 2.0, 3)
    assert (
        "float32 linear layer, forward and backward: 70.0 GFLOP/s (60.0-90.0 over 3 samples)"
        in said
    )


def test_the_kernel_call_timed_alone_and_together_runs():
    from shardkit.bench._together import kernel_call_ms

    # the memory-bound call calibrate times alone here and in the host's ranks at once
    assert 0 < kernel_call_ms("exact_row_wise_adagrad", 1) < 10_000


def _calibrated_with_points():
    """The hand profile as calibrate would write it: its points (two in-cache kernel points,
    one out of cache, one on the miss curve; the collectives of 1 and 2 ranks; the tiny steps)
    and the fits of those points."""
    from dataclasses import replace

    from shardkit.bench._links import fit_links
    from shardkit.bench._overhead import _OVERHEAD_POINTS, fit_overhead

    base = hand_profile()
    kernel = [
        {"ids": ids, "rows": rows, "dim": 8, "bags": ids // 4, "unique": min(ids, rows),
         "touched": rows * 32, "forward_ms": fwd, "backward_ms": bwd, "curve": curve}
        for ids, rows, fwd, bwd, curve in (
            (256, 64, 1.0, 2.0, False), (1024, 256, 3.0, 6.0, False),
            (1024, 1 << 20, 9.0, 20.0, False), (1024, 1 << 18, 5.0, 11.0, True),
        )
    ]  # fmt: skip
    collectives = [
        {"kind": kind, "world_size": world, "bytes": n, "scope": "intra", "sample": 0,
         "ms": 0.5 * world + n / 1e6}
        for kind in COLLECTIVE_KINDS for world in (1, 2) for n in (1e4, 1e6)
    ]  # fmt: skip
    steps = [
        {"features": f, "batch": b, "dim": d, "sample": 0, "ms": 2.0 + 0.1 * f}
        for f, b, d in _OVERHEAD_POINTS
    ]  # fmt: skip
    links = tuple(fit_links(collectives, "intra"))
    points = {"kernel:exact_sgd": kernel, "collectives": collectives, "step_overhead": steps}
    overhead = fit_overhead(steps, base.kernels[0], links)
    return replace(base, links=links, step_overhead=overhead, points=points)


def _link_numbers(links):
    return [v for link in links for v in (link.world_size, link.latency_ms, link.bytes_per_ms)]


def test_a_resampled_profile_moves_the_speeds_and_keeps_the_fits():
    """[Note: re-sampled profile]: the scalars are the samples' median, each kernel is scaled by
    its in-cache points now over then (not the out-of-cache or curve points), the re-sampled
    world's links and the step overhead are refitted from the new rows, the rest stays."""
    from dataclasses import replace

    from shardkit.bench import resampled_profile
    from shardkit.bench._links import fit_links
    from shardkit.bench._overhead import fit_overhead
    from shardkit.bench._resample import kernel_base_points

    profile = _calibrated_with_points()
    assert [p["ids"] for p in kernel_base_points(profile, "exact_sgd")] == [256, 1024]
    old = profile.points["kernel:exact_sgd"]

    def sample(k, slow):
        return {
            "scalars": {"memory_bw": 2e7 * slow, "matmul_flops": 5e8 * slow,
                        "bucket_ms_per_id": 1e-5 * slow},
            # the in-cache points 1.5x slower forward, 2x backward; the big table's 10x (ignored)
            "kernels": {"exact_sgd": [
                {**p, "forward_ms": p["forward_ms"] * (1.5 if p["rows"] <= p["ids"] else 10),
                 "backward_ms": p["backward_ms"] * (2.0 if p["rows"] <= p["ids"] else 10)}
                for p in old[:3]
            ]},
            "collectives": [
                {"kind": kind, "world_size": 2, "bytes": n, "scope": "intra", "sample": k,
                 "ms": 3.0 + n / 5e5} for kind in COLLECTIVE_KINDS for n in (1e4, 1e6)
            ],
            "steps": [{**r, "ms": 3 * r["ms"], "sample": k}
                      for r in profile.points["step_overhead"]],
        }  # fmt: skip

    now = resampled_profile(profile, [sample(0, 1.0), sample(1, 3.0)])
    assert now.memory_bw == pytest.approx(4e7) and now.matmul_flops == pytest.approx(1e9)
    assert now.bucket_ms_per_id == pytest.approx(2e-5)
    (then,), (fit,) = profile.kernels, now.kernels
    assert fit.forward == pytest.approx(tuple(1.5 * c for c in then.forward))
    assert fit.backward == pytest.approx(tuple(2.0 * c for c in then.backward))
    assert fit.miss_curve == then.miss_curve
    two = {link.kind: link for link in now.links if link.world_size == 2}
    one = {link.kind: link for link in now.links if link.world_size == 1}
    assert (two["all_to_all"].latency_ms, two["all_to_all"].bytes_per_ms) == pytest.approx(
        (3.0, 5e5)
    )
    assert _link_numbers(one.values()) == pytest.approx(
        _link_numbers(link for link in profile.links if link.world_size == 1)
    )
    steps = [r for r in now.points["step_overhead"]]
    assert all(r["ms"] > 3.0 for r in steps) and len(steps) == 2 * len(
        profile.points["step_overhead"]
    )
    assert now.step_overhead == pytest.approx(fit_overhead(steps, fit, now.links))
    assert now.step_overhead != pytest.approx(profile.step_overhead)
    # no samples: the profile as calibrated; a profile without its points cannot be re-sampled
    assert resampled_profile(profile, []) is profile
    with pytest.raises(ValueError, match="calibration points"):
        resampled_profile(replace(profile, points={}), [sample(0, 1.0)])
    assert _link_numbers(fit_links(profile.points["collectives"], "intra")) == pytest.approx(
        _link_numbers(profile.links)
    )


@pytest.mark.slow
def test_the_sampler_times_calibrates_points_again_at_toy_sizes():
    from shardkit.bench import CalibrationConfig, MachineSampler, resampled_profile

    profile = _calibrated_with_points()
    config = CalibrationConfig(copy_bytes=1 << 20, repeats=1)
    with MachineSampler(profile, config=config) as sampler:
        sample = sampler.sample([2])
    assert [(p["ids"], p["rows"]) for p in sample["kernels"]["exact_sgd"]] == [
        (256, 64),
        (1024, 256),
    ]
    assert {(r["kind"], r["world_size"], r["bytes"]) for r in sample["collectives"]} == {
        (kind, world, n)
        for kind in COLLECTIVE_KINDS
        for world in (1, 2)
        for n in (10_000, 1_000_000)
    }
    assert len(sample["steps"]) == len(profile.points["step_overhead"])
    now = resampled_profile(profile, [sample])
    assert now.memory_bw == sample["scalars"]["memory_bw"] and now.kernels[0] != profile.kernels[0]
