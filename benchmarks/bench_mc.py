"""Managed collision against ``id % num_embeddings``: collisions and AUC at equal table size.

    python benchmarks/bench_mc.py --out benchmarks/results/mc.md

Data (synthetic, generated here): two sparse features, "user" and "item", each a vocabulary of
``--vocab`` ids whose popularity follows a power law (Zipf, exponent ``--zipf``); the k-th most
popular id of a feature is a random 40-bit integer (ids drawn from [0, 2**40), as hashed user
ids or strings are). Each id has a hidden effect ~ N(0, 1); an example's label is drawn with
probability sigmoid(effect(user) + effect(item) - 1): the signal a model learns is the ids' own
rows. With ``--drift D`` the popularity ranking shifts D ranks per training step (new ids keep
arriving, old ones fade); each value given is its own scenario.

Contenders, each a table of ``--rows`` rows per feature (dim ``--dim``), summed into one logit
by a linear layer; trained for ``--steps`` steps of ``--batch`` examples (tables: fused
row-wise Adagrad; the linear layer: Adam), then evaluated on ``--eval`` new examples:
- modulo: row = raw id % rows (what shardkit train's Criteo ``--id-mapping modulo`` does);
- mc-lfu, mc-lru, mc-distance-lfu: ManagedCollisionEmbeddingBagCollection, MCHManagedCollision
  Module with that eviction policy, evicting every ``--eviction-interval`` steps;
- exact (the ceiling): a row for every id of the vocabulary (``--vocab`` rows, more memory).

Reported per contender: the share of the evaluation's lookups whose row is shared with another
id (of all ids seen in training or evaluation), the share of those distinct ids that own a row,
AUC and log loss on the evaluation examples (and the AUC of the true probabilities, the best
any model can do), and training ms/step. Seeds run the contenders in turn; mean and range are
given. AUC varies more between seeds (data sets) than between contenders, so each run is also
compared with modulo and exact on its own data: the AUC gain over modulo, and the share of the
modulo-to-exact gap it closes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.bench import machine_info, machine_line
from shardkit.metrics import auc_score
from shardkit.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from shardkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from shardkit.optim import EmbOptimType

FEATURES = ("user", "item")
CONTENDERS = ("modulo", "mc-lfu", "mc-lru", "mc-distance-lfu", "exact")
SUMMARY_KEYS = (
    "collided_lookups", "ids_with_own_row", "auc", "auc_over_modulo", "gap_closed", "log_loss",
    "best_auc", "ms_per_step",
)  # fmt: skip
POLICIES = {
    "mc-lfu": LFU_EvictionPolicy,
    "mc-lru": LRU_EvictionPolicy,
    "mc-distance-lfu": DistanceLFU_EvictionPolicy,
}


@dataclass
class World:
    """The synthetic data of one seed: per feature, raw ids by popularity rank and effects."""

    raw: dict[str, torch.Tensor]  # [V] 40-bit raw id of the rank-k id
    effect: dict[str, torch.Tensor]  # [V] hidden effect of the rank-k id
    cdf: torch.Tensor  # [V] cumulative Zipf popularity of ranks 0..k
    generator: torch.Generator

    @classmethod
    def make(cls, args: argparse.Namespace, seed: int) -> World:
        g = torch.Generator().manual_seed(seed)
        ranks = torch.arange(1, args.vocab + 1, dtype=torch.float64)
        raw = {f: torch.randint(0, 2**40, (args.vocab,), generator=g) for f in FEATURES}
        effect = {f: torch.randn(args.vocab, generator=g) for f in FEATURES}
        probs = ranks.pow(-args.zipf)
        return cls(raw, effect, torch.cumsum(probs / probs.sum(), 0), g)

    def batch(
        self, size: int, step: int, drift: int
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(``{feature: [size] vocabulary index}``, ``[size]`` labels) at training step ``step``."""
        index, logit = {}, torch.full((size,), -1.0)
        vocab = self.cdf.numel()
        for feature in FEATURES:
            u = torch.rand(size, generator=self.generator, dtype=torch.float64)
            rank = torch.searchsorted(self.cdf, u).clamp_(max=vocab - 1)
            index[feature] = (rank + step * drift) % vocab
            logit += self.effect[feature][index[feature]]
        labels = torch.bernoulli(torch.sigmoid(logit), generator=self.generator)
        return index, labels

    def true_probability(self, index: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.sigmoid(sum(self.effect[f][index[f]] for f in FEATURES) - 1.0)


def _kjt(values: dict[str, torch.Tensor]) -> KeyedJaggedTensor:
    size = values[FEATURES[0]].numel()
    return KeyedJaggedTensor(
        keys=list(FEATURES),
        values=torch.cat([values[f] for f in FEATURES]),
        lengths=torch.ones(size * len(FEATURES), dtype=torch.int64),
    )


class Model(nn.Module):
    """Tables (plain, or behind managed collision) -> one logit."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        super().__init__()
        self.name = name
        rows = args.vocab if name == "exact" else args.rows
        tables = [
            EmbeddingBagConfig(name=f"t_{f}", embedding_dim=args.dim, num_embeddings=rows,
                               feature_names=[f])
            for f in FEATURES
        ]  # fmt: skip
        fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": args.table_lr}
        ebc = EmbeddingBagCollection(tables=tables, fused_params=fused)
        self.sparse: nn.Module = ebc
        if name in POLICIES:
            modules = {
                c.name: MCHManagedCollisionModule(
                    rows, "cpu", POLICIES[name](), args.eviction_interval, name=c.name
                )
                for c in tables
            }
            self.sparse = ManagedCollisionEmbeddingBagCollection(
                ebc, ManagedCollisionCollection(modules, tables)
            )
        self.head = nn.Linear(len(FEATURES) * args.dim, 1)

    def ids(self, world: World, index: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What this contender's tables take: vocabulary index, raw id, or raw id % rows."""
        if self.name == "exact":
            return index
        raw = {f: world.raw[f][index[f]] for f in FEATURES}
        if self.name == "modulo":
            return {f: raw[f] % self.rows() for f in FEATURES}
        return raw

    def rows(self) -> int:
        ebc = self.sparse if isinstance(self.sparse, EmbeddingBagCollection) else self.sparse._embedding_module  # fmt: skip
        return ebc.embedding_bag_configs()[0].num_embeddings

    def table_rows(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """``[F * B]`` the row each lookup reads (eval mode: no state change)."""
        if isinstance(self.sparse, ManagedCollisionEmbeddingBagCollection):
            return self.sparse._managed_collision_collection(kjt).values()
        return kjt.values()

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.sparse(kjt)
        pooled = pooled[0] if isinstance(pooled, tuple) else pooled
        return self.head(pooled.values()).squeeze(1)


def train(model: Model, world: World, args: argparse.Namespace) -> tuple[float, dict]:
    """Train for ``args.steps``; returns (ms per step, ``{feature: vocabulary indices seen}``)."""
    optimizer = torch.optim.Adam(model.head.parameters(), lr=args.dense_lr)
    model.train()
    seen: dict[str, list[torch.Tensor]] = {f: [] for f in FEATURES}
    start = time.perf_counter()
    for step in range(args.steps):
        index, labels = world.batch(args.batch, step, args.drift)
        for feature in FEATURES:
            seen[feature].append(index[feature])
        logits = model(_kjt(model.ids(world, index)))
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ms = (time.perf_counter() - start) / args.steps * 1e3
    return ms, {f: torch.unique(torch.cat(v)) for f, v in seen.items()}


@torch.no_grad()
def evaluate(model: Model, world: World, seen: dict[str, torch.Tensor], args) -> dict:
    """AUC, log loss and collisions on ``args.eval`` new examples (drawn as at the last step)."""
    model.eval()
    index, labels = world.batch(args.eval, args.steps, args.drift)
    kjt = _kjt(model.ids(world, index))
    logits = model(kjt)
    shared, owned = collisions(model, world, index, seen)
    return {
        "auc": auc_score(logits, labels),
        "log_loss": float(F.binary_cross_entropy_with_logits(logits, labels)),
        "best_auc": auc_score(world.true_probability(index), labels),
        "collided_lookups": shared,
        "ids_with_own_row": owned,
    }


def collisions(model: Model, world: World, index: dict, seen: dict) -> tuple[float, float]:
    """(share of the evaluation's lookups in a row that another id also maps to, share of the
    distinct ids (seen in training or evaluation) that own their row)."""
    shared_lookups, owned, total_ids = 0, 0, 0
    for feature in FEATURES:
        universe = torch.unique(torch.cat([seen[feature], index[feature]]))  # vocabulary index
        rows = model.table_rows(_single(model, world, feature, universe))
        _, inverse, counts = torch.unique(rows, return_inverse=True, return_counts=True)
        alone = counts[inverse] == 1  # [U] this id's row is its own
        owned, total_ids = owned + int(alone.sum()), total_ids + universe.numel()
        position = torch.searchsorted(universe, index[feature])
        shared_lookups += int((~alone[position]).sum())
    return shared_lookups / (len(FEATURES) * index[FEATURES[0]].numel()), owned / total_ids


def _single(model: Model, world: World, feature: str, universe: torch.Tensor) -> KeyedJaggedTensor:
    """A KJT with ``universe`` in ``feature`` and nothing in the other features."""
    ids = model.ids(world, {f: universe if f == feature else universe[:0] for f in FEATURES})
    values = torch.cat([ids[f] for f in FEATURES])
    lengths = torch.cat([
        (torch.ones if f == feature else torch.zeros)(universe.numel(), dtype=torch.int64)
        for f in FEATURES
    ])  # fmt: skip
    return KeyedJaggedTensor(keys=list(FEATURES), values=values, lengths=lengths)


def run_seed(seed: int, drift: int, args: argparse.Namespace) -> list[dict]:
    args = argparse.Namespace(**{**vars(args), "drift": drift})
    rows = []
    for name in args.contenders:
        world = World.make(args, seed)  # every contender sees the same data stream
        torch.manual_seed(seed)
        model = Model(name, args)
        ms, seen = train(model, world, args)
        result = {"drift": drift, "seed": seed, "contender": name, "ms_per_step": ms,
                  **evaluate(model, world, seen, args)}  # fmt: skip
        print(json.dumps(result), flush=True)
        rows.append(result)
    return rows


def _paired(rows: list[dict]) -> None:
    """Add each run's AUC gain over modulo on the same data, and the share of the gap between
    modulo and exact that it closes (seeds differ more than contenders: compare within one)."""
    by_run = {(r["drift"], r["seed"], r["contender"]): r["auc"] for r in rows}
    for r in rows:
        base = by_run.get((r["drift"], r["seed"], "modulo"))
        ceiling = by_run.get((r["drift"], r["seed"], "exact"))
        r["auc_over_modulo"] = r["auc"] - base if base is not None else float("nan")
        gap = (ceiling - base) if base is not None and ceiling is not None else float("nan")
        r["gap_closed"] = r["auc_over_modulo"] / gap if gap == gap and gap != 0 else float("nan")


def summarise(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    _paired(rows)
    out = []
    for drift, name in ((d, n) for d in args.drift for n in args.contenders):
        mine = [r for r in rows if r["contender"] == name and r["drift"] == drift]
        entry = {"drift": drift, "contender": name}
        for key in SUMMARY_KEYS:
            values = [r[key] for r in mine]
            entry[key] = {"mean": statistics.mean(values), "min": min(values), "max": max(values)}
        out.append(entry)
    return out


def render(summary: list[dict], args: argparse.Namespace) -> str:
    def cell(entry: dict, key: str, fmt: str) -> str:
        v = entry[key]
        if len(args.seeds) == 1:
            return format(v["mean"], fmt)
        return f"{format(v['mean'], fmt)} ({format(v['min'], fmt)} to {format(v['max'], fmt)})"

    lines = [
        "# Managed collision vs modulo hashing (bench_mc.py)",
        "",
        f"Command: `python benchmarks/bench_mc.py {' '.join(args.argv)}`",
        "",
        f"Data: 2 features x {args.vocab:,} ids (40-bit raw ids, Zipf {args.zipf}, drift "
        f"{args.drift} ranks/step, one scenario each); {args.steps} training steps x batch {args.batch}, evaluation "
        f"on {args.eval:,} new examples. Tables: {args.rows:,} rows x dim {args.dim} per feature "
        f"(exact: {args.vocab:,}); eviction every {args.eviction_interval} steps. Seeds "
        f"{args.seeds}: mean (min to max). {args.threads} threads.",
        f"Machine: {machine_line()}; {json.dumps(machine_info())}",
        "",
        "| drift | contender | lookups that collide | ids with their own row | AUC | AUC - modulo "
        "| of the gap to exact | log loss | best AUC | train ms/step |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in summary:
        lines.append(
            f"| {e['drift']} | {e['contender']} | {cell(e, 'collided_lookups', '.1%')} | "
            f"{cell(e, 'ids_with_own_row', '.1%')} | {cell(e, 'auc', '.4f')} | "
            f"{cell(e, 'auc_over_modulo', '+.4f')} | {cell(e, 'gap_closed', '.0%')} | "
            f"{cell(e, 'log_loss', '.4f')} | {cell(e, 'best_auc', '.4f')} | "
            f"{cell(e, 'ms_per_step', '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=1_000_000, help="distinct ids per feature")
    parser.add_argument("--zipf", type=float, default=1.05, help="power-law exponent")
    parser.add_argument("--drift", type=int, nargs="+", default=[0, 25],
                        help="popularity shift in ranks per step; one scenario per value")  # fmt: skip
    parser.add_argument("--rows", type=int, default=50_000, help="table rows per feature")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--eval", type=int, default=50_000)
    parser.add_argument("--eviction-interval", type=int, default=10)
    parser.add_argument("--table-lr", type=float, default=0.05)
    parser.add_argument("--dense-lr", type=float, default=0.01)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write a markdown report here (and .json beside it)")
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    torch.set_num_threads(args.threads)
    rows = [row for d in args.drift for seed in args.seeds for row in run_seed(seed, d, args)]
    summary = summarise(rows, args)
    report = render(summary, args)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"args": vars(args), "machine": machine_info(), "summary": summary,
                       "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
