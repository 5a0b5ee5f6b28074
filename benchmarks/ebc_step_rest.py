"""The EBC step beyond its two compiled kernels ("the rest"), two shardkit trees interleaved.

    nice -n 19 .venv/bin/python benchmarks/ebc_step_rest.py --before /tmp/main --after . \
        --dim 16 --mode real --rounds 6 --block 15

Each tree runs in its own long-lived process (``PYTHONPATH=<tree>``); the two take turns running
``--block`` steps, ``--rounds`` times, the order swapped every round. A step is bench_ebc's base
point with fused row-wise Adagrad (4 tables x 100,000 rows, batch 2,048, 10-30 ids per bag,
uniform ids, the id range check on) and its loss ``(pooled * weights).sum().backward()``, on a
new KeyedJaggedTensor every step. ``--mode real`` times the two operator calls inside the step
(thread CPU time): rest = step - kernels. ``--mode stub`` replaces them by a ready tensor and a
no-op: the step is then the rest alone. Prints one JSON line (see
benchmarks/results/ebc_step_rest_zen3.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TABLES, ROWS, BATCH = 4, 100_000, 2048


def _timed(op, total: list[float]):
    """``op``, adding the thread CPU seconds of each call to ``total[0]``."""

    def call(*args):
        start = time.thread_time()
        try:
            return op(*args)
        finally:
            total[0] += time.thread_time() - start

    return call


def worker(dim: int, mode: str) -> None:
    """Run steps as asked on stdin (one number of steps a line); print their times."""
    import torch

    from shardkit.kernels import use_kernel
    from shardkit.modules import EmbeddingBagCollection
    from shardkit.modules.embedding_configs import EmbeddingBagConfig
    from shardkit.optim import EmbOptimType
    from shardkit.sparse import KeyedJaggedTensor

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    keys = [f"f{t}" for t in range(TABLES)]
    batches = []
    for _ in range(4):
        lengths = torch.randint(10, 31, (TABLES * BATCH,), generator=g)
        batches.append((torch.randint(0, ROWS, (int(lengths.sum()),), generator=g), lengths))
    configs = [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=dim, num_embeddings=ROWS,
                           feature_names=[f"f{t}"])
        for t in range(TABLES)
    ]  # fmt: skip
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}
    ebc = EmbeddingBagCollection(tables=configs, fused_params=fused)
    weights = torch.randn(BATCH, TABLES * dim)

    def step(i: int) -> None:
        values, lengths = batches[i % len(batches)]
        kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
        (ebc(kjt).values() * weights).sum().backward()

    kernel_s = [0.0]
    with use_kernel("compiled"):
        step(0)  # loads the operators
        if mode == "stub":
            ready = torch.randn(BATCH * TABLES, dim)
            torch.ops.shardkit.pooled_forward = lambda *a: ready.clone()
            torch.ops.shardkit.fused_backward = lambda *a: None
        else:
            for name in ("pooled_forward", "fused_backward"):
                setattr(
                    torch.ops.shardkit, name, _timed(getattr(torch.ops.shardkit, name), kernel_s)
                )
        done = 1
        for _ in range(5):
            step(done)
            done += 1
        print("ready", flush=True)
        for line in sys.stdin:
            rows = []
            for _ in range(int(line)):
                kernel_s[0] = 0.0
                start = time.thread_time()
                step(done)
                rows.append([(time.thread_time() - start) * 1e6, kernel_s[0] * 1e6])
                done += 1
            print(json.dumps(rows), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the first shardkit tree (a checkout)")
    parser.add_argument("--after", required=True, help="the second shardkit tree")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--mode", choices=("real", "stub"), default="real")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=15, help="steps per turn")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.dim, args.mode)
        return
    trees = {"before": args.before, "after": args.after}
    procs = {}
    for name, tree in trees.items():
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--before", "-",
                   "--after", "-", "--dim", str(args.dim), "--mode", args.mode]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        procs[name] = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
    for proc in procs.values():
        assert proc.stdout is not None and proc.stdin is not None
        while proc.stdout.readline().strip() != "ready":
            pass
    rows: dict[str, list[list[float]]] = {name: [] for name in trees}
    rest_per_round: dict[str, list[float]] = {name: [] for name in trees}
    for turn in range(args.rounds):
        for name in list(trees) if turn % 2 == 0 else list(reversed(trees)):
            proc = procs[name]
            assert proc.stdout is not None and proc.stdin is not None
            proc.stdin.write(f"{args.block}\n")
            proc.stdin.flush()
            block = json.loads(proc.stdout.readline())
            rows[name] += block
            rest_per_round[name].append(statistics.median(t - k for t, k in block))
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    out: dict[str, object] = {"dim": args.dim, "mode": args.mode, "rounds": args.rounds,
                              "block": args.block, "load": os.getloadavg()}  # fmt: skip
    for name, steps in rows.items():
        out[name] = {
            "step_ms": round(statistics.median(t for t, _ in steps) / 1e3, 3),
            "rest_ms": round(statistics.median(t - k for t, k in steps) / 1e3, 3),
            "kernels_ms": round(statistics.median(k for _, k in steps) / 1e3, 3),
        }
    ratios = [b / a for a, b in zip(rest_per_round["before"], rest_per_round["after"])]
    out["rest_ratio_per_round"] = [round(r, 3) for r in ratios]
    out["rest_ratio_median"] = round(statistics.median(ratios), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
