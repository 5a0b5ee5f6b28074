"""What recording every collective (the flight recorder behind the late-rank reports) costs.

    python benchmarks/bench_recorder.py --out benchmarks/results/recorder.md

Two pools of 2 ranks on gloo stay up side by side: one started as `spawn` starts ranks (with the
`Watchdog`: every collective numbered and recorded, a watchdog thread per rank), one with
``watchdog=None``. Rounds alternate between them (and which goes first), and each round times, in
every rank, (1) a loop of small blocking all-reduces (torch.distributed, [4] float32), (2) a loop
of small asynchronous shardkit.comm all-to-alls, and (3) a DistributedModelParallel training step
(bench_dmp.py's model: row-wise tables, fused row-wise Adagrad, Adam for the MLP). Reported: the
median over rounds of each round's median (the slowest rank's), the rounds' range, and the
recorder's cost as a share of each. Two pools of 1 rank do the same for the all-reduce loop:
there a collective is a local copy, so the recorder's own cost per call stands out of the noise
of a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from bench_dmp import Batch, Model, _optimizers, make_batches

from shardkit import comm
from shardkit.bench import machine_info, machine_line
from shardkit.launch import RankPool, Watchdog

# The model, data and step of one pool's rank, built in its first round and kept for the others.
_STEP: dict[str, object] = {}


def _build_step(rank: int, world_size: int, args):
    from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from shardkit.distributed import DistributedModelParallel
    from shardkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from shardkit.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from shardkit.optim import EmbOptimType

    tables = [
        EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{t}"]
        )
        for t in range(args.tables)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device="meta", validate_ids=False)
    model = Model(ebc, args.tables * args.dim)
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    only = {f"t{t}": ParameterConstraints(sharding_types=[args.type]) for t in range(args.tables)}
    topology = Topology(world_size=world_size, compute_device="cpu", local_world_size=world_size)
    planner = EmbeddingShardingPlanner(topology=topology, constraints=only)
    dmp = DistributedModelParallel(
        model, plan=planner.collective_plan(model, sharders, dist.group.WORLD), sharders=sharders
    )
    optimizers = _optimizers(dmp, lambda name, p: ".shards." in name)
    keys = [f"f{t}" for t in range(args.tables)]
    batches = [
        Batch(KeyedJaggedTensor(keys=keys, values=b["values"], lengths=b["lengths"]), b["labels"])
        for b in make_batches(rank, args)
    ]
    state = {"i": 0}

    def step() -> None:
        for opt in optimizers:
            opt.zero_grad()
        loss, _ = dmp(batches[state["i"] % len(batches)])
        state["i"] += 1
        loss.backward()
        for opt in optimizers:
            opt.step()

    return step


def _slowest_median(times: list[float]) -> float:
    """The median over repeats of the slowest rank's time, in microseconds."""
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist()) * 1e6


def _timed(fn, repeats: int, per: int) -> float:
    fn()  # warm-up: the first calls of a round are several times slower
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / per)
    return _slowest_median(times)


def run_round(rank: int, world_size: int, args) -> dict:
    torch.set_num_threads(1)
    small = torch.ones(4)

    def all_reduces() -> None:
        for _ in range(args.calls):
            dist.all_reduce(small)

    if world_size == 1:
        return {"all_reduce_us": _timed(all_reduces, args.repeats, args.calls)}
    if "step" not in _STEP:
        _STEP["step"] = _build_step(rank, world_size, args)
        for _ in range(args.warmup):
            _STEP["step"]()
    step = _STEP["step"]
    rows = torch.ones(2 * world_size, 4)

    def all_to_alls() -> None:
        for _ in range(args.calls):
            comm.all_to_all_single(rows, async_op=True).wait()

    return {
        "all_reduce_us": _timed(all_reduces, args.repeats, args.calls),
        "all_to_all_us": _timed(all_to_alls, args.repeats, args.calls),
        "dmp_step_us": _timed(step, args.iters, 1),
        "collectives_per_step": _count_collectives(step),
    }


def _count_collectives(step) -> int:
    """How many torch.distributed collectives one DMP step issues (wrapping them for one step)."""
    names = ["all_reduce", "all_to_all_single", "all_gather_single", "reduce_scatter_single",
             "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier"]  # fmt: skip
    count = [0]
    originals = {name: getattr(dist, name) for name in names}

    def counting(fn):
        def call(*a, **k):
            count[0] += 1
            return fn(*a, **k)

        return call

    for name, fn in originals.items():
        setattr(dist, name, counting(fn))
    try:
        step()
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return count[0]


