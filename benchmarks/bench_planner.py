"""Planner speed and plan quality, side by side with TorchRec's planner when it is importable.

    .venv/bin/python benchmarks/bench_planner.py --out benchmarks/results/planner.json
    # with TorchRec (install nothing in the shared venv: put this checkout first on the path)
    PYTHONPATH=$PWD ~/.cache/shardkit-peers/venv/bin/python benchmarks/bench_planner.py \
        --out benchmarks/results/planner_vs_torchrec.json

Speed: 10 / 100 / 1,000 synthetic tables on 8 / 128 / 1,024 ranks (hosts of 8 GPUs), planned
from table configs (no module, no memory, no processes), best of ``--repeats``.

Quality: the 26 tables of the Criteo Terabyte DLRM (row counts of TorchRec's DLRM example,
dim 128, one id per feature) and 1,000 synthetic tables with skewed sizes and pooling factors.
Both planners get the same topology, batch size, pooling factors and the fused kernel only
(TorchRec's UVM and key-value kernels have no shardkit counterpart); each plan is scored by
shardkit's estimator: max/mean of per-rank cost and memory, and the max per-rank cost (the step
time the model predicts).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import torch

from shardkit.bench import machine_info, machine_line
from shardkit.modules import EmbeddingBagConfig
from shardkit.planner import (
    EmbeddingComputeKernel,
    EnumerableShardingSpec,
    ParameterConstraints,
    PlannerError,
    ShardMetadata,
    Topology,
    estimate_plan,
    plan_tables,
)
from shardkit.types import ParameterSharding, ShardingPlan

# TorchRec's DLRM example (torchrec/examples/dlrm, --num_embeddings_per_feature for Criteo 1TB).
CRITEO_TB_ROWS = [
    45833188,
    36746,
    17245,
    7413,
    20243,
    3,
    7114,
    1441,
    62,
    29275261,
    1572176,
    345138,
    10,
    2209,
    11267,
    128,
    4,
    974,
    14,
    48937457,
    11316796,
    40094537,
    452104,
    12606,
    104,
    35,
]
BATCH_SIZE = 512
LOCAL_WORLD_SIZE = 8
# TorchRec's proposers stop after this long and its best plan so far is scored (its own knob).
TORCHREC_TIMEOUT_S = 120


def criteo_tables() -> tuple[list[EmbeddingBagConfig], dict[str, ParameterConstraints]]:
    tables = [
        EmbeddingBagConfig(
            name=f"cat_{i}", num_embeddings=rows, embedding_dim=128, feature_names=[f"cat_{i}"]
        )
        for i, rows in enumerate(CRITEO_TB_ROWS)
    ]
    return tables, {t.name: ParameterConstraints(pooling_factors=[1.0]) for t in tables}


def synthetic_tables(
    count: int, seed: int = 0
) -> tuple[list[EmbeddingBagConfig], dict[str, ParameterConstraints]]:
    """Skewed: rows log-uniform in [100, 2M], dims 16-256, pooling factors log-normal (median
    ~3, a few hundred at the tail)."""
    rng = random.Random(seed)
    tables, constraints = [], {}
    for i in range(count):
        rows = int(10 ** rng.uniform(2, 6.3))
        dim = rng.choice([16, 32, 64, 64, 128, 128, 256])
        pooling = round(min(300.0, rng.lognormvariate(1.1, 1.2)), 2)
        tables.append(
            EmbeddingBagConfig(
                name=f"t{i}", num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"]
            )
        )
        constraints[f"t{i}"] = ParameterConstraints(pooling_factors=[pooling])
    return tables, constraints


def topology(world_size: int) -> Topology:
    return Topology(
        world_size=world_size,
        compute_device="cuda",
        local_world_size=min(LOCAL_WORLD_SIZE, world_size),
    )


def speed(repeats: int) -> list[dict]:
    rows = []
    for num_tables in (10, 100, 1000):
        tables, constraints = synthetic_tables(num_tables)
        for world_size in (8, 128, 1024):
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                result = plan_tables(
                    tables, topology(world_size), constraints=constraints, batch_size=BATCH_SIZE
                )
                times.append(time.perf_counter() - start)
            row = {
                "tables": num_tables,
                "ranks": world_size,
                "best_s": min(times),
                "median_s": statistics.median(times),
                "proposals": result.stats.num_proposals,
                "cost_imbalance": result.stats.cost_imbalance,
                "memory_imbalance": result.stats.memory_imbalance,
            }
            print(
                f"speed {num_tables:5d} tables x {world_size:5d} ranks: {min(times):7.3f} s "
                f"(median {row['median_s']:.3f}), cost imbalance {row['cost_imbalance']:.3f}"
            )
            rows.append(row)
    return rows


def million_shards() -> dict:
    """Worst case for the plan's size: 1,000 tables forced row-wise on 1,024 ranks."""
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", num_embeddings=10_000 + 37 * i, embedding_dim=16, feature_names=[f"f{i}"]
        )
        for i in range(1000)
    ]
    constraints = {t.name: ParameterConstraints(sharding_types=["row_wise"]) for t in tables}
    start = time.perf_counter()
    result = plan_tables(tables, topology(1024), constraints=constraints, batch_size=64)
    planned = time.perf_counter()
    text = result.plan.to_json()
    written = time.perf_counter()
    ShardingPlan.from_json(text)
    read = time.perf_counter()
    row = {
        "shards": sum(len(t.ranks) for t in result.stats.tables),
        "plan_s": planned - start,
        "to_json_s": written - planned,
        "from_json_s": read - written,
        "json_mb": len(text) / 1e6,
    }
    print(
        f"million shards: plan {row['plan_s']:.2f} s, to_json {row['to_json_s']:.2f} s, "
        f"from_json {row['from_json_s']:.2f} s ({row['json_mb']:.0f} MB)"
    )
    return row


