"""Predicted vs measured DMP step time, per sharding type, at 1, 2 and 4 ranks.

    shardkit bench calibrate --out profile.json          # this machine, under a minute
    ~/.cache/shardkit-peers/venv/bin/python benchmarks/bench_predict.py --profile profile.json \
        --out benchmarks/results/predict.md               # TorchRec's estimates beside ours
    python benchmarks/bench_predict.py --profile profile.json   # without TorchRec

For each case (``dmp``: bench_dmp's 8 tables x 100,000 x 64, ~20 ids per bag; ``skewed``: 8
tables of 1,000,000 down to 1,000 rows and 40 down to 1 ids per bag; ``small``: 40 tables x
4,000 x 64, ~5 ids per bag), each world size and each sharding type that world size allows,
every table is given that type (the planner with a constraint; data-parallel FUSED and grid on
one host by hand, as bench_dmp), the planner predicts the step from the profile
(`Topology.from_profile`, `estimate_plan`), and fresh gloo ranks (one thread each) time DMP
training steps: batch 1,024 per rank, an MLP (T x D -> 256 -> 1), BCE, Adam for the MLP, fused
row-wise Adagrad for the tables (exact Adagrad for the data-parallel replicas). The planner's
own choice (no type constraint) is planned and timed too. Contenders take turns, round after
round; a case's time is the fastest round's median step (the slower rank's): other processes
on a shared machine only add time. With TorchRec importable, its planner plans the same type
and its `EmbeddingPerfEstimator`'s estimate of the busiest rank (the sum of its shards'
``Perf.total``: embedding lookups and communication, no dense part) is shown beside ours.

A profile calibrated an hour before the steps predicts them at the machine's speed of an hour
ago (a shared VM drifts 1.3-1.6x within the hour). With ``--resample`` (on one host, not under
torchrun), the profile's speed points are re-sampled with calibrate's own code
(`shardkit.bench.MachineSampler`: memory copy, matmul, bucketing, the kernel's in-cache
points, the step overhead, the collectives at the block's world size) before and after each
(world size, case) block of each round, and each row is also predicted from the profile those
two samples give (`resampled_profile`, see [Note: re-sampled profile]): the calibrated model at
the speed of the moment of the row's fastest round. The steps themselves are never fitted to.
It is off by default: in the quiet check of 2026-11-29 (predict_ranks_1_2_quiet4.md,
predict_ranks_4_quiet4.md) the re-sampled predictions came within 20% of the wall in 17 of 36
rows at 1-2 ranks and 15 of 24 at 4, the calibrated profile's in 30 of 36 and 24 of 24 (its
probes take the fastest of a few short repeats, which a noisy machine biases low against the
steps' medians), and it adds about a minute to each part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_dmp import TYPES, Batch, Model, _Optimizers, _optimizers

from shardkit.bench import machine_info
from shardkit.launch import RankFailedError, spawn

ONE_RANK = ["table_wise", "row_wise", "data_parallel"]  # the others need 2 ranks (per host)
PLANNER = "planner's choice"


@dataclass(frozen=True)
class Table:
    rows: int
    dim: int
    pooling: int  # ids per bag (mean)


CASES = {
    "dmp": [Table(100_000, 64, 20)] * 8,
    "skewed": [
        Table(r, 64, p)
        for r, p in zip(
            (1_000_000, 300_000, 100_000, 30_000, 10_000, 3_000, 1_000, 1_000),
            (40, 30, 20, 10, 5, 3, 2, 1),
        )
    ],
    "small": [Table(4_000, 64, 5)] * 40,
}


def configs(case: str, library: str = "shardkit"):
    if library == "torchrec":
        from torchrec import EmbeddingBagConfig
    else:
        from shardkit import EmbeddingBagConfig
    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[f"f{i}"]
        )
        for i, t in enumerate(CASES[case])
    ]


def dense_parameters(case: str) -> int:
    width = sum(t.dim for t in CASES[case])
    return width * 256 + 256 + 256 + 1


def _fused(kind: str) -> dict:
    from shardkit.optim import EmbOptimType

    if kind == "data_parallel":  # the replicas' exact Adagrad = torch's dense Adagrad
        return {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.01, "eps": 1e-10}
    return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}


def _constraints(case: str, kind: str | None):
    from shardkit.planner import ParameterConstraints

    types = {} if kind is None else {"sharding_types": [kind]}
    return {
        f"t{i}": ParameterConstraints(pooling_factors=[float(t.pooling)], **types)
        for i, t in enumerate(CASES[case])
    }


def make_plan(case: str, kind: str, world: int, topology, batch: int):
    """(plan JSON, prediction) with every table as ``kind`` (`PLANNER`: the planner's own
    choice)."""
    local = topology.local_world_size
    from shardkit import EmbeddingBagCollection
    from shardkit.planner import plan_tables
    from shardkit.sharding import construct_module_sharding_plan, data_parallel, grid_shard
    from shardkit.types import ShardingPlan

    tables = configs(case)
    fused = _fused(kind)
    common = dict(batch_size=batch, fused_params=fused, module_path="ebc")
    common["dense_parameters"] = dense_parameters(case)
    if kind in ("data_parallel", "grid_shard"):
        ebc = EmbeddingBagCollection(tables=tables, device="meta")
        gen = data_parallel(compute_kernel="fused") if kind == "data_parallel" else None
        gens = {
            f"t{i}": gen if gen is not None else grid_shard(host_indexes=[0])
            for i in range(len(tables))
        }
        module_plan = construct_module_sharding_plan(
            ebc, gens, world_size=world, local_size=local, device_type="cpu"
        )
        plan = ShardingPlan({"ebc": module_plan})
    else:
        constraints = _constraints(case, None if kind == PLANNER else kind)
        plan = plan_tables(tables, topology, constraints=constraints, **common).plan
    return plan.to_json(), predict(plan, case, kind, topology, batch)


def predict(plan, case: str, kind: str, topology, batch: int):
    """The planner's prediction of ``plan``'s step (a `ShardingPlan`) on ``topology`` (its
    profile)."""
    from shardkit.planner import estimate_plan

    stats = estimate_plan(
        plan, configs(case), topology,
        constraints=_constraints(case, None), batch_size=batch, fused_params=_fused(kind),
        module_path="ebc", dense_parameters=dense_parameters(case),
    )  # fmt: skip
    return stats.prediction


def _batches(rank: int, case: str, batch: int, count: int = 4):
    g = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(count):
        lengths, values = [], []
        for t in CASES[case]:
            spread = max(0, min(10, t.pooling - 1))
            n = torch.randint(t.pooling - spread, t.pooling + spread + 1, (batch,), generator=g)
            lengths.append(n)
            values.append(torch.randint(0, t.rows, (int(n.sum()),), generator=g))
        labels = torch.randint(0, 2, (batch,), generator=g).float()
        out.append((torch.cat(values), torch.cat(lengths), labels))
    return out


def training_step(rank: int, case: str, kind: str, plan_json: str, batch: int):
    """(the DMP model of ``case`` sharded by ``plan_json``, one training step ``step(i)`` on
    this rank's i-th batch): the step `run_rank` times."""
    from shardkit import EmbeddingBagCollection, KeyedJaggedTensor
    from shardkit.distributed import DistributedModelParallel
    from shardkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from shardkit.types import ShardingPlan

    torch.set_num_threads(1)
    tables = configs(case)
    ebc = EmbeddingBagCollection(tables=tables, device="meta", validate_ids=False)
    model = Model(ebc, sum(t.dim for t in CASES[case]))
    sharders = [EmbeddingBagCollectionSharder(fused_params=_fused(kind))]
    plan = ShardingPlan.from_json(plan_json)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders)
    opt = _Optimizers(_optimizers(dmp, torch.optim.Adagrad))  # bench_dmp's: Adam, Adagrad
    keys = [f"f{i}" for i in range(len(tables))]
    batches = [
        Batch(KeyedJaggedTensor(keys=keys, values=v, lengths=n), y)
        for v, n, y in _batches(rank, case, batch)
    ]

    def step(i: int) -> None:
        opt.zero_grad()
        loss, _ = dmp(batches[i % len(batches)])
        loss.backward()
        opt.step()

    return dmp, step


