"""Table configurations, with TorchRec's names, fields and defaults.

`EmbeddingBagConfig` describes a pooled table (one vector per bag of ids), `EmbeddingConfig` a
sequence table (one vector per id). Both are frozen: build a new one with `dataclasses.replace`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from shardkit.types import PoolingMode, ShardingType, SparseType

__all__ = [
    "DATA_TYPE_NUM_BITS",
    "TABLE_NAME_RULE",
    "BaseEmbeddingConfig",
    "CountBasedEvictionPolicy",
    "CountTimestampMixedEvictionPolicy",
    "DataType",
    "EmbeddingBagConfig",
    "EmbeddingConfig",
    "EmbeddingTableConfig",
    "FeatureL2NormBasedEvictionPolicy",
    "FeatureScoreBasedEvictionPolicy",
    "FeatureScoreMapping",
    "NoEvictionPolicy",
    "PoolingType",
    "QuantConfig",
    "ShardingType",
    "TimestampBasedEvictionPolicy",
    "VirtualTableEvictionPolicy",
    "data_type_to_dtype",
    "data_type_to_sparse_type",
    "dtype_to_data_type",
    "pooling_type_to_pooling_mode",
    "pooling_type_to_str",
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
    INT64 = "INT64"
    INT32 = "INT32"
    INT8 = "INT8"
    UINT8 = "UINT8"
    INT4 = "INT4"
    INT2 = "INT2"
    NFP8 = "NFP8"

    def __str__(self) -> str:
        return self.value


DATA_TYPE_NUM_BITS = {DataType.FP32: 32, DataType.FP16: 16, DataType.BF16: 16, DataType.INT8: 8,
                      DataType.UINT8: 8, DataType.NFP8: 8, DataType.INT4: 4, DataType.INT2: 2}  # fmt: skip


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


_FROM_DTYPE = {torch.float32: DataType.FP32, torch.float16: DataType.FP16,
               torch.bfloat16: DataType.BF16, torch.int32: DataType.INT32,
               torch.int64: DataType.INT64, torch.int8: DataType.INT8, torch.qint8: DataType.INT8,
               torch.quint8: DataType.INT8, torch.uint8: DataType.UINT8,
               torch.quint4x2: DataType.INT4, torch.quint2x4: DataType.INT2,
               torch.float8_e4m3fn: DataType.NFP8}  # fmt: skip


def dtype_to_data_type(dtype: torch.dtype) -> DataType:
    """The `DataType` of a torch dtype, as TorchRec maps it: ``torch.qint8``, ``torch.quint8``
    and ``torch.int8`` -> INT8, ``torch.uint8`` -> UINT8 (stored quantized as INT8 is: see
    [Note: uint8 storage] in `shardkit.quant`), ``torch.quint4x2`` -> INT4, ..."""
    if dtype not in _FROM_DTYPE:
        raise ValueError(f"no DataType for {dtype}; DataTypes exist for {list(_FROM_DTYPE)}")
    return _FROM_DTYPE[dtype]


def data_type_to_sparse_type(data_type: DataType) -> SparseType:
    """FBGEMM's name of the same precision (INT8 and UINT8 are both SparseType.INT8)."""
    if data_type in (DataType.INT64, DataType.INT32):
        raise ValueError(f"{data_type} is no embedding precision; FBGEMM has no SparseType for it")
    return SparseType.INT8 if data_type == DataType.UINT8 else SparseType[data_type.name]


