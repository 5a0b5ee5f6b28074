"""``shardkit plan``: plan a model described in a file of tables, for any number of ranks.

No process starts and no table is allocated: the planner needs only the tables' shapes.

    shardkit plan model.yaml --world-size 1024 --local-world-size 8 --hbm-cap 80G \
        --output plan.json --png plan.png

The model file (JSON, or YAML with ``shardkit[yaml]``) lists the tables::

    batch_size: 512                 # optional (per rank); --batch-size wins
    tables:
      - name: user                  # required, unique
        rows: 1000000               # required
        dim: 128                    # required
        pooling_factor: 12.5        # optional: ids per example (one per feature, or a list)
        features: [user_id]         # optional (default: the table's name)
        data_type: fp16             # optional: fp32 (default), fp16, bf16, int8
        pooled: true                # optional: false for a sequence (EmbeddingCollection) table
        sharding_types: [row_wise]  # optional constraints, as ParameterConstraints
        compute_kernels: [fused]
        min_partition: 32

A top-level list of tables is also accepted.

With ``--profile P`` (from ``shardkit bench calibrate``) the ranks are that machine: the plan is
chosen by predicted step time and printed with it, per rank and for the job. With ``--simulate``
the planner plans and predicts every world size from 8 to 4,096 ranks on a cluster of that
machine (``--ranks-per-host``, and the links: ``--inter-bw``/``--inter-latency-us``, and
``--intra-bw``/``--intra-latency-us`` unless the profile's calibrated ones should serve)::

    shardkit plan dlrm.yaml --profile a100.json --simulate --ranks-per-host 8 \
        --intra-bw 230G --intra-latency-us 10 --inter-bw 23G --inter-latency-us 20 --png s.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shardkit.cli._simulate import add_simulate_arguments, run_simulation
from shardkit.cli._units import size
from shardkit.modules import DataType, EmbeddingBagConfig, EmbeddingConfig
from shardkit.planner import (
    DDR_CAP,
    HBM_CAP,
    HeuristicalStorageReservation,
    ParameterConstraints,
    PlannerError,
    PlanStats,
    Topology,
    load_profile,
    plan_tables,
)

__all__ = ["add_parser", "load_model"]

_TABLE_KEYS = {
    "name",
    "rows",
    "dim",
    "pooling_factor",
    "features",
    "data_type",
    "pooled",
    "sharding_types",
    "compute_kernels",
    "min_partition",
}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "plan",
        allow_abbrev=False,
        help="plan the sharding of a model's embedding tables (no processes needed)",
        description="Plan a model described in a JSON or YAML file of tables for any number of "
        "ranks; print the per-rank memory/cost table; optionally write the plan as JSON and a "
        "per-rank bar chart as PNG.",
    )
    parser.add_argument("model", type=Path, help="JSON or YAML file of tables")
    parser.add_argument(
        "--world-size", type=int, help="number of ranks (required unless --simulate)"
    )
    parser.add_argument("--local-world-size", type=int, help="ranks per host (default: all)")
    parser.add_argument("--compute-device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--hbm-cap", type=size, help="GPU memory per rank, e.g. 80G (default 32G)")
    parser.add_argument("--ddr-cap", type=size, help="host memory per rank (default 128G)")
    parser.add_argument(
        "--batch-size", type=int, help="examples per rank (default: the file's, or 512)"
    )
    parser.add_argument("--dense-bytes", type=size, default=0, help="memory of the dense model")
    parser.add_argument("--reserve", type=float, default=0.15, help="margin of each rank's memory")
    parser.add_argument("--optimizer", default="exact_row_wise_adagrad", help="fused optimizer")
    parser.add_argument("--output", type=Path, help="write the plan here (JSON)")
    parser.add_argument("--stats-json", type=Path, help="write the stats here (JSON)")
    parser.add_argument(
        "--png", type=Path, help="draw per-rank memory and cost here (shardkit[plot])"
    )
    parser.add_argument(
        "--profile", type=Path, help="a machine profile (shardkit bench calibrate): predict ms"
    )
    parser.add_argument(
        "--dense-params", type=int, default=0, help="parameters of the dense model (prediction)"
    )
    parser.add_argument(
        "--dense-flops",
        type=float,
        help="forward flops per example of the dense model (default 2 x --dense-params)",
    )
    add_simulate_arguments(parser)
    parser.set_defaults(run=_run, parser=parser)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.png:
            _matplotlib()  # fail before planning, not after
        tables, constraints, file_batch = load_model(args.model)
        reservation = HeuristicalStorageReservation(
            percentage=args.reserve, dense_tensor_estimate=args.dense_bytes
        )
        profile = load_profile(args.profile) if args.profile else None
        batch_size = args.batch_size or file_batch or 512
        if args.simulate:
            return run_simulation(
                args, tables, constraints, reservation, profile, batch_size, _matplotlib
            )
        if args.world_size is None:
            raise ValueError("--world-size is required (unless --simulate)")
        result = plan_tables(
            tables,
            _topology(args, profile),
            constraints=constraints,
            storage_reservation=reservation,
            batch_size=batch_size,
            fused_params={"optimizer": args.optimizer},
            dense_parameters=args.dense_params,
            dense_flops_per_example=args.dense_flops,
        )
    except (PlannerError, ValueError, TypeError, OSError) as exc:
        print(f"shardkit plan: {exc}", file=sys.stderr)
        return 1
    print(f"sharding plan: {result.plan}")
    if args.output:
        args.output.write_text(result.plan.to_json(indent=1) + "\n")
        print(f"wrote the plan to {args.output}")
    if args.stats_json:
        args.stats_json.write_text(json.dumps(result.stats.to_dict(), indent=1) + "\n")
        print(f"wrote the stats to {args.stats_json}")
    if args.png:
        draw(result.stats, args.png)
        print(f"drew {args.png}")
    return 0


def _topology(args: argparse.Namespace, profile: Any) -> Topology:
    """The ranks: the profiled machine's (its device, memory and speeds), or any cluster with
    TorchRec's capacities unless told."""
    if profile is not None:
        return Topology.from_profile(
            profile,
            world_size=args.world_size,
            local_world_size=args.local_world_size,
            hbm_cap=args.hbm_cap,
            ddr_cap=args.ddr_cap,
        )
    cuda = args.compute_device == "cuda"
    return Topology(
        world_size=args.world_size,
        compute_device=args.compute_device,
        hbm_cap=args.hbm_cap if args.hbm_cap is not None else (HBM_CAP if cuda else 0),
        ddr_cap=args.ddr_cap if args.ddr_cap is not None else DDR_CAP,
        local_world_size=args.local_world_size,
    )


