"""``shardkit train`` (the main job), ``shardkit export`` and ``shardkit import``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from shardkit.cli._export import QUANTIZE_CHOICES, export
from shardkit.planner import ShardingType
from shardkit.train import (
    CRITEO_FORMATS,
    ID_MAPPINGS,
    DataSource,
    DenseOptimizer,
    ModelKind,
    TrainConfig,
    run,
)

_DEFAULTS = TrainConfig()


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where there is none to show (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def add_parsers(commands: Any) -> None:
    _train_parser(commands)
    export = commands.add_parser("export", help="write a checkpoint's model as one unsharded file")
    export.add_argument("checkpoint", type=Path, help="a step-* directory, or a root with 'latest'")
    export.add_argument("output", type=Path, help="the .pt file to write")
    export.add_argument("--quantize", choices=list(QUANTIZE_CHOICES),
                        help="store the tables so for serving on CPU (see docs/serving.md)")  # fmt: skip
    export.set_defaults(run=_export)
    imp = commands.add_parser("import", help="turn an unsharded .pt state dict into a checkpoint")
    imp.add_argument("state_file", type=Path, help="a torch.save'd model state dict")
    imp.add_argument(
        "checkpoint_dir", type=Path, help="where the checkpoint goes (--resume reads it)"
    )
    imp.set_defaults(run=_import)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _train_parser(commands: Any) -> None:
    p = commands.add_parser(
        "train",
        help="train a DLRM with sharded embedding tables (the main job)",
        description="Train DLRM (or DCN-v2) with its embedding tables sharded over ranks, the "
        "train pipeline, fused row-wise Adagrad for tables and Adam for the rest; validate "
        "every epoch (AUC, log loss across ranks) and checkpoint. Defaults: UCI Adult, 2 ranks.",
        formatter_class=_Help,
    )
    d = _DEFAULTS
    p.add_argument("--data", choices=[s.value for s in DataSource], default=d.data.value,
                   help="adult: the vendored census data; criteo: TSV files at --data-path; synthetic: generated")  # fmt: skip
    p.add_argument(
        "--data-path",
        type=Path,
        help="Criteo training file or folder (local; nothing is downloaded)",
    )
    p.add_argument(
        "--data-val-path",
        type=Path,
        help="Criteo validation file or folder (unset: --data-path itself)",
    )
    p.add_argument(
        "--num-embeddings",
        type=int,
        default=d.num_embeddings,
        help="Criteo/synthetic: rows per table (Criteo ids are mapped into them by --id-mapping)",
    )
    p.add_argument(
        "--criteo-format",
        choices=CRITEO_FORMATS,
        default=d.criteo_format,
        help="Criteo line layout: tsv (Kaggle/Terabyte: label, 13 ints, 26 hex ids) or paddlerec "
        "(the DLRM sample's layout)",
    )
    p.add_argument(
        "--id-mapping",
        choices=ID_MAPPINGS,
        default=d.id_mapping,
        help="Criteo: a categorical value's row is value modulo --num-embeddings, or its hash",
    )
    p.add_argument(
        "--synthetic-examples",
        type=int,
        default=d.synthetic_examples,
        help="synthetic: training examples",
    )
    p.add_argument(
        "--model",
        choices=[m.value for m in ModelKind],
        default=d.model.value,
        help="dlrm, or dcn (DCN-v2 interaction)",
    )
    p.add_argument(
        "--embedding-dim", type=int, default=d.embedding_dim, help="columns of every table"
    )
    p.add_argument(
        "--dense-arch",
        type=_ints,
        default=d.dense_arch,
        help="dense MLP sizes; the last must be --embedding-dim",
    )
    p.add_argument(
        "--over-arch", type=_ints, default=d.over_arch, help="top MLP sizes; the last must be 1"
    )
    p.add_argument(
        "--batch-size", type=int, default=d.batch_size, help="examples per rank per step"
    )
    p.add_argument("--epochs", type=int, default=d.epochs, help="passes over the training data")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate of the dense optimizer")
    p.add_argument(
        "--table-lr",
        type=float,
        default=d.table_lr,
        help="learning rate of the tables' fused row-wise Adagrad",
    )
    p.add_argument(
        "--dense-optimizer",
        choices=[o.value for o in DenseOptimizer],
        default=d.dense_optimizer.value,
        help="optimizer of the dense MLPs (tables always use fused row-wise Adagrad)",
    )
    p.add_argument(
        "--nproc", type=int, default=d.nproc, help="ranks to start (ignored under torchrun)"
    )
    p.add_argument(
        "--local-world-size", type=int, help="ranks per (simulated) host, for table-row-wise"
    )
    p.add_argument(
        "--sharding-type",
        choices=[t.value for t in ShardingType],
        help="force one sharding type for every table",
    )
    p.add_argument(
        "--plan-only", action="store_true", help="print the sharding plan and its stats, then stop"
    )
    p.add_argument("--checkpoint-dir", type=Path, help="where checkpoints go (unset: runs/<data>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --checkpoint-dir",
    )
    p.add_argument(
        "--metrics",
        type=Path,
        help="JSON lines of metrics (unset: <checkpoint-dir>/metrics.jsonl)",
    )
    p.add_argument(
        "--seed", type=int, default=d.seed, help="initial weights, data order and sampling"
    )
    p.add_argument(
        "--log-every",
        type=int,
        default=d.log_every,
        help="steps between training-loss lines (averaged over ranks) in the metrics file",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--max-steps-per-epoch", type=int, help="cut epochs short (smoke tests)")
    p.add_argument(
        "--timeout",
        type=float,
        default=d.timeout,
        help="seconds a collective may wait before the job fails, naming the late rank",
    )
    p.set_defaults(run=_train)


def _train(args: argparse.Namespace) -> int:
    data = DataSource(args.data)
    config = TrainConfig(
        data=data,
        data_path=args.data_path,
        data_val_path=args.data_val_path,
        num_embeddings=args.num_embeddings,
        criteo_format=args.criteo_format,
        id_mapping=args.id_mapping,
        synthetic_examples=args.synthetic_examples,
        model=ModelKind(args.model),
        embedding_dim=args.embedding_dim,
        dense_arch=args.dense_arch,
        over_arch=args.over_arch,
        batch_size=args.batch_size,
        epochs=args.epochs,
        lr=args.lr,
        table_lr=args.table_lr,
        dense_optimizer=DenseOptimizer(args.dense_optimizer),
        nproc=args.nproc,
        local_world_size=args.local_world_size,
        sharding_type=ShardingType(args.sharding_type) if args.sharding_type else None,
        plan_only=args.plan_only,
        checkpoint_dir=args.checkpoint_dir or Path("runs") / data.value,
        resume=args.resume,
        metrics_path=args.metrics,
        seed=args.seed,
        progress=not args.no_progress,
        log_every=args.log_every,
        max_steps_per_epoch=args.max_steps_per_epoch,
        timeout=args.timeout,
    )
    run(config, rank_setup=show_training_log)
    return 0


def show_training_log() -> None:
    """In a rank's process: the ``shardkit.train`` log (rank 0's plan, progress, metrics and
    checkpoints) on standard output, as plain lines."""
    log = logging.getLogger("shardkit.train")
    if not log.handlers:  # once per process
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _export(args: argparse.Namespace) -> int:
    print(export(args.checkpoint, args.output, args.quantize))
    return 0


def _import(args: argparse.Namespace) -> int:
    from shardkit.checkpoint import import_checkpoint

    path = import_checkpoint(args.state_file, args.checkpoint_dir)
    print(f"wrote checkpoint {path}")
    return 0
