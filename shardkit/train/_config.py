"""`TrainConfig`: everything ``shardkit train`` can be told, validated once.

Its fields and the ``Attributes`` of its docstring are the command line's flags and their help
(``shardkit/cli/_train.py`` derives them): one place to add an option.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardkit.data import CriteoFormat, IdMapping
from shardkit.planner import ShardingType

__all__ = [
    "CRITEO_FORMATS",
    "ID_MAPPINGS",
    "DataSource",
    "DenseOptimizer",
    "DenseSharding",
    "ModelKind",
    "TrainConfig",
]

CRITEO_FORMATS = tuple(f.value for f in CriteoFormat)  # "tsv", "paddlerec"
ID_MAPPINGS = tuple(m.value for m in IdMapping)  # "modulo", "hash"


class DataSource(enum.Enum):
    ADULT = "adult"  # the vendored UCI Adult census data (default)
    CRITEO = "criteo"  # Criteo Kaggle/Terabyte TSV files at --data-path
    SYNTHETIC = "synthetic"  # generated, Criteo-Terabyte table sizes, power-law ids
    TABLE = "table"  # the user's CSV/TSV/Parquet files at --data-path, described by --schema


class ModelKind(enum.Enum):
    DLRM = "dlrm"
    DCN = "dcn"  # DLRM with a low-rank DCN-v2 cross network as the interaction
    DEEPFM = "deepfm"  # not yet: refused (it lands with TorchRec's DeepFM)


class DenseOptimizer(enum.Enum):
    ADAM = "adam"
    ADAGRAD = "adagrad"


class DenseSharding(enum.Enum):
    DDP = "ddp"  # every rank holds the whole dense part; gradients all-reduced
    FSDP = "fsdp"  # the dense part fully sharded (`fully_shard`); tables model-parallel


@dataclass(frozen=True)
class TrainConfig:
    """A training run. Defaults give the demo: DLRM on UCI Adult, 2 ranks, 3 epochs.

    Sizes are per rank: the global batch is ``batch_size * nproc``. Enum fields also take their
    values as strings (``data="table"``), paths as strings.

    Attributes:
        data: adult (the vendored census data), criteo (TSV files at --data-path), synthetic
            (generated), or table (your CSV/TSV/Parquet files at --data-path with --schema).
        data_path: training files or folders of criteo or table data (local; nothing is
            downloaded).
        data_val_path: validation files or folders (criteo: else --data-path itself; table:
            else the schema's split).
        schema: table data: the schema file (TOML, JSON or YAML; see docs/data.md), or a
            fitted schema as export writes it.
        skip_bad_rows: table data: skip and count rows that cannot be read, instead of
            refusing the input.
        shuffle_buffer: table data: rows each rank's shuffle holds.
        table_cache: table data: a folder for the encoded splits, memory-mapped by later epochs
            and runs (written once; a change of the files, schema or split makes new ones).
        num_embeddings: criteo/synthetic: rows per table (criteo ids are mapped into them by
            --id-mapping).
        criteo_format: criteo line layout: tsv (Kaggle/Terabyte: label, 13 ints, 26 hex ids) or
            paddlerec (the DLRM sample's layout).
        id_mapping: criteo: a categorical value's row is value modulo --num-embeddings, or its
            hash.
        synthetic_examples: synthetic: training examples.
        model: dlrm, or dcn (DCN-v2 interaction); deepfm is not available yet.
        embedding_dim: columns of every table.
        dense_arch: dense MLP sizes; the last must be --embedding-dim.
        over_arch: top MLP sizes; the last must be 1.
        dcn_layers: dcn: cross layers.
        dcn_rank: dcn: rank of the cross layers' low-rank weights.
        batch_size: examples per rank per step.
        epochs: passes over the training data.
        lr: learning rate of the dense optimizer.
        table_lr: learning rate of the tables' fused row-wise Adagrad.
        dense_optimizer: optimizer of the dense MLPs (tables always use fused row-wise Adagrad).
        nproc: ranks to start (ignored under torchrun).
        local_world_size: ranks per (simulated) host, for table-row-wise.
        sharding_type: force one sharding type for every table.
        dense_sharding: ddp (the dense MLPs replicated on every rank, gradients all-reduced)
            or fsdp (fully sharded with fully_shard: each rank holds 1/nproc of them and of
            their optimizer state).
        plan_only: print the sharding plan and its stats, then stop.
        checkpoint_dir: where checkpoints go (unset: runs/<data>).
        resume: continue from the latest checkpoint in --checkpoint-dir.
        resume_from: continue from this checkpoint: a step number in --checkpoint-dir, or a
            checkpoint's directory.
        keep_checkpoints: how many checkpoints to keep.
        metrics_path: JSON lines of metrics (unset: <checkpoint-dir>/metrics.jsonl).
        seed: initial weights, data order and sampling.
        progress: a progress bar (or a log line every few seconds) while training.
        log_every: steps between training-loss lines (averaged over ranks) in the metrics file.
        max_steps_per_epoch: cut epochs short (smoke tests).
        timeout: seconds a collective may wait before the job fails, naming the late rank (a
            warning names it at a quarter of this).
        memory_cap: memory per rank the planner may fill, e.g. 8G (unset: the machine's: its
            memory divided among a host's ranks on CPU, the GPU's memory on GPU); the plan's
            stats table shows it.
    """

    data: DataSource = DataSource.ADULT
    data_path: tuple[Path, ...] = ()
    data_val_path: tuple[Path, ...] = ()
    schema: Path | None = None
    skip_bad_rows: bool = False
    shuffle_buffer: int = 16_384
    table_cache: Path | None = None
    num_embeddings: int = 100_000
    criteo_format: CriteoFormat = CriteoFormat.TSV
    id_mapping: IdMapping = IdMapping.MODULO
    synthetic_examples: int = 262_144
    model: ModelKind = ModelKind.DLRM
    embedding_dim: int = 16
    dense_arch: tuple[int, ...] = (64, 16)
    over_arch: tuple[int, ...] = (64, 32, 1)
    dcn_layers: int = 2
    dcn_rank: int = 16
    batch_size: int = 256
    epochs: int = 3
    lr: float = 2e-3
    table_lr: float = 0.05
    dense_optimizer: DenseOptimizer = DenseOptimizer.ADAM
    nproc: int = 2
    local_world_size: int | None = None
    sharding_type: ShardingType | None = None
    dense_sharding: DenseSharding = DenseSharding.DDP
    plan_only: bool = False
    checkpoint_dir: Path = field(default=None, metadata={"default": "runs/<data>"})  # type: ignore[assignment]
    resume: bool = False
    resume_from: str | None = field(default=None, metadata={"metavar": "STEP_OR_PATH"})
    keep_checkpoints: int = 2
    metrics_path: Path | None = field(default=None, metadata={"flag": "--metrics"})
    seed: int = 0
    progress: bool = True
    log_every: int = 10
    max_steps_per_epoch: int | None = None
    # Seconds a collective waits before the job fails naming the late rank (a warning names it
    # at a quarter of this). Half an hour, as torch's gloo default: one rank may be away from
    # collectives for minutes while planning or loading the first batches, or saving its shards.
    timeout: float = 1800.0
    # bytes; the command line takes sizes such as 8G ("bytes": parsed by the CLI's size reader)
    memory_cap: int | None = field(default=None, metadata={"metavar": "SIZE", "bytes": True})

    def __post_init__(self) -> None:
        _coerce(self)
        _check_sizes(self)
        _check_data(self)
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.lr <= 0 or self.table_lr <= 0:
            raise ValueError(
                f"learning rates must be > 0, got lr={self.lr}, table_lr={self.table_lr}"
            )
        if self.memory_cap is not None and (
            not isinstance(self.memory_cap, int) or self.memory_cap < 1
        ):
            raise ValueError(
                f"memory_cap must be a number of bytes >= 1 (e.g. --memory-cap 8G), got "
                f"{self.memory_cap!r}"
            )
        if self.local_world_size is not None and self.nproc % self.local_world_size:
            raise ValueError(
                f"nproc ({self.nproc}) must be a multiple of local_world_size ({self.local_world_size})"
            )
        if self.model is ModelKind.DEEPFM:
            raise ValueError("--model deepfm is not available yet (it comes with TorchRec's "
                             "DeepFM, in a later release); use --model dlrm or --model dcn")  # fmt: skip

    @property
    def metrics_file(self) -> Path:
        return self.metrics_path or self.checkpoint_dir / "metrics.jsonl"


def _coerce(config: TrainConfig) -> None:
    """Strings to enums and paths, a single path to a tuple, the default checkpoint folder."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(config):
        value, kind = getattr(config, f.name), _enum_of(hints[f.name])
        if kind is not None and isinstance(value, str):
            try:
                value = kind(value)
            except ValueError:
                raise ValueError(f"{f.name} must be one of {[m.value for m in kind]}, got "
                                 f"{value!r}") from None  # fmt: skip
        elif f.name in ("data_path", "data_val_path"):
            value = (Path(value),) if isinstance(value, (str, Path)) else tuple(map(Path, value))
        elif f.name in ("schema", "metrics_path", "table_cache") and isinstance(value, str):
            value = Path(value)
        object.__setattr__(config, f.name, value)
    if config.checkpoint_dir is None:
        object.__setattr__(config, "checkpoint_dir", Path("runs") / config.data.value)
    object.__setattr__(config, "checkpoint_dir", Path(config.checkpoint_dir))


def _enum_of(hint: Any) -> type[enum.Enum] | None:
    for arg in (hint, *typing.get_args(hint)):
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            return arg
    return None


def _check_sizes(config: TrainConfig) -> None:
    positive = ["embedding_dim", "batch_size", "epochs", "nproc", "num_embeddings",
                "keep_checkpoints", "log_every", "shuffle_buffer"]  # fmt: skip
    for name in positive:
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not config.dense_arch or config.dense_arch[-1] != config.embedding_dim:
        raise ValueError(
            f"dense_arch {list(config.dense_arch)} must end with the embedding dim "
            f"{config.embedding_dim} (DLRM compares dense and sparse vectors)"
        )
    if not config.over_arch or config.over_arch[-1] != 1:
        raise ValueError(f"over_arch {list(config.over_arch)} must end with 1 (one logit)")


def _check_data(config: TrainConfig) -> None:
    source = config.data
    if source in (DataSource.CRITEO, DataSource.TABLE) and not config.data_path:
        kind = "a TSV file or a folder of them" if source is DataSource.CRITEO else (
            "CSV/TSV/Parquet files or folders")  # fmt: skip
        raise ValueError(f"--data {source.value} needs --data-path ({kind})")
    if source in (DataSource.ADULT, DataSource.SYNTHETIC) and (
        config.data_path or config.data_val_path
    ):
        raise ValueError(f"--data {source.value} reads no files: --data-path and --data-val-path "
                         "are for --data criteo and --data table")  # fmt: skip
    if source is DataSource.TABLE and config.schema is None:
        raise ValueError("--data table needs --schema (a TOML, JSON or YAML file naming the "
                         "label and the columns; see docs/data.md)")  # fmt: skip
    if source is not DataSource.TABLE and (
        config.schema is not None or config.skip_bad_rows or config.table_cache is not None
    ):
        raise ValueError("--schema, --skip-bad-rows and --table-cache are for --data table")
