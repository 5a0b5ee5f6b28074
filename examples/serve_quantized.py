"""Serve the DLRM of ``shardkit train`` (UCI Adult) from the file ``shardkit export`` writes: a plain
process, no ranks, tables quantized or not.

    shardkit train --checkpoint-dir runs/adult                       # train (2 ranks)
    shardkit export runs/adult model-int8.pt --quantize int8         # tables INT8, dense float
    python examples/serve_quantized.py model-int8.pt --quantize int8

The model is built as training built it (same tables and layers; pass the same
``--embedding-dim``/``--dense-arch``/``--over-arch`` if you changed them), its tables on the meta
device so they take no memory; ``quantize_embeddings`` swaps its EmbeddingBagCollection for the quantized
one, and ``load_state_dict(..., assign=True)`` puts the file's tensors in. Prints the validation
AUC, the tables' size and the time to score a batch.
"""

from __future__ import annotations

import argparse
import time

import torch

from shardkit.data import GlobalBatchIterator, LastBatch, load_adult
from shardkit.inference import quantize_embeddings
from shardkit.metrics import auc_score
from shardkit.models import DLRM
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig

DTYPES = {"int8": torch.qint8, "int4": torch.quint4x2, "fp16": torch.float16}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def build(args: argparse.Namespace, keys, rows_per_key, num_dense: int) -> DLRM:
    """The float DLRM of ``shardkit train`` (table ``t_<key>`` per feature), its tables on the
    meta device (no memory until loaded)."""
    tables = [
        EmbeddingBagConfig(name=f"t_{key}", embedding_dim=args.embedding_dim, num_embeddings=rows,
                           feature_names=[key])
        for key, rows in zip(keys, rows_per_key)
    ]  # fmt: skip
    return DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device="meta"),
        dense_in_features=num_dense,
        dense_arch_layer_sizes=_ints(args.dense_arch),
        over_arch_layer_sizes=_ints(args.over_arch),
    )


def load(args: argparse.Namespace, model: DLRM) -> DLRM:
    state = torch.load(args.model, weights_only=True)
    state = {k.removeprefix("model."): v for k, v in state.items()}  # DLRMTrain's prefix
    if args.quantize == "none":
        model.sparse_arch.embedding_bag_collection.reset_parameters(device="cpu")
        model.load_state_dict(state)
    else:
        model = quantize_embeddings(model, dtype=DTYPES[args.quantize], inplace=True)
        model.load_state_dict(state, assign=True)
    return model.eval()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the file shardkit export wrote")
    parser.add_argument("--quantize", choices=[*DTYPES, "none"], default="none",
                        help="what --quantize the file was exported with")  # fmt: skip
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--dense-arch", default="64,16")
    parser.add_argument("--over-arch", default="64,32,1")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-batches", type=int, help="score only this many batches")
    return parser.parse_args(argv)


def serve(args: argparse.Namespace) -> dict[str, float]:
    """Load the model and score Adult's validation split: AUC, examples, table bytes, ms/batch."""
    adult = load_adult()
    model = load(args, build(args, adult.keys, adult.num_embeddings_per_feature, len(adult.dense_names)))  # fmt: skip
    batches = GlobalBatchIterator(adult.validation, batch_size=args.batch_size, rank=0,
                                  world_size=1, shuffle=False, last_batch=LastBatch.DROP)  # fmt: skip
    logits, labels, seconds = [], [], 0.0
    with torch.inference_mode():
        for index, batch in enumerate(batches):
            if args.max_batches is not None and index == args.max_batches:
                break
            start = time.perf_counter()
            logits.append(model(batch.dense_features, batch.sparse_features).squeeze(1))
            seconds += time.perf_counter() - start
            labels.append(batch.labels)
    tables = model.sparse_arch.embedding_bag_collection
    size = sum(b.numel() * b.element_size() for b in [*tables.buffers(), *tables.parameters()])
    return {
        "auc": auc_score(torch.cat(logits), torch.cat(labels)),
        "examples": sum(x.numel() for x in labels),
        "table_bytes": size,
        "ms_per_batch": seconds / len(logits) * 1e3,
    }


def main() -> None:
    args = parse()
    result = serve(args)
    print(f"validation AUC {result['auc']:.4f} on {result['examples']} examples; "
          f"tables {args.quantize} {result['table_bytes'] / 2**10:.1f} KiB; "
          f"{result['ms_per_batch']:.2f} ms per batch of {args.batch_size}")  # fmt: skip


if __name__ == "__main__":
    main()