class QuantConfig(NamedTuple):
    """TorchRec's quantization config: ``weight().dtype`` is the tables' storage type (e.g.
    ``torch.qint8``, ``torch.quint4x2``, ``torch.float16``), ``activation().dtype`` the output's;
    ``per_table_weight_dtype`` overrides the storage per table name. ``weight`` and ``activation``
    are factories (torch's ``PlaceholderObserver.with_args(dtype=...)`` works too)."""

    activation: Callable[[], Any]
    weight: Callable[[], Any]
    per_table_weight_dtype: Mapping[str, torch.dtype] | None = None


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
        num_embeddings_post_pruning, need_pos, input_dim, total_num_buckets,
            use_virtual_table, virtual_table_eviction_policy, enable_embedding_update,
            stash_weights: TorchRec's fields for pruned, position-weighted and key-value
            tables, which shardkit does not have: only their defaults are accepted.
    """

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    feature_names: list[str] = field(default_factory=list)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    num_embeddings_post_pruning: int | None = None
    init_fn: object | None = None
    need_pos: bool = False
    input_dim: int | None = None
    total_num_buckets: int | None = None
    use_virtual_table: bool = False
    virtual_table_eviction_policy: Any = None
    enable_embedding_update: bool = False
    stash_weights: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name)
        _refuse_unsupported(self)
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


# TorchRec fields of a table that shardkit's kernels do not implement: at their default only.
_UNSUPPORTED = {
    "num_embeddings_post_pruning": "pruned tables belong to quantized inference",
    "need_pos": "position-weighted features come with the feature processors",
    "input_dim": "input_dim sizes tables of TorchRec's virtual (key-value) tables",
    "total_num_buckets": "bucketized tables belong to TorchRec's key-value tables",
    "use_virtual_table": "virtual (SSD/key-value) tables are FBGEMM kernels",
    "virtual_table_eviction_policy": "virtual (SSD/key-value) tables are FBGEMM kernels",
    "enable_embedding_update": "embedding updates by write_dist are for key-value tables",
    "stash_weights": "stashed weights are for TorchRec's key-value tables",
}


def _refuse_unsupported(config: Any) -> None:
    for name, reason in _UNSUPPORTED.items():
        value = getattr(config, name)
        if value not in (None, False):
            raise ValueError(
                f"table '{config.name}': {name}={value!r} is not in shardkit ({reason}); leave "
                f"{name} at its default"
            )


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


@dataclass(frozen=True)
class EmbeddingTableConfig(BaseEmbeddingConfig):
    """A table with its pooling, weighting and output names (TorchRec's sharded tables' base)."""

    pooling: PoolingType = PoolingType.SUM
    is_weighted: bool = False
    has_feature_processor: bool = False
    embedding_names: list[str] = field(default_factory=list)


def pooling_type_to_pooling_mode(
    pooling_type: PoolingType, sharding_type: ShardingType | None = None
) -> PoolingMode:
    """FBGEMM's pooling mode; MEAN is SUM for row-wise shards (each holds part of a bag, and the
    mean is taken after the partial sums are added, as shardkit does)."""
    row_wise = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)
    mean = pooling_type == PoolingType.MEAN
    if mean and sharding_type is not None and ShardingType.parse(sharding_type) in row_wise:
        return PoolingMode.SUM
    return PoolingMode[PoolingType(pooling_type).name]


def pooling_type_to_str(pooling_type: PoolingType) -> str:
    """``"sum"`` or ``"mean"``."""
    if pooling_type == PoolingType.NONE:
        raise ValueError("pooling_type_to_str: PoolingType.NONE does not pool; use SUM or MEAN")
    return PoolingType(pooling_type).value.lower()


@dataclass
class VirtualTableEvictionPolicy:
    """How TorchRec's virtual (key-value) tables evict ids (data: shardkit has no virtual
    tables, and a config that names a policy is refused)."""

    meta_header_len: int = 0
    embedding_dim: int = 0
    initialized: bool = False

    def init_metaheader_config(self, data_type: DataType, embedding_dim: int) -> None:
        """Sets the 16-byte metadata header's length in elements of ``data_type``, once."""
        if self.initialized:
            return
        self.meta_header_len = 16 // data_type_to_dtype(data_type).itemsize
        self.embedding_dim = embedding_dim
        self.initialized = True

    def get_meta_header_len(self) -> int:
        return self.meta_header_len

    def get_embedding_dim(self) -> int:
        return self.embedding_dim


@dataclass
class NoEvictionPolicy(VirtualTableEvictionPolicy):
    pass


@dataclass
class CountBasedEvictionPolicy(VirtualTableEvictionPolicy):
    training_id_eviction_trigger_count: int = 0
    eviction_threshold: int = 15
    decay_rate: float = 0.99
    inference_eviction_threshold: int | None = None


@dataclass
class TimestampBasedEvictionPolicy(VirtualTableEvictionPolicy):
    training_id_eviction_trigger_count: int = 0
    eviction_ttl_mins: int = 1440
    inference_eviction_ttl_mins: int | None = None
    max_inference_id_num_per_rank: int = 0


@dataclass
class CountTimestampMixedEvictionPolicy(VirtualTableEvictionPolicy):
    training_id_eviction_trigger_count: int = 0
    eviction_threshold: int = 15
    decay_rate: float = 0.99
    eviction_ttl_mins: int = 1440
    inference_eviction_threshold: int | None = None
    inference_eviction_ttl_mins: int | None = None


@dataclass
class FeatureL2NormBasedEvictionPolicy(VirtualTableEvictionPolicy):
    training_id_eviction_trigger_count: int = 0
    eviction_threshold: float = 0.0
    inference_eviction_threshold: float | None = None


@dataclass
class FeatureScoreBasedEvictionPolicy(VirtualTableEvictionPolicy):
    decay_rate: float = 0.99
    training_id_eviction_trigger_count: int = 0
    training_id_keep_count: int = 0
    eviction_ttl_mins: int = 0
    max_inference_id_num_per_rank: int = 0
    inference_eviction_feature_score_threshold: float | None = None
    inference_eviction_ttl_mins: int | None = None
    feature_score_mapping: dict[str, float] | None = None
    feature_score_default_value: float | None = None
    enable_auto_feature_score_collection: bool = False
    enable_eviction: bool = True


@dataclass
class FeatureScoreMapping:
    """Per-feature scores for score-based eviction (data)."""

    feature_score_mapping: dict[str, float] = field(default_factory=dict)
    eviction_enabled: bool = False
