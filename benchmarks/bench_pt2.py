"""Training step time under `torch.compile` against eager, on one thread: an EBC and a DLRM.

    python benchmarks/bench_pt2.py --out benchmarks/results/pt2.md

Contenders, each a fresh copy of one model (same seed, same weights):
- eager: the module as is;
- compiled: ``torch.compile(module, fullgraph=True, dynamic=True)`` (Inductor); its tables are
  one operator each (see [Note: collections under torch.compile]), so what Inductor can speed
  up is the dense part around them.

Models: an EmbeddingBagCollection of ``--tables`` tables of ``--rows`` x ``--dim`` (one feature
each, bags of 1-``--ids`` ids), its pooled output summed into the loss; a DLRM over the same
tables (dense arch 13 -> 512 -> 256 -> dim, over arch 512 -> 256 -> 1, DLRM's pairwise
interaction); and, for each of ``--dmp-types``, that DLRM under DistributedModelParallel on 2
ranks x 1 thread (gloo), the whole DMP model compiled (the sharded collection runs eagerly
between the compiled graphs: [Note: sharded collections under torch.compile]), ``--batch``
examples per rank. Tables trained with fused row-wise Adagrad, the DLRM's dense layers with SGD (in
the step). A step is forward, backward and the optimizer; the time is its median over
``--steps`` steps after ``--warmup`` (the compile happens in the warm-up, and is reported on
its own). Contenders take turns in ``--rounds`` rounds; the ratio compiled/eager is given per
round and as the median with its range.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.bench import machine_info
from shardkit.launch import spawn
from shardkit.models import DLRM

NUM_DENSE = 13


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--ids", type=int, default=8, help="at most this many ids per bag")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="ebc,dlrm")
    parser.add_argument("--dmp-types", default="row_wise,table_wise",
                        help="sharding types of the DMP rows ('' for none)")  # fmt: skip
    parser.add_argument("--kernel", default="auto", help="SHARDKIT_KERNEL for the tables")
    parser.add_argument("--out", help="write a markdown report here (and .json beside it)")
    return parser.parse_args(argv)


def _ebc(args: argparse.Namespace) -> EmbeddingBagCollection:
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=args.rows,
                                 feature_names=[f"f{i}"]) for i in range(args.tables)]  # fmt: skip
    fused = {"optimizer": "exact_rowwise_adagrad", "learning_rate": 0.01}
    return EmbeddingBagCollection(tables=tables, fused_params=fused)


class _EBCLoss(torch.nn.Module):
    def __init__(self, ebc: EmbeddingBagCollection) -> None:
        super().__init__()
        self.ebc = ebc

    def forward(self, dense: torch.Tensor, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(kjt).values().square().mean()


class _DLRMLoss(torch.nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.dlrm = DLRM(_ebc(args), NUM_DENSE, [512, 256, args.dim], [512, 256, 1])

    def forward(self, dense: torch.Tensor, kjt: KeyedJaggedTensor) -> torch.Tensor:
        logits = self.dlrm(dense, kjt).squeeze(1)
        labels = (dense[:, 0] > 0).float()
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)


def _batches(args: argparse.Namespace, count: int) -> list[tuple[torch.Tensor, KeyedJaggedTensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        lengths = torch.randint(1, args.ids + 1, (args.tables * args.batch,), generator=g)
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
        keys = [f"f{i}" for i in range(args.tables)]
        out.append((torch.randn(args.batch, NUM_DENSE, generator=g),
                    KeyedJaggedTensor(keys, values, lengths=lengths)))  # fmt: skip
    return out


def _step_fn(module: torch.nn.Module, runner):  # type: ignore[no-untyped-def]
    dense_params = [p for n, p in module.named_parameters() if "embedding_bags" not in n]
    optimizer = torch.optim.SGD(dense_params, lr=0.01) if dense_params else None

    def step(dense: torch.Tensor, kjt: KeyedJaggedTensor) -> None:
        loss = runner(dense, kjt)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()

    return step


def _time(step, batches, count: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for i in range(count):
        dense, kjt = batches[i % len(batches)]
        start = time.perf_counter()
        step(dense, kjt)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _contest(args: argparse.Namespace, steps: dict, batches: list) -> dict:
    """Compile (timed), warm up, then rounds in which eager and compiled take turns."""
    start = time.perf_counter()
    _time(steps["compiled"], batches, 1)
    compile_s = time.perf_counter() - start
    for contender in steps.values():
        _time(contender, batches, args.warmup)
    rounds = []
    for _ in range(args.rounds):
        rounds.append({c: _time(steps[c], batches, args.steps) for c in ("eager", "compiled")})
    ratios = [r["compiled"] / r["eager"] for r in rounds]
    return {
        "eager_ms": [r["eager"] * 1e3 for r in rounds],
        "compiled_ms": [r["compiled"] * 1e3 for r in rounds],
        "ratio_median": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "compile_s": compile_s,
    }


def _dmp_rank(rank: int, world_size: int, args: argparse.Namespace, kind: str) -> dict:
    from shardkit.distributed import DistributedModelParallel
    from shardkit.sharding import (
        EmbeddingBagCollectionSharder,
        construct_module_sharding_plan,
        row_wise,
        table_wise,
    )
    from shardkit.types import ShardingPlan

    torch.set_num_threads(1)
    fused = {"optimizer": "exact_rowwise_adagrad", "learning_rate": 0.01}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = _DLRMLoss(args)
        ebc = model.dlrm.sparse_arch.embedding_bag_collection
        gens = {f"t{i}": table_wise(rank=i % world_size) if kind == "table_wise" else row_wise()
                for i in range(args.tables)}  # fmt: skip
        plan = construct_module_sharding_plan(ebc, gens, world_size=world_size, device_type="cpu")
        plan = ShardingPlan({"dlrm.sparse_arch.embedding_bag_collection": plan})
        models.append(DistributedModelParallel(model, plan=plan, sharders=sharders))
    eager, compiled = models
    runner = torch.compile(compiled, dynamic=True)
    steps = {"eager": _step_fn(eager, eager), "compiled": _step_fn(compiled, runner)}
    return _contest(args, steps, _batches(args, 8))


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    os.environ.setdefault("SHARDKIT_KERNEL", args.kernel)
    batches = _batches(args, 8)
    results = {}
    for name in filter(None, args.models.split(",")):
        torch.manual_seed(0)
        eager = _EBCLoss(_ebc(args)) if name == "ebc" else _DLRMLoss(args)
        compiled = copy.deepcopy(eager)
        runner = torch.compile(compiled, fullgraph=True, dynamic=True)
        steps = {"eager": _step_fn(eager, eager), "compiled": _step_fn(compiled, runner)}
        results[name] = _contest(args, steps, batches)
    for kind in filter(None, args.dmp_types.split(",")):
        ranks = spawn(lambda r, w, k=kind: _dmp_rank(r, w, args, k), world_size=2, timeout=1800,
                      threads_per_rank=1)  # fmt: skip
        results[f"dlrm, DMP 2 ranks, {kind}"] = ranks[0]
    return results


def report(args: argparse.Namespace, results: dict) -> str:
    machine = machine_info()
    lines = [
        "# torch.compile against eager: training step on one thread",
        "",
        f"Command: `python benchmarks/bench_pt2.py {' '.join(sys.argv[1:])}`",
        f"Machine: {json.dumps(machine)}",
        f"torch {torch.__version__}; tables {args.tables} x {args.rows} rows x dim {args.dim}, "
        f"batch {args.batch}, 1-{args.ids} ids per bag, fused row-wise Adagrad; "
        f"{args.rounds} rounds of {args.steps} steps (median), contenders in turn.",
        "",
        "| model | eager ms/step (per round) | compiled ms/step (per round) | compiled / eager "
        "(median, range) | compile s |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        eager = ", ".join(f"{t:.2f}" for t in r["eager_ms"])
        compiled = ", ".join(f"{t:.2f}" for t in r["compiled_ms"])
        low, high = r["ratio_range"]
        lines.append(f"| {name} | {eager} | {compiled} | {r['ratio_median']:.2f}x "
                     f"({low:.2f}-{high:.2f}) | {r['compile_s']:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    results = run(args)
    text = report(args, results)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"args": vars(args), "results": results, "machine": machine_info()}, f,
                      indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
