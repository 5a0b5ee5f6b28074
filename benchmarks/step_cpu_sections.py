"""Where a DMP step's CPU time goes, per part, for sharding types side by side (issue 29: which
term of a prediction is short).

    nice -n 19 .venv/bin/python benchmarks/step_cpu_sections.py --profile P --case skewed \
        --world 4 --types table_wise row_wise

Fresh gloo ranks (one thread each) build bench_predict's model and plan, warm up, then time
``--steps`` steps with every collective made synchronous. Each part's process CPU time (all
threads: the backend's included) is taken exclusive of the parts called inside it: the
kernels, the row bucketing, the input distribution's pieces, each collective (by kind and
size class), the output distribution and assembly, DDP's all-reduce, and the rest (dense
layers, autograd, the modules' Python). CPU time, not wall: other processes on a shared
machine inflate it less (their memory traffic still does), so loaded runs can compare types.
Prints per part the mean over ranks of each rank's median step, beside the prediction.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collections import defaultdict

import torch
import torch.distributed as dist

SEC = defaultdict(float)
STACK = []  # [label, start, child_time]


def enter(label):
    STACK.append([label, time.process_time(), 0.0])


def leave():
    label, start, child = STACK.pop()
    total = time.process_time() - start
    SEC[label] += total - child
    if STACK:
        STACK[-1][2] += total


def timed(fn, label):
    def f(*a, **k):
        enter(label)
        try:
            return fn(*a, **k)
        finally:
            leave()

    f._orig = fn
    return f


def patch_everywhere(obj, label):
    w = timed(obj, label)
    for name, mod in list(sys.modules.items()):
        if not name.startswith("shardkit") or mod is None:
            continue
        for attr, val in list(vars(mod).items()):
            if val is obj:
                setattr(mod, attr, w)


def patch():
    import shardkit.distributed, shardkit.sharding  # noqa
    from shardkit import kernels
    from shardkit.modules import kernel_input
    from shardkit.sharding._dist import _input, _output, _assemble, _unpack, _source, _row_buckets

    for obj, label in [
        (kernels.pooled_forward, "kernel_fwd"),
        (kernels.fused_backward, "kernel_bwd"),
        (_row_buckets.bucket_rows, "bucket_rows"),
        (kernel_input, "kernel_input"),
        (_input._payload, "input payload"),
        (_input.exchange_start, "input exchange_start"),
        (_unpack.unpack, "input unpack"),
        (_source.source_batch, "source_batch"),
        (_output.distribute, "output distribute"),
        (_assemble.assemble, "assemble"),
    ]:
        patch_everywhere(obj, label)
    from shardkit.comm import _ops

    names = {
        "AllToAll": "a2a",
        "AllGather": "all_gather",
        "ReduceScatter": "reduce_scatter",
        "AllReduce": "all_reduce",
    }
    for cls_name, label in names.items():
        cls = getattr(_ops, cls_name)
        orig = cls.launch

        def launch(op, x, async_op=True, _orig=orig, _label=label, **kw):
            nb = x.numel() * x.element_size()  # size class: the next power of 2 KiB
            enter(f"{_label} <={1 << max(0, (max(nb, 1) - 1).bit_length() - 10)}K")
            try:
                res = _orig(op, x, False, **kw)
                out = res.finish()
            finally:
                leave()
            return _ops.Launched(op.name, op.group, None, out, None)

        cls.launch = launch


def rank_fn(rank, world, case, kind, plan_json, steps):
    from bench_predict import training_step

    patch()
    dmp, step = training_step(rank, case, kind, plan_json, 1024)
    from torch.nn.parallel import DistributedDataParallel

    w = dmp._dmp_wrapped_module
    if isinstance(w, DistributedDataParallel):

        def hook(state, bucket):
            buf = bucket.buffer()
            enter("ddp_all_reduce")
            dist.all_reduce(buf)
            buf.div_(dist.get_world_size())
            leave()
            fut = torch.futures.Future()
            fut.set_result(buf)
            return fut

        w.register_comm_hook(None, hook)
    for i in range(3):
        step(i)
    per = []
    for i in range(steps):
        dist.barrier()
        SEC.clear()
        enter("rest")
        step(i)
        leave()
        d = {k: v * 1e3 for k, v in SEC.items()}
        d["step"] = sum(d.values())
        per.append(d)
    keys = sorted({k for p in per for k in p})
    return {k: statistics.median(p.get(k, 0.0) for p in per) for k in keys}


def main():
    from bench_predict import make_plan

    from shardkit.launch import spawn
    from shardkit.planner import Topology, load_profile

    p = argparse.ArgumentParser()
    p.add_argument("--profile", required=True)
    p.add_argument("--case", default="skewed")
    p.add_argument("--types", nargs="+", default=["table_wise", "row_wise"])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    prof = load_profile(a.profile)
    topo = Topology.from_profile(prof, world_size=a.world, local_world_size=a.world)
    print("load", os.getloadavg())
    allres = {}
    for kind in a.types:
        plan_json, pred = make_plan(a.case, kind, a.world, topo, 1024)
        res = spawn(
            rank_fn,
            world_size=a.world,
            args=(a.case, kind, plan_json, a.steps),
            backend="gloo",
            timeout=900,
            threads_per_rank=1,
        )
        allres[kind] = res
        print(
            f"\n## {a.case} x{a.world} {kind}: predicted {pred.step_ms:.1f} "
            + ", ".join(f"{k} {v:.1f}" for k, v in pred.phases)
        )
    keys = sorted({k for res in allres.values() for r in res for k in r})
    print(
        "section".ljust(26)
        + "".join(f"{k[:12]:>14}" for k in allres)
        + "   (mean over ranks, ms CPU per step)"
    )
    for k in keys:
        print(
            k.ljust(26)
            + "".join(
                f"{statistics.mean(r.get(k, 0.0) for r in res):14.2f}" for res in allres.values()
            )
        )
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
