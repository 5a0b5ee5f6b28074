"""TorchRec's vocabulary of sharded embedding modules (``torchrec.distributed.embedding_types``):
lists of KJTs passed between a module's steps, the configs of sharded tables and of groups of
them, FBGEMM's optimizer and location names, and the interfaces of sharded embedding modules
and their lookups.

shardkit's sharded collections are `ShardedEmbeddingModule`s (`_embedding_module`); their kernel
groups are described by their own classes (`ShardGroupSpec`), which these configs mirror for
code that reads TorchRec's.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardkit.modules import DataType, EmbeddingTableConfig, PoolingType
from shardkit.sparse import KeyedJaggedTensor
from shardkit.streamable import Multistreamable
from shardkit.types import (
    EmbeddingComputeKernel,
    EmbeddingLocation,
    ModuleSharder,
    StorageUsageType,
    compute_storage_usage,
)

__all__ = [
    "BaseEmbeddingLookup",
    "BaseEmbeddingUpdate",
    "BaseGroupedFeatureProcessor",
    "BaseQuantEmbeddingSharder",
    "DTensorMetadata",
    "EmbeddingAttributes",
    "GroupedEmbeddingConfig",
    "InputDistOutputs",
    "KJTList",
    "ListOfKJTList",
    "OptimType",
    "ShardedConfig",
    "ShardedEmbeddingTable",
    "ShardedMetaConfig",
    "compute_kernel_to_embedding_location",
]


class OptimType(enum.Enum):
    """TorchRec's names of optimizers (shardkit fuses SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM)."""

    SGD = "SGD"
    LARS_SGD = "LARS_SGD"
    LAMB = "LAMB"
    PARTIAL_ROWWISE_LAMB = "PARTIAL_ROWWISE_LAMB"
    ADAM = "ADAM"
    PARTIAL_ROWWISE_ADAM = "PARTIAL_ROWWISE_ADAM"
    ADAGRAD = "ADAGRAD"
    ROWWISE_ADAGRAD = "ROWWISE_ADAGRAD"
    SHAMPOO = "SHAMPOO"
    SHAMPOO_V2 = "SHAMPOO_V2"
    LION = "LION"
    ADAMW = "ADAMW"
    SHAMPOO_V2_MRS = "SHAMPOO_V2_MRS"
    SHAMPOO_MRS = "SHAMPOO_MRS"
    MUON = "MUON"
    SHAMPOO_V3_MRS = "SHAMPOO_V3_MRS"


def compute_kernel_to_embedding_location(
    compute_kernel: EmbeddingComputeKernel | str,
) -> EmbeddingLocation:
    """Where a kernel keeps its table: shardkit's kernels keep it in device memory."""
    EmbeddingComputeKernel.parse(compute_kernel)  # refuses UVM and other FBGEMM kernels
    return EmbeddingLocation.DEVICE


class KJTList(Multistreamable):
    """A list of KeyedJaggedTensors (one per sharding), indexable and iterable."""

    def __init__(self, features: list[KeyedJaggedTensor]) -> None:
        self.features = features

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, key: int) -> KeyedJaggedTensor:
        return self.features[key]

    def __setitem__(self, key: int, item: KeyedJaggedTensor) -> None:
        self.features[key] = item

    def __iter__(self) -> Iterator[KeyedJaggedTensor]:
        return iter(self.features)

    def record_stream(self, stream: torch.Stream) -> None:
        for feature in self.features:
            feature.record_stream(stream)


class ListOfKJTList(Multistreamable):
    """A list of `KJTList`s."""

    def __init__(self, features: list[KJTList]) -> None:
        self.features_list = features

    def __len__(self) -> int:
        return len(self.features_list)

    def __getitem__(self, key: int) -> KJTList:
        return self.features_list[key]

    def __setitem__(self, key: int, item: KJTList) -> None:
        self.features_list[key] = item

    def __iter__(self) -> Iterator[KJTList]:
        return iter(self.features_list)

    def record_stream(self, stream: torch.Stream) -> None:
        for features in self.features_list:
            features.record_stream(stream)


@dataclass
class InputDistOutputs(Multistreamable):
    """What an input dist delivers: the features, and row-wise bucketization's tensors."""

    features: KJTList
    unbucketize_permute_tensor: torch.Tensor | None = None
    bucket_mapping_tensor: torch.Tensor | None = None
    bucketized_length: torch.Tensor | None = None

    def record_stream(self, stream: torch.Stream) -> None:
        self.features.record_stream(stream)
        for tensor in (self.unbucketize_permute_tensor, self.bucket_mapping_tensor,
                       self.bucketized_length):  # fmt: skip
            if tensor is not None:
                tensor.record_stream(stream)


