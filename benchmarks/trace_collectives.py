"""The collectives a DMP training step issues, timed in the step and alone, beside what the
profile's link model predicts for the same calls (issue 29: which term of a prediction is off).

    python benchmarks/trace_collectives.py --profile P --case small --world-size 4 \
        --types table_wise row_wise data_parallel

For each sharding type, fresh gloo ranks (one thread each) build bench_predict's model and
plan, warm up, then time ``--steps`` steps with every collective made synchronous and timed
(``shardkit.comm``'s ops, the reduce-scatter's local sum included, and DDP's all-reduce
through a comm hook); then they replay the same calls back to back, each after a barrier (the
collective alone, all ranks ready), the fastest of ``--repeats``. Per call it prints: kind,
bytes (the link model's convention: all-to-all what a rank sends, reduce-scatter its input,
all-gather its output, all-reduce the tensor), ms in the step (the slowest rank's median),
ms alone, and the profile's ``collective_ms``. The step's sum of those shows what the
collectives cost in the step against the model's output/input/all-reduce phases.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _kind(op) -> str:
    return {
        "AllToAll": "all_to_all",
        "AllGather": "all_gather",
        "ReduceScatter": "reduce_scatter",
        "AllReduce": "all_reduce",
        "Broadcast": "broadcast",
        "Reduce": "reduce",
    }[type(op).__name__]


class _Recorder:
    """Patches `shardkit.comm`'s ops to run synchronously and records (op, input, ms)."""

    def __init__(self) -> None:
        from shardkit.comm import _ops

        self.ops = _ops
        self.calls: list[tuple] = []
        self.depth = 0
        self.on = False
        self.originals = {}
        for cls in (_ops.AllToAll, _ops.AllGather, _ops.ReduceScatter, _ops.AllReduce):
            self.originals[cls] = cls.launch
            cls.launch = self._wrap(cls.launch)

    def _wrap(self, original):
        recorder = self

        def launch(op, x, async_op=True, **kwargs):
            if recorder.depth or not recorder.on:
                return original(op, x, async_op, **kwargs)
            recorder.depth += 1
            try:
                faults = _faults()
                start = time.perf_counter()
                result = original(op, x, False, **kwargs).finish()
                ms = (time.perf_counter() - start) * 1e3
                faults = _faults() - faults
            finally:
                recorder.depth -= 1
            nbytes = x.numel() * x.element_size()
            if _kind(op) == "all_gather":
                nbytes = result.numel() * result.element_size()
            recorder.calls.append((op, tuple(x.shape), x.dtype, nbytes, ms, faults))
            return recorder.ops.Launched(op.name, op.group, None, result, None)

        return launch


