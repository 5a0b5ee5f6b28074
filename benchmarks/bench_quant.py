"""Quantized serving on CPU: model size, lookup latency and AUC against float, FP16/INT8/INT4.

    python benchmarks/bench_quant.py --out benchmarks/results/quant.md

Two models, each trained here with ``shardkit train``'s code (shardkit.train.run, one rank), then
exported as ``shardkit export --quantize`` writes it and loaded as a serving process does
(examples/serve_quantized.py: tables built on meta, quantize_embeddings, load_state_dict with
assign=True):
- adult: the DLRM of ``make demo`` (UCI Adult, 8 small tables, dim 16), 1 epoch;
- criteo-like: DLRM on synthetic Criteo-Terabyte-like data (26 tables capped at
  ``--criteo-rows`` rows, dim ``--criteo-dim``, power-law ids, a learnable signal), 1 epoch.

Reported per model and storage: the exported file's size and its tables' bytes; validation AUC
and log loss of the whole model (and the AUC change against float); the EmbeddingBagCollection's
lookup latency alone (median of ``--repeat`` calls per batch size, storages interleaved in
``--rounds`` rounds, ``--threads`` threads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from shardkit import KeyedJaggedTensor
from shardkit.bench import machine_info, machine_line
from shardkit.checkpoint import export_checkpoint
from shardkit.data import (
    GlobalBatchIterator,
    LastBatch,
    SyntheticConfig,
    SyntheticDataset,
    load_adult,
)
from shardkit.inference import quantize_embeddings
from shardkit.metrics import auc_score
from shardkit.models import DLRM
from shardkit.modules import DataType, EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.quant import quantize_table_weights
from shardkit.train import DataSource, TrainConfig, run

STORAGES = {
    "float": (None, None),
    "fp16": (DataType.FP16, torch.float16),
    "int8": (DataType.INT8, torch.qint8),
    "int4": (DataType.INT4, torch.quint4x2),
}


def configs(args: argparse.Namespace, root: Path) -> dict[str, TrainConfig]:
    common = {"nproc": 1, "epochs": 1, "progress": False, "seed": args.seed,
              "max_steps_per_epoch": args.max_steps}  # fmt: skip
    return {
        "adult": TrainConfig(checkpoint_dir=root / "adult", **common),
        "criteo-like": TrainConfig(
            data=DataSource.SYNTHETIC, num_embeddings=args.criteo_rows,
            synthetic_examples=args.criteo_examples, embedding_dim=args.criteo_dim,
            dense_arch=(128, args.criteo_dim), over_arch=(128, 64, 1),
            checkpoint_dir=root / "criteo", **common,
        ),
    }  # fmt: skip


def data_of(config: TrainConfig) -> tuple[list[str], list[int], int, list]:
    """(keys, rows per key, dense features, validation batches of up to 1024 examples)."""
    if config.data == DataSource.ADULT:
        adult = load_adult()
        batches = GlobalBatchIterator(adult.validation, batch_size=1024, rank=0, world_size=1,
                                      shuffle=False, last_batch=LastBatch.DROP)  # fmt: skip
        return adult.keys, adult.num_embeddings_per_feature, len(adult.dense_names), list(batches)  # fmt: skip
    # Held out: examples after the training ones, of the same data (same seed: the same rows
    # carry the same signal; `shardkit train` validates on seed + 1, whose rows carry another).
    trained, held = config.synthetic_examples, max(1024, config.synthetic_examples // 8)
    same = SyntheticConfig(num_examples=trained + held, num_embeddings=config.num_embeddings,
                           seed=config.seed)  # fmt: skip
    data = SyntheticDataset(same)
    starts = range(trained, trained + held, 1024)
    batches = [data.batch(torch.arange(s, min(s + 1024, trained + held))) for s in starts]
    return same.keys, same.num_embeddings_per_feature, same.num_dense, batches


def build(config: TrainConfig, keys, rows_per_key, num_dense: int) -> DLRM:
    """The float DLRM of ``shardkit train``, tables on the meta device."""
    tables = [
        EmbeddingBagConfig(name=f"t_{k}", embedding_dim=config.embedding_dim, num_embeddings=n,
                           feature_names=[k])
        for k, n in zip(keys, rows_per_key)
    ]  # fmt: skip
    return DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device="meta"),
        dense_in_features=num_dense,
        dense_arch_layer_sizes=list(config.dense_arch),
        over_arch_layer_sizes=list(config.over_arch),
    )


def serve(
    config: TrainConfig, data: tuple, state: dict, storage: str, scratch: Path
) -> tuple[DLRM, int]:
    """(the serving model, its exported file's bytes), through the export file."""
    data_type, dtype = STORAGES[storage]
    if data_type is not None:
        state = quantize_table_weights(state, data_type)
    path = scratch / f"{storage}.pt"
    torch.save(state, path)
    state = {k.removeprefix("model."): v for k, v in torch.load(path, weights_only=True).items()}
    keys, rows, num_dense, _ = data
    model = build(config, keys, rows, num_dense)
    if dtype is None:
        model.sparse_arch.embedding_bag_collection.reset_parameters(device="cpu")
        model.load_state_dict(state)
    else:
        model = quantize_embeddings(model, dtype=dtype, inplace=True)
        model.load_state_dict(state, assign=True)
    return model.eval(), path.stat().st_size


@torch.inference_mode()
def quality(model: DLRM, batches: list) -> dict[str, float]:
    logits = torch.cat([model(b.dense_features, b.sparse_features).squeeze(1) for b in batches])
    labels = torch.cat([b.labels for b in batches])
    return {
        "auc": auc_score(logits, labels),
        "log_loss": float(F.binary_cross_entropy_with_logits(logits, labels)),
    }


@torch.inference_mode()
def latencies(models: dict[str, DLRM], kjts: dict[int, list], args) -> dict[str, dict[int, float]]:
    """Median µs of one EmbeddingBagCollection call per (storage, batch size), interleaved."""
    times: dict[str, dict[int, list[float]]] = {s: {b: [] for b in kjts} for s in models}
    for _ in range(args.rounds):
        for storage, model in models.items():
            ebc = model.sparse_arch.embedding_bag_collection
            for size, batch in kjts.items():
                ebc(batch[0])  # warm-up
                for index in range(args.repeat):
                    start = time.perf_counter()
                    ebc(batch[index % len(batch)])
                    times[storage][size].append((time.perf_counter() - start) * 1e6)
    return {s: {b: statistics.median(v) for b, v in per.items()} for s, per in times.items()}


def table_bytes(model: DLRM) -> int:
    ebc = model.sparse_arch.embedding_bag_collection
    return sum(t.numel() * t.element_size() for t in [*ebc.buffers(), *ebc.parameters()])


def bench_model(
    name: str, config: TrainConfig, args: argparse.Namespace, scratch: Path
) -> list[dict]:
    print(f"{name}: training", flush=True)
    run(config)
    state = export_checkpoint(config.checkpoint_dir, scratch / f"{name}-export.pt")
    data = data_of(config)
    batches = data[3]
    kjts = {size: _split(batches, size, args.repeat) for size in args.batch_sizes}
    models, rows = {}, []
    for storage in STORAGES:
        model, file_bytes = serve(config, data, state, storage, scratch)
        models[storage] = model
        rows.append({"model": name, "storage": storage, "file_bytes": file_bytes,
                     "table_bytes": table_bytes(model), **quality(model, batches)})  # fmt: skip
    lookup = latencies(models, kjts, args)
    for row in rows:
        row["lookup_us"] = lookup[row["storage"]]
        row["auc_change"] = row["auc"] - rows[0]["auc"]
        print(json.dumps(row), flush=True)
    return rows


def _split(batches: list, size: int, count: int) -> list:
    """``count`` KJTs of ``size`` examples each, cut from the validation batches."""
    out = []
    for batch in batches:
        for start in range(0, batch.labels.numel() - size + 1, size):
            out.append(_slice(batch.sparse_features, start, size))
            if len(out) == count:
                return out
    return out


def _slice(kjt: KeyedJaggedTensor, start: int, size: int) -> KeyedJaggedTensor:
    jts = kjt.to_dict()
    values, lengths = [], []
    for jt in jts.values():
        offsets = jt.offsets()
        values.append(jt.values()[offsets[start] : offsets[start + size]])
        lengths.append(jt.lengths()[start : start + size])
    return KeyedJaggedTensor(keys=kjt.keys(), values=torch.cat(values), lengths=torch.cat(lengths))


def render(rows: list[dict], args: argparse.Namespace) -> str:
    sizes = args.batch_sizes
    lines = [
        "# Quantized serving on CPU (bench_quant.py)",
        "",
        f"Command: `python benchmarks/bench_quant.py {' '.join(args.argv)}`",
        "",
        f"Models trained 1 epoch on one rank; Criteo-like: 26 tables capped at {args.criteo_rows:,} "
        f"rows, dim {args.criteo_dim}, {args.criteo_examples:,} training examples. Lookup: one "
        f"EmbeddingBagCollection call, median of {args.repeat} per batch size x {args.rounds} "
        f"interleaved rounds, {args.threads} thread(s).",
        f"Machine: {machine_line()}; {json.dumps(machine_info())}",
        "",
        "| model | tables | file MB | tables MB | tables / float | AUC | AUC change | log loss | "
        + " | ".join(f"lookup µs, batch {b}" for b in sizes)
        + " |",
        "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(sizes),
    ]
    floats = {r["model"]: r["table_bytes"] for r in rows if r["storage"] == "float"}
    for r in rows:
        lookups = " | ".join(f"{r['lookup_us'][b]:,.0f}" for b in sizes)
        lines.append(
            f"| {r['model']} | {r['storage']} | {r['file_bytes'] / 2**20:.3f} | "
            f"{r['table_bytes'] / 2**20:.3f} | {r['table_bytes'] / floats[r['model']]:.2f} | "
            f"{r['auc']:.4f} | {r['auc_change']:+.4f} | "
            f"{r['log_loss']:.4f} | {lookups} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["adult", "criteo-like"],
                        choices=["adult", "criteo-like"])  # fmt: skip
    parser.add_argument("--criteo-rows", type=int, default=20_000)
    parser.add_argument("--criteo-dim", type=int, default=32)
    parser.add_argument("--criteo-examples", type=int, default=262_144)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, help="cut training short (smoke tests)")
    parser.add_argument("--out", help="write a markdown report here (and .json beside it)")
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, config in configs(args, Path(scratch)).items():
            if name in args.models:
                rows += bench_model(name, config, args, Path(scratch))
    report = render(rows, args)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"args": vars(args), "machine": machine_info(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