def quality(name: str, tables, constraints, world_size: int, with_torchrec: bool) -> dict:
    topo = topology(world_size)
    row: dict = {"case": name, "tables": len(tables), "ranks": world_size}
    start = time.perf_counter()
    try:
        ours = plan_tables(tables, topo, constraints=constraints, batch_size=BATCH_SIZE)
    except PlannerError as exc:
        row["shardkit"] = {"error": str(exc).splitlines()[0]}
        print(f"quality {name} on {world_size}: shardkit: {row['shardkit']['error']}")
        return row
    row["shardkit"] = _score(ours.stats, time.perf_counter() - start, ours.plan)
    if with_torchrec:
        row["torchrec"] = _torchrec(tables, constraints, topo)
    print(
        f"quality {name} on {world_size} ranks: "
        + "; ".join(
            f"{who} cost max/mean {r['cost_imbalance']:.3f} mem max/mean {r['memory_imbalance']:.3f} "
            f"max cost {r['max_cost_ms']:.3f} ms ({r['seconds']:.2f} s)"
            if "error" not in r
            else f"{who}: {r['error']}"
            for who, r in row.items()
            if isinstance(r, dict)
        )
    )
    return row


def _score(stats, seconds: float, plan: ShardingPlan) -> dict:
    types: dict[str, int] = {}
    for module in plan.plan.values():
        for sharding in module.values():
            types[sharding.sharding_type.value] = types.get(sharding.sharding_type.value, 0) + 1
    return {
        "seconds": seconds,
        "max_cost_ms": stats.max_cost,
        "mean_cost_ms": sum(r.cost for r in stats.ranks) / len(stats.ranks),
        "cost_imbalance": stats.cost_imbalance,
        "max_memory_gib": stats.max_memory / 1024**3,
        "memory_imbalance": stats.memory_imbalance,
        "fits": stats.max_memory <= stats.available,
        "sharding_types": dict(sorted(types.items())),
    }


def _torchrec(tables, constraints, topo: Topology) -> dict:
    """TorchRec's plan for the same tables, translated and scored by shardkit's estimator."""
    import torchrec
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner import Topology as TRTopology
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.planner.types import ParameterConstraints as TRConstraints

    ebc = torchrec.EmbeddingBagCollection(
        tables=[
            torchrec.EmbeddingBagConfig(
                name=t.name,
                num_embeddings=t.num_embeddings,
                embedding_dim=t.embedding_dim,
                feature_names=list(t.feature_names),
            )
            for t in tables
        ],
        device=torch.device("meta"),
    )
    tr_constraints = {
        name: TRConstraints(
            pooling_factors=list(c.pooling_factors), compute_kernels=["fused", "dense"]
        )
        for name, c in constraints.items()
    }
    planner = EmbeddingShardingPlanner(
        topology=TRTopology(
            world_size=topo.world_size,
            compute_device=topo.compute_device,
            local_world_size=topo.local_world_size,
            hbm_cap=topo.hbm_cap,
        ),
        batch_size=BATCH_SIZE,
        constraints=tr_constraints,
        storage_reservation=HeuristicalStorageReservation(percentage=0.15),
        debug=False,
        timeout_seconds=TORCHREC_TIMEOUT_S,
    )
    start = time.perf_counter()
    try:
        theirs = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    except Exception as exc:  # TorchRec's own failure, reported as such
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    seconds = time.perf_counter() - start
    plan = _translate(theirs)
    stats = estimate_plan(plan, tables, topo, constraints=constraints, batch_size=BATCH_SIZE)
    return _score(stats, seconds, plan)


def _translate(theirs) -> ShardingPlan:
    modules = {}
    for path, module_plan in theirs.plan.items():
        tables = {}
        for name, ps in module_plan.items():
            spec = None
            if ps.sharding_spec is not None:
                spec = EnumerableShardingSpec(
                    [
                        ShardMetadata(list(s.shard_offsets), list(s.shard_sizes), str(s.placement))
                        for s in ps.sharding_spec.shards
                    ]
                )
            kernel = EmbeddingComputeKernel.parse(ps.compute_kernel)
            tables[name] = ParameterSharding(ps.sharding_type, kernel, ps.ranks, spec)
        modules[path] = tables
    return ShardingPlan(modules)


