"""Does the kernel's pooled-output layout cost what calibrate does not time? (issue 29)

One thread: one kernel group of K shards (25,000 rows x 64 columns each, fused row-wise
Adagrad), 4,096 examples x 5 ids per bag in each, forward and forward + backward with the
fused update, timed three ways in turns, round after round (thread CPU time):

- ``group key-major``: ``lookup`` without ``batch_size``, bags (slot, example) as the sharded
  modules call it (`shardkit/sharding/_collection/_embeddingbag.py`);
- ``group example-major``: ``lookup(..., batch_size=B)``, ``[B, K x D]``, as the unsharded
  EmbeddingBagCollection and the data-parallel replicas call it;
- ``one table``: one table of K x 25,000 rows, the same ids and bags, as calibrate's points are.

    python benchmarks/kernel_layout.py --tables 2 8 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from shardkit.bench import machine_info
from shardkit.modules import lookup, stack_tables
from shardkit.optim import EmbOptimType, FusedOptimizerConfig

ROWS, DIM, BATCH, POOLING = 25_000, 64, 4096, 5


def run(k: int, rounds: int) -> None:
    rule = FusedOptimizerConfig(optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01)
    g = torch.Generator().manual_seed(0)
    group = stack_tables([ROWS] * k, DIM, dtype=torch.float32, device="cpu", optimizer=rule)
    single = stack_tables([ROWS * k], DIM, dtype=torch.float32, device="cpu", optimizer=rule)
    for tables in (group, single):
        tables.weight.uniform_(-0.01, 0.01)
    group_params = [torch.nn.Parameter(v) for v in group.table_views()]
    single_params = [torch.nn.Parameter(v) for v in single.table_views()]
    bags = k * BATCH
    offsets = torch.arange(0, bags * POOLING + 1, POOLING)

    def group_ids() -> torch.Tensor:  # slot s's bags read rows [s R, (s + 1) R)
        ids = torch.randint(0, ROWS, (k, BATCH * POOLING), generator=g)
        return (ids + torch.arange(k)[:, None] * ROWS).reshape(-1)

    def single_ids() -> torch.Tensor:
        return torch.randint(0, ROWS * k, (bags * POOLING,), generator=g)

    key_grad, example_grad = torch.full((bags, DIM), 1e-3), torch.full((BATCH, k * DIM), 1e-3)
    calls = {
        "group key-major": lambda: lookup(group, group_ids(), offsets, None, group_params),
        "group example-major": lambda: lookup(
            group, group_ids(), offsets, None, group_params, batch_size=BATCH
        ),
        "one table": lambda: lookup(single, single_ids(), offsets, None, single_params),
    }
    grads = {"group key-major": key_grad, "group example-major": example_grad,
             "one table": key_grad}  # fmt: skip
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in calls}
    for r in range(rounds + 1):  # the first round warms up
        for name, call in calls.items():
            with torch.no_grad():
                start = time.thread_time()
                call()
                forward = time.thread_time() - start
            start = time.thread_time()
            call().backward(grads[name])
            both = time.thread_time() - start
            if r:
                times[name][0].append(forward * 1e3)
                times[name][1].append(both * 1e3)
    base = statistics.median(times["one table"][1])
    for name, (forward, both) in times.items():
        print(
            f"| {k} | {name} | {statistics.median(forward):.2f} ({min(forward):.2f}-"
            f"{max(forward):.2f}) | {statistics.median(both):.2f} ({min(both):.2f}-"
            f"{max(both):.2f}) | {statistics.median(both) / base:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_info())
    print("| K | layout | forward ms, median (range) | forward + backward ms | vs one table |")
    print("|---:|---|---:|---:|---:|")
    for k in args.tables:
        run(k, args.rounds)


if __name__ == "__main__":
    main()
