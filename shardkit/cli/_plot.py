"""``shardkit plot RUN_DIR``: a run's training loss, validation metrics and throughput over
steps, from its ``metrics.jsonl``, as one PNG (matplotlib: ``shardkit[plot]``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from shardkit.metrics import read_jsonl

__all__ = ["add_parser", "draw_metrics"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "plot",
        help="draw a run's loss, validation metrics and throughput (shardkit[plot])",
        description="Draw the training loss, validation AUC and log loss, and the training and "
        "reading throughput of a run over its steps, from the metrics.jsonl that shardkit "
        "train writes, to a PNG.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="a run's --checkpoint-dir, or a metrics file"
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="the PNG to write (default: metrics.png beside the metrics)",
    )
    parser.set_defaults(run=_run, parser=parser)


def _run(args: argparse.Namespace) -> int:
    path = args.run_dir / "metrics.jsonl" if args.run_dir.is_dir() else args.run_dir
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give a run's --checkpoint-dir (which "
                                "holds metrics.jsonl) or a metrics file (--metrics)")  # fmt: skip
    output = args.output or path.with_name("metrics.png")
    draw_metrics(read_jsonl(path), output, title=str(args.run_dir))
    print(f"drew {output}")
    return 0


def draw_metrics(records: list[dict[str, Any]], path: Path, *, title: str = "") -> None:
    """Four panels over steps: training loss; validation AUC; validation log loss; samples/s
    of training (and of reading where training waited for it, per epoch)."""
    plt = _matplotlib()
    train = [r for r in records if r.get("kind") == "train"]
    validation = [r for r in records if r.get("kind") == "validation"]
    if not train and not validation:
        raise ValueError(f"{title}: the metrics hold no 'train' or 'validation' records yet")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    _line(axes[0][0], train, "loss", "training loss (mean over ranks)", "tab:blue")
    _line(axes[0][1], validation, "auc", "validation AUC", "tab:green", marker="o")
    _line(axes[1][0], validation, "log_loss", "validation log loss", "tab:red", marker="o")
    _line(axes[1][1], train, "samples_per_s", "samples/s", "tab:purple",
          label="training, so far this epoch")  # fmt: skip
    _line(axes[1][1], validation, "epoch_samples_per_s", "samples/s", "tab:purple", marker="s",
          linestyle="none", label="training, whole epoch")  # fmt: skip
    _line(axes[1][1], validation, "data_samples_per_s", "samples/s", "tab:orange", marker="o",
          label="reading where training waited")  # fmt: skip
    axes[1][1].legend(loc="best")
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _line(ax: Any, records: list[dict[str, Any]], key: str, name: str, color: str,
          **kwargs: Any) -> None:  # fmt: skip
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None and "step" in r]
    if points:
        ax.plot(*zip(*points), color=color, **kwargs)
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)


def _matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("drawing needs matplotlib: pip install 'shardkit[plot]'") from None
    return plt