NOTES = [
    "## Reading the numbers",
    "",
    "- Both plans are scored by shardkit's estimator, the one shardkit's planner minimises: a "
    "home advantage. TorchRec minimises its own (FBGEMM block penalties, a different "
    "communication model), so its plans are the best *it* can see, not the best here.",
    "- The gap on the synthetic set comes from row-wise and table-row-wise layouts: their "
    "shards reduce-scatter partial sums for every bag of the global batch, which across hosts "
    "(12.5 GB/s) costs more, in this model, than table-wise all-to-alls. TorchRec picks them "
    "to balance memory; its memory max/mean (about 1.05) beats shardkit's (1.7 to 4), whose "
    "plans trade memory balance for step time while staying well under each rank's memory.",
    "- TorchRec ran with `compute_kernels=['fused', 'dense']` (no UVM or key-value kernels, "
    "which shardkit lacks) and `timeout_seconds=120` for its proposers; its planning time "
    "includes enumeration, which the timeout does not bound. Its row-wise layouts (ceil splits) "
    "are scored as they are.",
    "- Criteo: 26 tables of equal cost (one id per feature); greedy placement leaves two of 8 "
    "ranks with 4 tables (TorchRec's 1.231 = 4 / 3.25); shardkit's local search splits a few "
    "tables column-wise to even the ranks out.",
]


def markdown(report: dict) -> str:
    """The report as Markdown tables."""
    m = report["machine"]
    lines = [
        "# Planner speed and plan quality",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {machine_line(m)}, shared; Python "
        f"{m['python']}, torch {m['torch']}, torchrec {m['torchrec']}; {m['date']}.  ",
        f"Batch size {report['batch_size']} per rank, hosts of {report['local_world_size']} "
        "ranks, compute device cuda (32 GiB HBM, TorchRec's default bandwidths), fused kernel.",
        "",
    ]
    if "speed" in report:
        lines += [
            "## Speed (plan_tables on synthetic tables, seconds, best / median)",
            "",
            "| tables | 8 ranks | 128 ranks | 1,024 ranks |",
            "|---:|---:|---:|---:|",
        ]
        for count in (10, 100, 1000):
            cells = [
                f"{r['best_s']:.3f} / {r['median_s']:.3f}"
                for r in report["speed"]
                if r["tables"] == count
            ]
            lines.append(f"| {count:,} | " + " | ".join(cells) + " |")
        lines.append("")
    if "million_shards" in report:
        r = report["million_shards"]
        lines += [
            f"Worst case for the plan's size, 1,000 tables forced row-wise on 1,024 ranks "
            f"({r['shards']:,} shards): planned in {r['plan_s']:.2f} s, to_json "
            f"{r['to_json_s']:.2f} s, from_json {r['from_json_s']:.2f} s ({r['json_mb']:.0f} MB).",
            "",
        ]
    lines += [
        "## Quality (both plans scored by shardkit's estimator)",
        "",
        "Max cost: the busiest rank's estimated ms per step. Imbalance: max / mean over ranks.",
        "",
        "| case | ranks | planner | max cost (ms) | cost imbalance | max memory (GiB) | "
        "memory imbalance | planning time (s) | sharding types |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["quality"]:
        for who in ("shardkit", "torchrec"):
            r = row.get(who)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {row['case']} | {row['ranks']} | {who} | {r['error']} |||||")
                continue
            types = ", ".join(f"{k} {v}" for k, v in r["sharding_types"].items())
            lines.append(
                f"| {row['case']} | {row['ranks']} | {who} | {r['max_cost_ms']:.3f} | "
                f"{r['cost_imbalance']:.3f} | {r['max_memory_gib']:.2f} | "
                f"{r['memory_imbalance']:.3f} | {r['seconds']:.2f} | {types} |"
            )
    return "\n".join([*lines, "", *NOTES]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the report (JSON) here")
    parser.add_argument("--markdown", help="also write the report as Markdown here")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--no-torchrec", action="store_true", help="do not run TorchRec's planner")
    args = parser.parse_args()
    try:
        import torchrec  # noqa: F401

        with_torchrec = not args.no_torchrec
    except ImportError:
        with_torchrec = False
        print("torchrec is not importable: shardkit's side only")
    command = " ".join([sys.executable, *sys.argv])
    if os.environ.get("PYTHONPATH"):
        command = f"PYTHONPATH={os.environ['PYTHONPATH']} {command}"
    report = {
        "command": command,
        "machine": machine_info(),
        "batch_size": BATCH_SIZE,
        "local_world_size": LOCAL_WORLD_SIZE,
    }
    if not args.skip_speed:
        report["speed"] = speed(args.repeats)
        report["million_shards"] = million_shards()
    criteo, criteo_constraints = criteo_tables()
    synthetic, synthetic_constraints = synthetic_tables(1000)
    report["quality"] = [
        quality("criteo_tb_26", criteo, criteo_constraints, ranks, with_torchrec)
        for ranks in (8, 16, 64)
    ] + [
        quality("synthetic_1000", synthetic, synthetic_constraints, ranks, with_torchrec)
        for ranks in (8, 64, 128)
    ]
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))
        print(f"wrote {args.markdown}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                report, f, indent=1, default=lambda v: None if v != v or v in (math.inf,) else v
            )
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