def run_rank(
    rank: int, world: int, case: str, kind: str, plan_json: str, args
) -> tuple[list[float], list[float]]:
    """(wall ms, CPU-derived ms) of each timed step; see `_record`."""
    _, step = training_step(rank, case, kind, plan_json, args.batch)
    for i in range(args.warmup):
        step(i)
    times, cpu = [], []
    for i in range(args.iters):
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        step(i)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    busiest = torch.tensor(cpu, dtype=torch.float64)
    dist.all_reduce(busiest, op=dist.ReduceOp.MAX)
    total = torch.tensor(cpu, dtype=torch.float64)
    dist.all_reduce(total)
    # What the step would take alone on the machine's cores: the busiest rank's CPU time (its
    # threads', gloo's included), or all ranks' CPU time spread over the cores they share.
    cores = min(world, _cores())
    alone = torch.maximum(busiest, total / cores)
    return [t * 1e3 for t in slowest.tolist()], [t * 1e3 for t in alone.tolist()]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def torchrec_estimate(case: str, kind: str, world: int, batch: int) -> float | None:
    """TorchRec's planner on the same tables and type: its busiest rank's estimated ms."""
    try:
        import torchrec
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
        from torchrec.distributed.planner.types import ParameterConstraints
    except ImportError:
        return None

    class AllTypesSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return super().sharding_types("cuda")

    tables = configs(case, "torchrec")
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    optimizer = EmbOptimType.EXACT_ROWWISE_ADAGRAD
    sharder = AllTypesSharder(fused_params={"optimizer": optimizer, "learning_rate": 0.01})
    types = [kind] if kind != PLANNER else None
    constraints = {
        f"t{i}": ParameterConstraints(sharding_types=types, pooling_factors=[float(t.pooling)])
        for i, t in enumerate(CASES[case])
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu", local_world_size=world),
        batch_size=batch,
        constraints=constraints,
        debug=False,
    )
    try:
        planner.plan(ebc, [sharder])
    except Exception:
        return None
    per_rank = [0.0] * world
    for option in planner._best_plan or []:
        for shard in option.shards:
            per_rank[shard.rank] += shard.perf.total
    return max(per_rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="from `shardkit bench calibrate`")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[1, 2, 4])
    # bench_dmp's variants of a type (column_wise_32, data_parallel_fused) are not types a plan
    # holds: this checks the types themselves (its data_parallel plans are FUSED replicas)
    types = [t for t in TYPES if t not in ("column_wise_32", "data_parallel_fused")]
    parser.add_argument("--types", nargs="+", default=[*types, PLANNER])
    parser.add_argument("--batch", type=int, default=1024, help="per rank")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="write the markdown report here (and .json beside it)")
    parser.add_argument(
        "--resample", action="store_true",
        help="also re-sample the profile's speed points around the measured steps and predict "
        "from that (off by default: the quiet check found it further off; see the header)",
    )  # fmt: skip
    args = parser.parse_args()
    from shardkit.planner import load_profile

    profile = load_profile(args.profile)
    load_before = os.getloadavg()

    def write(rows: dict[tuple, dict]) -> str:
        """The report of ``rows`` so far, into ``--out`` (after every run, so that a run cut
        short still leaves what it measured)."""
        report = {"args": vars(args), "machine": machine_info(), "profile": profile.to_dict()}
        report["load_average"] = {"before": load_before, "after": os.getloadavg()}
        report["profile"].pop("points", None)
        report["rows"] = [{k: v for k, v in row.items() if k != "plan"} for row in rows.values()]
        text = render(report)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
            with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
                json.dump(report, f, indent=1)
        return text

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        rows = _under_torchrun(profile, args)
        if rows is None:
            return
    else:
        rows = _spawned(profile, args, write)
    print(write(rows))