def load_model(path: Path) -> tuple[list, dict[str, ParameterConstraints], int | None]:
    """(table configs, constraints, batch size or None) from a JSON or YAML model file."""
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        data = _yaml().safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc}); YAML files end in .yaml") from exc
    if isinstance(data, list):
        data = {"tables": data}
    if not isinstance(data, dict) or not isinstance(data.get("tables"), list) or not data["tables"]:
        raise ValueError(f"{path}: expected a list of tables, or a mapping with a 'tables' list")
    unknown = sorted(set(data) - {"tables", "batch_size"})
    if unknown:
        raise ValueError(
            f"{path}: unknown top-level keys {unknown}; known: ['batch_size', 'tables']"
        )
    tables, constraints = [], {}
    for index, entry in enumerate(data["tables"]):
        config, constraint = _table(path, index, entry)
        tables.append(config)
        if constraint is not None:
            constraints[config.name] = constraint
    return tables, constraints, data.get("batch_size")


def _table(path: Path, index: int, entry: Any):
    where = f"{path}: table {index}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping with name, rows and dim, got {entry!r}")
    where += f" ({entry.get('name')!r})"
    unknown = sorted(set(entry) - _TABLE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(_TABLE_KEYS)}")
    missing = [key for key in ("name", "rows", "dim") if key not in entry]
    if missing:
        raise ValueError(f"{where}: missing {missing}")
    try:
        kind = EmbeddingBagConfig if entry.get("pooled", True) else EmbeddingConfig
        config = kind(
            name=str(entry["name"]),
            num_embeddings=entry["rows"],
            embedding_dim=entry["dim"],
            feature_names=list(entry.get("features") or [str(entry["name"])]),
            data_type=DataType[str(entry.get("data_type", "fp32")).upper()],
        )
        pooling = entry.get("pooling_factor")
        if pooling is not None and not isinstance(pooling, list):
            pooling = [pooling] * len(config.feature_names)
        keys = ("sharding_types", "compute_kernels", "min_partition")
        given = {key: entry[key] for key in keys if key in entry}
        constraint = None
        if given or pooling is not None:
            constraint = ParameterConstraints(pooling_factors=pooling, **given)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {exc}") from exc
    return config, constraint


def draw(stats: PlanStats, path: Path) -> None:
    """Per-rank memory (with the memory tables may use) and cost, as two bar charts."""
    plt = _matplotlib()
    ranks = [r.rank for r in stats.ranks]
    fig, (memory, cost) = plt.subplots(
        2, 1, figsize=(max(8.0, min(24.0, len(ranks) / 8)), 6), sharex=True
    )
    memory.bar(ranks, [r.memory / 1024**3 for r in stats.ranks], width=1.0, color="tab:blue")
    memory.axhline(stats.available / 1024**3, color="tab:red", linestyle="--", label="for tables")
    memory.set_ylabel("memory (GiB)")
    memory.legend(loc="upper right")
    memory.set_title(
        f"{len(stats.tables)} tables on {stats.world_size} ranks\nimbalance (max/mean): cost "
        f"{stats.cost_imbalance:.3f}, memory {stats.memory_imbalance:.3f}",
        fontsize=10,
    )
    cost.bar(ranks, [r.compute for r in stats.ranks], width=1.0, label="lookups", color="tab:green")
    cost.bar(
        ranks,
        [r.comms for r in stats.ranks],
        width=1.0,
        bottom=[r.compute for r in stats.ranks],
        label="communication",
        color="tab:orange",
    )
    cost.set_ylabel("estimated cost (ms/step)")
    cost.set_xlabel("rank")
    cost.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("drawing the plan needs matplotlib: pip install 'shardkit[plot]'") from exc
    return plt


def _yaml() -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise ValueError(
            "reading YAML model files needs PyYAML: pip install 'shardkit[yaml]'"
        ) from exc
    return yaml