METRICS = [
    ("all_reduce_us", "small all-reduce (torch.distributed, [4] float32, blocking)", "µs/call"),
    (
        "one_rank_all_reduce_us",
        "the same on 1 rank (a local copy: the recorder's own cost)",
        "µs/call",
    ),
    ("all_to_all_us", "small all-to-all (shardkit.comm, async + wait)", "µs/call"),
    ("dmp_step_us", "DMP training step", "µs/step"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024, help="per rank")
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--distinct-batches", type=int, default=4)
    parser.add_argument("--type", default="row_wise", help="sharding type of every table")
    parser.add_argument("--warmup", type=int, default=5, help="DMP steps before the first round")
    parser.add_argument("--iters", type=int, default=20, help="DMP steps per round")
    parser.add_argument("--calls", type=int, default=200, help="small collectives per repeat")
    parser.add_argument("--repeats", type=int, default=10, help="timed loops per round")
    parser.add_argument("--rounds", type=int, default=6, help="turns each pool takes")
    parser.add_argument("--out", help="write the markdown report here (and .json beside it)")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"recorded": [], "not recorded": []}
    start_load = os.getloadavg()[0]
    for world_size in (args.world_size, 1):
        _take_turns(world_size, args, results)
    args.load = [round(start_load, 1), round(os.getloadavg()[0], 1)]
    report = render(results, args)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            rows = summarize(results)
            json.dump({"args": vars(args), "machine": machine_info(), "rows": rows}, f, indent=1)


def _take_turns(world_size: int, args, results: dict[str, list[dict]]) -> None:
    """Rounds on a recording pool and a plain one, alternating which goes first; 1-rank rounds
    add their all-reduce time to the same rounds' results as ``one_rank_all_reduce_us``."""
    with (
        RankPool(world_size, backend="gloo", threads_per_rank=1, watchdog=Watchdog()) as on,
        RankPool(world_size, backend="gloo", threads_per_rank=1, watchdog=None) as off,
    ):
        pools = [("recorded", on), ("not recorded", off)]
        for round_ in range(args.rounds):
            for name, pool in pools if round_ % 2 == 0 else pools[::-1]:
                result = pool.run(run_round, args)[0]
                if world_size == 1:
                    results[name][round_]["one_rank_all_reduce_us"] = result["all_reduce_us"]
                else:
                    results[name].append(result)
                print(f"{world_size} rank(s), round {round_ + 1}, {name}: {result}", flush=True)


def summarize(results: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for key, what, unit in METRICS:
        on = [r[key] for r in results["recorded"]]
        off = [r[key] for r in results["not recorded"]]
        # Each round's ratio pairs runs minutes apart at most; their median is the estimate.
        ratios = [a / b - 1 for a, b in zip(on, off)]
        rows.append(
            {
                "what": what,
                "unit": unit,
                "recorded": statistics.median(on),
                "not_recorded": statistics.median(off),
                "recorded_rounds": on,
                "not_recorded_rounds": off,
                "overhead": statistics.median(ratios),
                "overhead_rounds": ratios,
            }
        )
    per_step = {r["collectives_per_step"] for r in results["recorded"]}
    rows.append({"what": "collectives per DMP step", "count": sorted(per_step)})
    return rows


def render(results: dict[str, list[dict]], args) -> str:
    rows = summarize(results)
    lines = [
        "# The flight recorder's cost (bench_recorder.py)",
        "",
        f"{args.world_size} ranks on gloo, 1 thread each; two pools side by side, one recording "
        f"every collective (`Watchdog()`, as `spawn` starts ranks) and one not "
        f"(`watchdog=None`), taking turns in {args.rounds} rounds. Small collectives: median of "
        f"{args.repeats} loops of {args.calls} calls; DMP step: {args.tables} tables x "
        f"{args.rows:,} x {args.dim}, {args.type}, batch {args.batch} per rank, median of "
        f"{args.iters} steps. Times are the slowest rank's; overhead is the median of the rounds' "
        "ratios, with their range.",
        f"Machine: {machine_line()}; {json.dumps(machine_info())}",
        "",
        "| what | unit | recorded | not recorded | overhead | rounds' overhead |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows[:-1]:
        spread = f"{min(row['overhead_rounds']):+.1%} to {max(row['overhead_rounds']):+.1%}"
        lines.append(
            f"| {row['what']} | {row['unit']} | {row['recorded']:,.1f} | "
            f"{row['not_recorded']:,.1f} | {row['overhead']:+.1%} | {spread} |"
        )
    per_call = rows[1]["recorded"] - rows[1]["not_recorded"]
    count = max(rows[-1]["count"])
    step = rows[3]["not_recorded"]
    lines += [
        "",
        f"Collectives per DMP step: {rows[-1]['count']}. The recorder's own cost, from the 1-rank "
        f"row: {per_call:.1f} µs per collective, so {count} x {per_call:.1f} = "
        f"{count * per_call:.1f} µs per DMP step, {count * per_call / step:.3%} of the step "
        f"measured here. Load average (1 min) at the start and the end: {args.load}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