def _planned(profile, args, world: int, local: int, torchrec: bool) -> dict[tuple, dict]:
    """Every (case, type) this world allows, planned and predicted."""
    from shardkit.planner import Topology

    rows = {}
    topology = Topology.from_profile(profile, world_size=world, local_world_size=local)
    for case in args.cases:
        kinds = [k for k in args.types if world > 1 or k in [*ONE_RANK, PLANNER]]
        if local < 2:  # one rank per host: the host-level types have nothing to split over
            kinds = [
                k for k in kinds if k not in ("table_row_wise", "table_column_wise", "grid_shard")
            ]
        for kind in kinds:
            plan_json, prediction = make_plan(case, kind, world, topology, args.batch)
            row = {"case": case, "world": world, "hosts": world // local, "type": kind}
            row.update(plan=plan_json, predicted_ms=prediction.step_ms)
            row["phases"] = dict(prediction.phases)
            row["torchrec_ms"] = (
                torchrec_estimate(case, kind, world, args.batch) if torchrec else None
            )
            rows[case, world, kind] = row
        choice = rows.get((case, world, PLANNER))
        if choice is not None:  # the planner often picks what a type's constraint gives
            same = [k for (c, w, k), r in rows.items() if (c, w) == (case, world) and
                    k != PLANNER and r["plan"] == choice["plan"]]  # fmt: skip
            choice["same_plan_as"] = same[0] if same else None
    return rows


def _spawned(profile, args, write) -> dict[tuple, dict]:
    """Each case in fresh ranks of each world size on this host, contenders in turns; ``write``
    the rows after each run. With ``args.resample``, calibrate's speed points are re-sampled
    before and after each (world, case) block of a round, and each row of the block is also
    predicted from the profile re-sampled by those two samples (see
    [Note: re-sampled profile])."""
    rows: dict[tuple, dict] = {}
    for world in args.world_sizes:
        rows.update(_planned(profile, args, world, world, torchrec=True))
    blocks: dict[tuple, list[tuple]] = {}
    for key in rows:
        blocks.setdefault((key[1], key[0]), []).append(key)
    sampler = None
    if args.resample:
        from shardkit.bench import MachineSampler

        optimizers = sorted({_fused(k)["optimizer"].value for (_, _, k) in rows})
        sampler = MachineSampler(profile, optimizers=optimizers)
    last: tuple[int, dict] | None = None  # (world, the sample taken after the block before)
    try:
        for round_ in range(args.rounds):
            for (world, _), keys in blocks.items():
                before = None
                if sampler is not None:
                    same = last is not None and last[0] == world
                    before = last[1] if same else _sample(sampler, world)  # type: ignore[index]
                for key in keys:
                    _run(rows[key], key, round_, args)
                    write(rows)
                if sampler is not None:
                    after = _sample(sampler, world)
                    last = (world, after)
                    _predict_resampled(rows, keys, profile, [before, after], args)
                    write(rows)
    finally:
        if sampler is not None:
            sampler.close()
    return rows


def _sample(sampler, world: int) -> dict:
    start = time.perf_counter()
    sample = sampler.sample([world])
    print(f"re-sampled the machine at {world} rank(s) in {time.perf_counter() - start:.1f} s",
          flush=True)  # fmt: skip
    return sample


def _run(row: dict, key: tuple, round_: int, args) -> None:
    case, world, kind = key
    try:
        times = spawn(
            run_rank, world_size=world, args=(case, kind, row["plan"], args),
            backend="gloo", timeout=900, threads_per_rank=1,
        )[0]  # fmt: skip
    except RankFailedError as exc:
        row["failed"] = str(exc).splitlines()[0][:200]
        print(f"{case} {world} {kind}: failed: {row['failed']}", flush=True)
        return
    _record(row, times, round_)


def _predict_resampled(rows, keys, profile, samples, args) -> None:
    """Each row of ``keys`` measured this round: its plan's prediction from ``profile``
    re-sampled by ``samples`` (taken before and after the block), for the round just run."""
    from shardkit.bench import resampled_profile
    from shardkit.planner import Topology
    from shardkit.types import ShardingPlan

    now = resampled_profile(profile, samples)
    for key in keys:
        row = rows[key]
        if len(row.get("rounds", ())) <= len(row.get("resampled_rounds", ())):
            continue  # this round failed
        case, world, kind = key
        topology = Topology.from_profile(now, world_size=world, local_world_size=world)
        plan = ShardingPlan.from_json(row["plan"])
        ms = predict(plan, case, kind, topology, args.batch).step_ms
        row.setdefault("resampled_rounds", []).append(ms)
        print(f"          re-sampled prediction {ms:8.1f} ms", flush=True)


def _under_torchrun(profile, args) -> dict[tuple, dict] | None:
    """Launched by torchrun (several hosts): the world's ranks run every case in turn; rank 0
    returns the rows, the others None."""
    from shardkit.launch import init_from_env, shutdown

    info = init_from_env(backend="gloo", timeout=900)
    try:
        world, local = info.world_size, info.local_world_size
        rows = _planned(profile, args, world, local, torchrec=False)
        for round_ in range(args.rounds):
            for key, row in rows.items():
                case, _, kind = key
                _record(row, run_rank(info.rank, world, case, kind, row["plan"], args), round_)
        return rows if info.rank == 0 else None
    finally:
        shutdown()


def _record(row: dict, measured: tuple[list[float], list[float]], round_: int) -> None:
    """One round: its median wall step (the slower rank's), its fastest step, and the median
    of what the steps' CPU time says they would take on a machine of their own (the busiest
    rank's CPU time, or all ranks' over the cores they share: a proxy that other processes
    holding the cores do not inflate, though the memory traffic they cause still does)."""
    times, alone = measured
    row.setdefault("rounds", []).append(statistics.median(times))
    row.setdefault("cpu_rounds", []).append(statistics.median(alone))
    row["fastest_step"] = min([row.get("fastest_step", math.inf), *times])
    print(
        f"round {round_ + 1}: {row['case']:7} x{row['world']} {row['type']:18} measured "
        f"{row['rounds'][-1]:8.1f} ms (from CPU time {row['cpu_rounds'][-1]:8.1f}), "
        f"predicted {row['predicted_ms']:8.1f} ms",
        flush=True,
    )


def _load(report: dict, when: str) -> str:
    return ", ".join(f"{v:.1f}" for v in report["load_average"][when])


def _fastest_types(rows: list[dict], field: str) -> dict[tuple, tuple[str, float]]:
    """Per (case, world): the sharding type measured fastest by ``field``, and its ms."""
    best: dict[tuple, tuple[str, float]] = {}
    for row in rows:
        if row.get(field) and row["type"] != PLANNER:
            key, ms = (row["case"], row["world"]), min(row[field])
            if key not in best or ms < best[key][1]:
                best[key] = (row["type"], ms)
    return best


def render(report: dict) -> str:
    args = report["args"]
    ident = report["profile"]["identity"]
    resampled = any(row.get("resampled_rounds") for row in report["rows"])  # --resample
    lines = [
        "# Predicted vs measured DMP step (bench_predict.py)",
        "",
        f"Command: `benchmarks/bench_predict.py --profile PROFILE --rounds {args['rounds']} "
        f"--iters {args['iters']} --warmup {args['warmup']}` after `shardkit bench calibrate "
        "--out PROFILE`.",
        f"Machine: {ident.get('cpu_model')} ({ident.get('cpu_family_model')}; {ident.get('isa')};"
        f" THP {ident.get('transparent_huge_pages')}), {ident.get('cores')} cores, 1 thread per "
        f"rank, gloo, torch {ident.get('torch')}; host {report['machine']['host']}.",
        f"Load average (1, 5, 15 min) before: {_load(report, 'before')}; after: "
        f"{_load(report, 'after')} on {report['profile']['cores']} cores: "
        + (
            "a shared, loaded machine, so wall times are inflated (see alone (CPU))."
            if max(report["load_average"]["before"][1], report["load_average"]["after"][1])
            > report["profile"]["cores"]
            else "a quiet machine."
        ),
        "",
        "Measured: the fastest round's median step of the slower rank (wall ms). Alone (CPU): "
        "what the steps' CPU time says they would take with the machine to themselves: per step "
        "the busiest rank's CPU time (gloo's threads included), or all ranks' CPU time over the "
        "cores they share if more; a proxy other processes holding the cores do not inflate "
        "(the memory traffic they cause still does). Predicted: the "
        "planner's step prediction from the profile. TorchRec: its planner's estimate for the "
        "same type (the busiest rank's embedding lookups and communication; it has no dense "
        "model). "
        + (
            "Re-sampled: the same plan predicted from the profile with its speed points "
            "(memory copy, matmul, bucketing, the kernel's in-cache points, the step overhead, "
            "the collectives of the row's world size) timed again by calibrate's own code just "
            "before and after the row's block of that round (the fastest round's), everything "
            "else as calibrated: the calibrated model at the machine's speed of the moment, "
            "nothing fitted to the steps (see [Note: re-sampled profile] in "
            "shardkit/bench/_resample.py). "
            if resampled
            else ""
        )
        + 'error = predicted / measured - 1. "planner\'s choice (= T)": the planner '
        "chose the very plan of type T's row, so the two rows time one plan twice (their "
        "difference is the measurement's spread).",
        "",
        "| case | ranks (hosts) | type | measured ms (rounds) | predicted ms | error | "
        + ("re-sampled: predicted ms | its error | " if resampled else "")
        + "alone (CPU) ms | its error | TorchRec est. ms | dominant (predicted) |",
        "|---|---:|---|---|---:|---:|"
        + ("---:|---:|" if resampled else "")
        + "---:|---:|---:|---|",
    ]
    best = {field: _fastest_types(report["rows"], field) for field in ("rounds", "cpu_rounds")}
    errors, alone_errors, resampled_errors, resampled_alone = [], [], [], []
    for row in report["rows"]:
        resampled_text = resampled_error = "-"
        if not row.get("rounds"):
            measured_text, error_text = row.get("failed", "not run"), "-"
            fastest_text = fastest_error = "-"
        else:
            fastest = min(range(len(row["rounds"])), key=row["rounds"].__getitem__)
            if len(row.get("resampled_rounds", ())) > fastest:  # that round's re-sample
                now = row["resampled_rounds"][fastest]
                error = now / row["rounds"][fastest] - 1
                resampled_errors.append((abs(error), row))
                resampled_text, resampled_error = f"{now:.1f}", f"{100 * error:+.0f}%"
            cpu = min(range(len(row["cpu_rounds"])), key=row["cpu_rounds"].__getitem__)
            if len(row.get("resampled_rounds", ())) > cpu:
                error = row["resampled_rounds"][cpu] / row["cpu_rounds"][cpu] - 1
                resampled_alone.append((abs(error), row))
            measured = min(row["rounds"])
            rounds = ", ".join(f"{r:.1f}" for r in row["rounds"])
            measured_text = f"{measured:.1f} ({rounds})"
            error = row["predicted_ms"] / measured - 1
            errors.append((abs(error), row))
            error_text = f"{100 * error:+.0f}%"
            alone = min(row["cpu_rounds"])
            fastest_text = f"{alone:.1f}"
            fastest_error = f"{100 * (row['predicted_ms'] / alone - 1):+.0f}%"
            alone_errors.append((abs(row["predicted_ms"] / alone - 1), row))
        tr = row.get("torchrec_ms")
        tr_text = "-" if tr is None else f"{tr:.3g}"
        dominant = max(row["phases"].items(), key=lambda p: p[1])[0]
        kind = row["type"]
        if row.get("same_plan_as"):  # one plan timed twice: the two rows show the spread
            kind += f" (= {row['same_plan_as']})"
        lines.append(
            f"| {row['case']} | {row['world']} ({row.get('hosts', 1)}) | {kind} | "
            f"{measured_text} | "
            f"{row['predicted_ms']:.1f} | {error_text} | "
            + (f"{resampled_text} | {resampled_error} | " if resampled else "")
            + f"{fastest_text} | {fastest_error} | "
            f"{tr_text} | {dominant} |"
        )
    lines += ["", "## The planner's first choice against the fastest type measured", ""]
    lines += ["| case | ranks | measure | planner's choice ms | fastest type | its ms | ratio |"]
    lines += ["|---|---:|---|---:|---|---:|---:|"]
    for row in report["rows"]:
        key = (row["case"], row["world"])
        if row["type"] != PLANNER or not row.get("rounds"):
            continue
        for field, label in (("rounds", "wall"), ("cpu_rounds", "alone (CPU)")):
            if key not in best[field]:
                continue
            mine, (kind, theirs) = min(row[field]), best[field][key]
            lines.append(
                f"| {key[0]} | {key[1]} | {label} | {mine:.1f} | {kind} | {theirs:.1f} | "
                f"{mine / theirs:.2f} |"
            )
    for label, found in (
        ("wall", errors),
        ("wall, predicted from the profile re-sampled around the steps", resampled_errors),
        ("alone (CPU)", alone_errors),
        ("alone (CPU), predicted from the profile re-sampled around the steps", resampled_alone),
    ):
        if not found:
            continue
        within = sum(1 for e, _ in found if e <= 0.2)
        worst = max(found, key=lambda item: item[0])
        lines += [
            "",
            f"Against {label}: {within} of {len(found)} cases within 20%; largest error "
            f"{100 * worst[0]:.0f}% ({worst[1]['case']}, {worst[1]['world']} ranks, "
            f"{worst[1]['type']}).",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
