"""Table configurations, with TorchRec's names, fields and defaults.

`EmbeddingBagConfig` describes a pooled table (one vector per bag of ids), `EmbeddingConfig` a
sequence table (one vector per id). Both are frozen: build a new one with `dataclasses.replace`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import torch

__all__ = [
    "TABLE_NAME_RULE",
    "BaseEmbeddingConfig",
    "DataType",
    "EmbeddingBagConfig",
    "EmbeddingConfig",
    "PoolingType",
    "data_type_to_dtype",
]


@enum.unique
class PoolingType(enum.Enum):
    """How a bag of embedding rows becomes one vector."""

    SUM = "SUM"
    MEAN = "MEAN"
    NONE = "NONE"


@enum.unique
class DataType(enum.Enum):
    """Storage type of a table's weights."""

    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"
    INT8 = "INT8"
    INT4 = "INT4"
    INT2 = "INT2"

    def __str__(self) -> str:
        return self.value


_DTYPES = {
    DataType.FP32: torch.float32,
    DataType.FP16: torch.float16,
    DataType.BF16: torch.bfloat16,
    DataType.INT8: torch.int8,
}


def data_type_to_dtype(data_type: DataType) -> torch.dtype:
    """The torch dtype that stores ``data_type`` (INT4/INT2 are not supported for training)."""
    if data_type not in _DTYPES:
        raise ValueError(
            f"data type {data_type} has no torch dtype for training; use FP32, FP16 or BF16"
        )
    return _DTYPES[data_type]


# See [Note: table names] in `_tables`.
TABLE_NAME_RULE = (
    "a table's name is part of its state-dict keys (embedding_bags.<name>.weight), which join "
    'their parts with ".", so it must be a non-empty string without "."'
)


def _check_name(name: object) -> None:
    """A str, not empty. A "." is refused by the collections (`check_configs`): the planner also
    describes a plain module's parameters ('embedding_bags.t.weight') with these configs."""
    if not isinstance(name, str):
        raise TypeError(f"a table name must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ValueError(f"an embedding table needs a name: {TABLE_NAME_RULE}")


@dataclass(frozen=True)
class BaseEmbeddingConfig:
    """Fields shared by pooled and sequence tables.

    Args:
        num_embeddings: rows of the table (ids are ``0 <= id < num_embeddings``).
        embedding_dim: columns of the table (the vector size).
        name: the table's name, unique within a module; any non-empty string without "." (it is
            part of the state-dict keys, ``embedding_bags.<name>.weight``).
        data_type: storage type of the weights.
        feature_names: the features (KeyedJaggedTensor keys) looked up in this table.
        weight_init_max: upper bound of the uniform init (default ``sqrt(1 / num_embeddings)``).
        weight_init_min: lower bound of the uniform init (default ``-sqrt(1 / num_embeddings)``).
        init_fn: if given, called with the table's weight to initialise it instead.
    """

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    feature_names: list[str] = field(default_factory=list)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    init_fn: object | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.num_embeddings < 1:
            raise ValueError(
                f"table '{self.name}': num_embeddings must be >= 1, got {self.num_embeddings}"
            )
        if self.embedding_dim < 1:
            raise ValueError(
                f"table '{self.name}': embedding_dim must be >= 1, got {self.embedding_dim}"
            )
        if not isinstance(self.data_type, DataType):
            raise TypeError(
                f"table '{self.name}': data_type must be a DataType, got {self.data_type!r}"
            )
        duplicates = sorted({f for f in self.feature_names if self.feature_names.count(f) > 1})
        if duplicates:
            raise ValueError(f"table '{self.name}': feature names {duplicates} appear twice")
        low, high = self.get_weight_init_min(), self.get_weight_init_max()
        if low > high:
            raise ValueError(
                f"table '{self.name}': weight_init_min ({low}) > weight_init_max ({high})"
            )

    def get_weight_init_max(self) -> float:
        if self.weight_init_max is None:
            return math.sqrt(1 / self.num_embeddings)
        return self.weight_init_max

    def get_weight_init_min(self) -> float:
        if self.weight_init_min is None:
            return -math.sqrt(1 / self.num_embeddings)
        return self.weight_init_min

    def num_features(self) -> int:
        return len(self.feature_names)


@dataclass(frozen=True)
class EmbeddingBagConfig(BaseEmbeddingConfig):
    """A pooled table: each bag of ids becomes one vector (``pooling`` SUM or MEAN)."""

    pooling: PoolingType = PoolingType.SUM

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.pooling, PoolingType):
            raise TypeError(
                f"table '{self.name}': pooling must be a PoolingType, got {self.pooling!r}"
            )
        if self.pooling == PoolingType.NONE:
            raise ValueError(
                f"table '{self.name}': an EmbeddingBagConfig pools (SUM or MEAN); for one vector "
                "per id use EmbeddingConfig and EmbeddingCollection"
            )


@dataclass(frozen=True)
class EmbeddingConfig(BaseEmbeddingConfig):
    """A sequence table: every id becomes its own vector (no pooling)."""