def _faults() -> int:
    """Minor page faults of this process so far (a page mapped fresh: 4 KiB zeroed)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _ddp_hook(recorder: _Recorder):
    def hook(state, bucket):
        buffer = bucket.buffer()
        start = time.perf_counter()
        dist.all_reduce(buffer)
        buffer.div_(dist.get_world_size())
        ms = (time.perf_counter() - start) * 1e3
        if recorder.on:
            op = recorder.ops.AllReduce(None, dist.ReduceOp.SUM, inplace=True)
            nbytes = buffer.numel() * buffer.element_size()
            recorder.calls.append((op, tuple(buffer.shape), buffer.dtype, nbytes, ms, 0))
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(buffer)
        return future

    return hook


def trace_rank(rank: int, world: int, case: str, kind: str, plan_json: str, args) -> dict:
    from bench_predict import training_step
    from torch.nn.parallel import DistributedDataParallel

    recorder = _Recorder()
    dmp, step = training_step(rank, case, kind, plan_json, args.batch)
    wrapped = dmp._dmp_wrapped_module
    if isinstance(wrapped, DistributedDataParallel):
        wrapped.register_comm_hook(None, _ddp_hook(recorder))
    for i in range(args.warmup):
        step(i)
    plain, step_faults = [], []
    for i in range(args.steps):  # untouched: the step as the benchmark times it
        dist.barrier()
        faults = _faults()
        start = time.perf_counter()
        step(i)
        plain.append((time.perf_counter() - start) * 1e3)
        step_faults.append(_faults() - faults)
    traced, per_step = [], []
    recorder.on = True
    for i in range(args.steps):
        dist.barrier()
        recorder.calls = []
        start = time.perf_counter()
        step(i)
        traced.append((time.perf_counter() - start) * 1e3)
        per_step.append(recorder.calls)
    recorder.on = False
    calls = per_step[0]
    in_step = [statistics.median(s[j][4] for s in per_step) for j in range(len(calls))]
    alone = []
    for op, shape, dtype, *_ in calls:  # each call again, all ranks ready, fastest repeat
        x = torch.ones(shape, dtype=dtype)
        best = float("inf")
        for _ in range(args.repeats):
            dist.barrier()
            start = time.perf_counter()
            recorder.originals[type(op)](op, x.clone(), False).finish()
            best = min(best, (time.perf_counter() - start) * 1e3)
        alone.append(best)
    back_to_back = float("inf")
    for _ in range(args.repeats):  # the whole sequence, no barriers between calls
        dist.barrier()
        start = time.perf_counter()
        for op, shape, dtype, *_ in calls:
            recorder.originals[type(op)](op, torch.ones(shape, dtype=dtype), False).finish()
        back_to_back = min(back_to_back, (time.perf_counter() - start) * 1e3)
    worst = torch.tensor(
        [
            statistics.median(plain),
            statistics.median(traced),
            back_to_back,
            *in_step,
            *alone,
            min(step_faults),
            *(min(s[j][5] for s in per_step) for j in range(len(calls))),
        ],
        dtype=torch.float64,
    )
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    values = worst.tolist()
    n = len(calls)
    return {
        "step_ms": values[0],
        "traced_step_ms": values[1],
        "back_to_back_ms": values[2],
        "step_faults": values[3 + 2 * n],
        "calls": [
            {"kind": _kind(op), "bytes": nbytes, "group": dist.get_world_size(op.group),
             "in_step_ms": values[3 + j], "alone_ms": values[3 + n + j],
             "faults": values[4 + 2 * n + j]}
            for j, (op, _, _, nbytes, *_) in enumerate(calls)
        ],
    }  # fmt: skip


def main() -> None:
    from bench_predict import make_plan

    from shardkit.launch import spawn
    from shardkit.planner import Topology, load_profile
    from shardkit.planner._profile import collective_ms

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--case", default="small")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--types", nargs="+", default=["table_wise", "row_wise", "data_parallel"])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    profile = load_profile(args.profile)
    world = args.world_size
    topology = Topology.from_profile(profile, world_size=world, local_world_size=world)
    print(f"load average before: {os.getloadavg()}", flush=True)
    for kind in args.types:
        plan_json, prediction = make_plan(args.case, kind, world, topology, args.batch)
        result = spawn(
            trace_rank, world_size=world, args=(args.case, kind, plan_json, args),
            backend="gloo", timeout=900, threads_per_rank=1,
        )[0]  # fmt: skip
        phases = ", ".join(f"{k} {v:.1f}" for k, v in prediction.phases)
        print(f"\n## {args.case} x{world} {kind}: predicted {prediction.step_ms:.1f} ({phases})")
        print(
            f"step {result['step_ms']:.1f} ms untraced, {result['traced_step_ms']:.1f} traced; "
            f"its collectives back to back alone {result['back_to_back_ms']:.1f} ms; the step "
            f"faults {result['step_faults'] * 4 / 1024:.1f} MiB of fresh pages (busiest rank)"
        )
        print("| kind | group | bytes | in step ms | alone ms | model ms | fresh MiB |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        sums = [0.0, 0.0, 0.0]
        for call in result["calls"]:
            model = collective_ms(
                call["kind"], call["bytes"], world_size=call["group"],
                local_world_size=world, profile=profile,
            )  # fmt: skip
            sums = [sums[0] + call["in_step_ms"], sums[1] + call["alone_ms"], sums[2] + model]
            print(
                f"| {call['kind']} | {call['group']} | {call['bytes']:,} | "
                f"{call['in_step_ms']:.2f} | {call['alone_ms']:.2f} | {model:.2f} | "
                f"{call['faults'] * 4 / 1024:.1f} |"
            )
        print(f"| sum ({len(result['calls'])} calls) | | | {sums[0]:.1f} | {sums[1]:.1f} | "
              f"{sums[2]:.1f} |", flush=True)  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
