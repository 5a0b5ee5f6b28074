"""The first training step of a new table: 2 MiB pages advised at allocation vs at the first lookup.

    python benchmarks/bench_huge_pages_first_step.py                   # 1 x 1M x 64, 3 rounds
    python benchmarks/bench_huge_pages_first_step.py --rows 4000000 --rounds 5

Each contender builds a fresh EmbeddingBagCollection (row-wise Adagrad fused, compiled kernel),
initialises it, then runs two steps (forward, loss = sum(pooled * fixed weights), backward with
the fused update) on the same batch. Contenders take turns in rounds:

- ``at allocation``: the default since [Note: huge pages from the first write]: the table is
  advised when allocated, so its initialisation faults in 2 MiB pages;
- ``at first lookup``: the advice switched off while the table is allocated and initialised and
  on again before the first step, which is what the kernel alone did before: it collapses the
  written table onto 2 MiB pages (a copy) inside the first step;
- ``off``: no advice (4 KiB pages throughout).

Reported per contender (median over rounds): the initialisation's ms, the first and second
step's ms (wall, and the thread's CPU time, which a loaded machine inflates less), and the share of the table's bytes on 2 MiB pages (``/proc/self/smaps``
AnonHugePages) after initialisation and after the first step. The first step minus the second
is the stall the first lookup pays.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.bench import machine_line
from shardkit.kernels import huge_page_bytes, kernel_path, set_huge_pages, use_kernel
from shardkit.optim import EmbOptimType

CONTENDERS = ("at allocation", "at first lookup", "off")


def one_run(contender: str, args: argparse.Namespace, batch: KeyedJaggedTensor) -> dict:
    """Build, initialise and take two steps with one contender; its times and page shares."""
    config = EmbeddingBagConfig(
        name="t0", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=["f0"]
    )
    before = set_huge_pages(contender == "at allocation")
    ebc = EmbeddingBagCollection(
        tables=[config],
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01},
        device=torch.device("meta"),
    )
    start, cpu = time.perf_counter(), time.thread_time()
    ebc.to_empty(device="cpu")  # allocation (with or without the advice) ...
    ebc.reset_parameters()  # ... and the first write
    init_ms, init_cpu = 1e3 * (time.perf_counter() - start), 1e3 * (time.thread_time() - cpu)
    set_huge_pages(contender != "off")
    weight = ebc.embedding_bags["t0"].weight
    share_init = huge_page_bytes(weight) / weight.nbytes
    weights = torch.rand(args.batch, args.dim, generator=torch.Generator().manual_seed(1))
    steps, cpus = [], []
    for _ in range(2):
        start, cpu = time.perf_counter(), time.thread_time()
        with use_kernel("compiled"):
            (ebc(batch).values() * weights).sum().backward()
        steps.append(1e3 * (time.perf_counter() - start))
        cpus.append(1e3 * (time.thread_time() - cpu))
        if len(steps) == 1:
            share_step = huge_page_bytes(weight) / weight.nbytes
    set_huge_pages(before)
    return {"init": init_ms, "first": steps[0], "second": steps[1], "init cpu": init_cpu,
            "first cpu": cpus[0], "second cpu": cpus[1], "huge after init": share_init,
            "huge after step 1": share_step}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    kernel_path()  # (builds or loads the compiled kernel before anything is timed)
    g = torch.Generator().manual_seed(0)
    lengths = torch.full((args.batch,), args.ids_per_bag)
    values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
    batch = KeyedJaggedTensor(keys=["f0"], values=values, lengths=lengths)
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    for _ in range(args.rounds):
        for contender in CONTENDERS:
            runs[contender].append(one_run(contender, args, batch))
            gc.collect()
    mib = args.rows * args.dim * 4 / 2**20
    print(f"Machine: {machine_line()}")
    print(f"1 x {args.rows} x {args.dim} fp32 ({mib:.0f} MiB), batch {args.batch}, "
          f"{args.ids_per_bag} ids per bag, row-wise Adagrad, compiled, 1 thread, "
          f"median of {args.rounds} rounds")  # fmt: skip
    print("| advice | init ms | step 1 ms | step 2 ms | init + step 1 ms | init CPU ms | "
          "step 1 CPU ms | step 2 CPU ms | 2 MiB pages after init | after step 1 |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for contender, rows in runs.items():
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        total = statistics.median(r["init"] + r["first"] for r in rows)
        print(f"| {contender} | {med['init']:.1f} | {med['first']:.1f} | {med['second']:.1f} | "
              f"{total:.1f} | {med['init cpu']:.1f} | {med['first cpu']:.1f} | "
              f"{med['second cpu']:.1f} | {med['huge after init']:.0%} | "
              f"{med['huge after step 1']:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
