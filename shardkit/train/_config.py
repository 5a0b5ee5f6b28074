"""`TrainConfig`: everything ``shardkit train`` can be told, validated once."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from shardkit.data import CriteoFormat, IdMapping
from shardkit.planner import ShardingType

__all__ = [
    "CRITEO_FORMATS",
    "ID_MAPPINGS",
    "DataSource",
    "DenseOptimizer",
    "ModelKind",
    "TrainConfig",
]

CRITEO_FORMATS = tuple(f.value for f in CriteoFormat)  # "tsv", "paddlerec"
ID_MAPPINGS = tuple(m.value for m in IdMapping)  # "modulo", "hash"


class DataSource(enum.Enum):
    ADULT = "adult"  # the vendored UCI Adult census data (default)
    CRITEO = "criteo"  # Criteo Kaggle/Terabyte TSV files at --data-path
    SYNTHETIC = "synthetic"  # generated, Criteo-Terabyte table sizes, power-law ids


class ModelKind(enum.Enum):
    DLRM = "dlrm"
    DCN = "dcn"  # DLRM with a low-rank DCN-v2 cross network as the interaction


class DenseOptimizer(enum.Enum):
    ADAM = "adam"
    ADAGRAD = "adagrad"


@dataclass(frozen=True)
class TrainConfig:
    """A training run. Defaults give the demo: DLRM on UCI Adult, 2 ranks, 3 epochs.

    Sizes are per rank: the global batch is ``batch_size * nproc``.
    """

    data: DataSource = DataSource.ADULT
    data_path: Path | None = None  # Criteo training file(s); validation: data_val_path
    data_val_path: Path | None = None
    num_embeddings: int = 100_000  # Criteo: ids are hashed/modulo'd into this many rows
    criteo_format: str = "tsv"  # "tsv" (Kaggle/Terabyte) or "paddlerec" (DLRM sample layout)
    id_mapping: str = "modulo"  # Criteo: "modulo" or "hash" of the parsed value
    synthetic_examples: int = 262_144
    model: ModelKind = ModelKind.DLRM
    embedding_dim: int = 16
    dense_arch: tuple[int, ...] = (64, 16)
    over_arch: tuple[int, ...] = (64, 32, 1)
    dcn_layers: int = 2
    dcn_rank: int = 16
    batch_size: int = 256
    epochs: int = 3
    lr: float = 2e-3  # dense optimizer
    table_lr: float = 0.05  # fused row-wise Adagrad of the tables
    dense_optimizer: DenseOptimizer = DenseOptimizer.ADAM
    nproc: int = 2
    local_world_size: int | None = None
    sharding_type: ShardingType | None = None
    plan_only: bool = False
    checkpoint_dir: Path = field(default_factory=lambda: Path("runs/adult"))
    resume: bool = False
    keep_checkpoints: int = 2
    metrics_path: Path | None = None  # default: <checkpoint_dir>/metrics.jsonl
    seed: int = 0
    progress: bool = True
    log_every: int = 10  # steps between "train" lines (loss over all ranks) in the metrics file
    max_steps_per_epoch: int | None = None
    # Seconds a collective waits before the job fails naming the late rank (a warning names it
    # at a quarter of this). Half an hour, as torch's gloo default: one rank may be away from
    # collectives for minutes while planning or loading the first batches, or saving its shards.
    timeout: float = 1800.0

    def __post_init__(self) -> None:
        positive = [
            "embedding_dim",
            "batch_size",
            "epochs",
            "nproc",
            "num_embeddings",
            "keep_checkpoints",
            "log_every",
        ]
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.dense_arch or self.dense_arch[-1] != self.embedding_dim:
            raise ValueError(
                f"dense_arch {list(self.dense_arch)} must end with the embedding dim "
                f"{self.embedding_dim} (DLRM compares dense and sparse vectors)"
            )
        if not self.over_arch or self.over_arch[-1] != 1:
            raise ValueError(f"over_arch {list(self.over_arch)} must end with 1 (one logit)")
        for name, allowed in (("criteo_format", CRITEO_FORMATS), ("id_mapping", ID_MAPPINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}"
                )
        if self.data == DataSource.CRITEO and self.data_path is None:
            raise ValueError("--data criteo needs --data-path (a TSV file or a folder of them)")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.lr <= 0 or self.table_lr <= 0:
            raise ValueError(
                f"learning rates must be > 0, got lr={self.lr}, table_lr={self.table_lr}"
            )
        if self.local_world_size is not None and self.nproc % self.local_world_size:
            raise ValueError(
                f"nproc ({self.nproc}) must be a multiple of local_world_size ({self.local_world_size})"
            )

    @property
    def metrics_file(self) -> Path:
        return self.metrics_path or self.checkpoint_dir / "metrics.jsonl"
