"""Where the time of a DMP step's all-to-all launches goes: wall against this thread's CPU.

    python benchmarks/dmp_a2a_split.py --rows 20000 --batch 512
    python benchmarks/dmp_a2a_split.py --micro    # one all-to-all: shardkit's call against torch's

bench_dmp.py's shardkit step (table-wise, fused row-wise Adagrad, plain loop), 2 ranks x 1
thread on gloo. Every `shardkit.comm` all-to-all launch is timed around its call into
``torch.distributed``: a blocking one (the input dist's header exchange) waits there for the
other rank and for gloo's worker thread, which a torch.profiler table counts as the
``shardkit::all_to_all_single`` label's self time (torch's ``work.wait()`` inside
``dist.all_to_all_single`` has no profiler event of its own); an asynchronous one only hands
the work over. Per step and rank: calls, wall ms, CPU ms of the calling thread.

``--micro``: the calling thread's CPU time per call of a small all-to-all (16 rows x 64) through
``torch.distributed`` and through `shardkit.comm` (blocking, asynchronous + wait, and with the
output sizes learnt from the peers), 200 calls each, the four taking turns for 5 rounds: what
shardkit's Python around the collective costs (median and range of the rounds, rank 0).
"""

from __future__ import annotations

import argparse
import time

from shardkit.bench import machine_line
from shardkit.launch import spawn


def _rank(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    import bench_dmp

    import shardkit.comm._ops as ops

    spans: dict[str, list[tuple[float, float]]] = {"blocking": [], "async": []}
    launch = ops._launch

    def timed(name, group, call, *handed):
        wall, cpu = time.perf_counter(), time.thread_time()
        work = launch(name, group, call, *handed)
        if name == "all_to_all_single":
            kind = "async" if work is not None else "blocking"
            spans[kind].append((time.perf_counter() - wall, time.thread_time() - cpu))
        return work

    def measure(step, run_args, input_wait=False) -> dict:
        for _ in range(run_args.warmup):
            step()
        for kept in spans.values():
            kept.clear()
        start = time.perf_counter()
        for _ in range(run_args.iters):
            step()
        per_step = {"step_ms": (time.perf_counter() - start) / run_args.iters * 1e3}
        for kind, kept in spans.items():
            per_step[kind] = [
                len(kept) / run_args.iters,
                sum(w for w, _ in kept) / run_args.iters * 1e3,
                sum(c for _, c in kept) / run_args.iters * 1e3,
            ]
        return per_step

    ops._launch = timed  # type: ignore[assignment]
    bench_dmp._time = measure
    return bench_dmp.run_shardkit(
        rank, world_size, args, ("table_wise", "rowwise_adagrad"), "plain"
    )


def _micro(rank: int, world_size: int) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    from shardkit import comm

    x, out, splits = torch.randn(16, 64), torch.empty(16, 64), [8, 8]
    calls = {
        "torch.distributed": lambda: dist.all_to_all_single(out, x, splits, splits),
        "shardkit.comm": lambda: comm.all_to_all_single(
            x, input_split_sizes=splits, output_split_sizes=splits
        ),
        "shardkit.comm async + wait": lambda: comm.all_to_all_single(
            x, input_split_sizes=splits, output_split_sizes=splits, async_op=True
        ).wait(),  # type: ignore[union-attr]
        "shardkit.comm, sizes learnt": lambda: comm.all_to_all_single(x, input_split_sizes=splits),
    }
    us: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(20):
            call()
    for _ in range(5):
        for name, call in calls.items():
            dist.barrier()
            cpu = time.thread_time()
            for _ in range(200):
                call()
            us[name].append((time.thread_time() - cpu) / 200 * 1e6)
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--micro", action="store_true", help="one all-to-all, per call")
    cli = parser.parse_args()
    if cli.micro:
        import statistics

        us = spawn(_micro, world_size=2, backend="gloo", threads_per_rank=1)[0]
        print(machine_line(threads=1))
        for name, rounds in us.items():
            print(f"{name:28} {statistics.median(rounds):6.0f} us CPU/call "
                  f"(rounds {min(rounds):.0f}-{max(rounds):.0f})")  # fmt: skip
        return
    args = argparse.Namespace(world_size=2, threads=1, tables=8, rows=cli.rows, dim=64,
                              batch=cli.batch, ids_per_bag=20, warmup=3, iters=cli.iters,
                              distinct_batches=4, device="cpu", profile=0)  # fmt: skip
    results = spawn(lambda r, w: _rank(r, w, args), world_size=2, backend="gloo",
                    threads_per_rank=1, timeout=900)  # fmt: skip
    print(machine_line(threads=1))
    for rank, res in enumerate(results):
        (nb, wb, cb), (na, wa, ca) = res["blocking"], res["async"]
        print(f"rank {rank}: step {res['step_ms']:.1f} ms; blocking {nb:.0f} call(s) {wb:.2f} ms "
              f"wall {cb:.2f} ms CPU; async {na:.0f} call(s) {wa:.2f} ms wall {ca:.2f} ms CPU")  # fmt: skip


if __name__ == "__main__":
    main()