@dataclass(frozen=True)
class ShardedConfig:
    """The size of this rank's shard of a table."""

    local_rows: int = 0
    local_cols: int = 0


@dataclass(frozen=True)
class DTensorMetadata:
    """How a table's shards form a DTensor (mesh, placements, global size and stride)."""

    mesh: Any = None
    placements: tuple | None = None
    size: tuple[int, ...] | None = None
    stride: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ShardedMetaConfig(ShardedConfig):
    """`ShardedConfig` with the shard's and the table's sharded-tensor metadata."""

    local_metadata: Any = None
    global_metadata: Any = None
    dtensor_metadata: DTensorMetadata | None = None


@dataclass(frozen=True)
class EmbeddingAttributes:
    compute_kernel: EmbeddingComputeKernel = EmbeddingComputeKernel.DENSE


@dataclass(frozen=True)
class ShardedEmbeddingTable(ShardedMetaConfig, EmbeddingAttributes, EmbeddingTableConfig):
    """A table as one rank's lookup sees it: its config, kernel and shard."""

    fused_params: dict[str, Any] | None = None


@dataclass
class GroupedEmbeddingConfig:
    """Tables looked up by one batched kernel (same dtype, pooling, weighting and kernel)."""

    data_type: DataType
    pooling: PoolingType
    is_weighted: bool
    has_feature_processor: bool
    compute_kernel: EmbeddingComputeKernel
    embedding_tables: list[ShardedEmbeddingTable]
    fused_params: dict[str, Any] | None = None
    enable_embedding_update: bool = False

    def feature_hash_sizes(self) -> list[int]:
        return [t.num_embeddings for t in self.embedding_tables for _ in t.feature_names]

    def num_features(self) -> int:
        return sum(t.num_features() for t in self.embedding_tables)

    def dim_sum(self) -> int:
        return sum(t.num_features() * t.local_cols for t in self.embedding_tables)

    def table_names(self) -> list[str]:
        return [t.name for t in self.embedding_tables]

    def feature_names(self) -> list[str]:
        return [f for t in self.embedding_tables for f in t.feature_names]

    def embedding_dims(self) -> list[int]:
        return [t.local_cols for t in self.embedding_tables for _ in t.feature_names]

    def embedding_names(self) -> list[str]:
        return [n for t in self.embedding_tables for n in t.embedding_names]

    def embedding_shard_metadata(self) -> list[Any]:
        return [t.local_metadata for t in self.embedding_tables for _ in t.feature_names]

    def is_using_virtual_table(self) -> bool:
        return any(t.use_virtual_table for t in self.embedding_tables)


class BaseEmbeddingLookup(abc.ABC, nn.Module):
    """A module that looks up the features it is given (one kernel per group of tables)."""

    @abc.abstractmethod
    def forward(self, sparse_features: Any) -> Any:
        """Features in, embeddings out."""


class BaseEmbeddingUpdate(abc.ABC, nn.Module):
    """A module that writes embeddings into its tables."""

    @abc.abstractmethod
    def forward(self, embeddings: Any) -> None:
        """Write ``embeddings``."""


class BaseGroupedFeatureProcessor(nn.Module):
    """Processes the features of a group of tables before their lookup (e.g. position
    weights); subclasses implement ``forward(features) -> features``."""

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        raise NotImplementedError(f"{type(self).__name__} must implement forward(features)")


class BaseQuantEmbeddingSharder(ModuleSharder):
    """The sharder base of TorchRec's quantized (inference) collections: its descriptor
    methods, with a quantized table's storage (a scale and a bias per row). Sharding quantized
    collections belongs to quantized serving."""

    def __init__(
        self,
        fused_params: Mapping[str, Any] | None = None,
        shardable_params: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self._fused_params = dict(fused_params) if fused_params is not None else None
        self._shardable_params = list(shardable_params or [])

    @property
    def fused_params(self) -> dict[str, Any] | None:
        return self._fused_params

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        tables = {n.split(".")[-2]: p for n, p in module.named_parameters() if n.count(".") == 2}
        if self._shardable_params:
            tables = {n: p for n, p in tables.items() if n in self._shardable_params}
        return tables

    def storage_usage(
        self, tensor: torch.Tensor, compute_device_type: str, compute_kernel: str
    ) -> dict[str, int]:
        return compute_storage_usage(
            tensor, compute_device_type, compute_kernel, StorageUsageType.BASE_QUANT
        )
