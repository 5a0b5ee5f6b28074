"""TorchRec's smaller sharding vocabulary (``torchrec.distributed.types``): enums that name
devices, storage, comm ops and pipelines, the parameters of FBGEMM's caches and key-value tables
(data that shardkit refuses where it is used: shardkit keeps every shard whole in its rank's
memory), plans of object pools, and storage-size helpers.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "CacheParams",
    "CacheStatistics",
    "CommOp",
    "ComputeDevice",
    "ComputeKernel",
    "EmbeddingEvent",
    "KeyValueParams",
    "ModuleShardingPlan",
    "ObjectPoolShardingPlan",
    "ObjectPoolShardingType",
    "ParameterStorage",
    "PipelineType",
    "ShardingBucketMetadata",
    "ShardingStrategy",
    "StorageUsageType",
    "compute_storage_usage",
    "get_tensor_size_bytes",
    "rank_device",
]


class EmbeddingEvent(enum.Enum):
    """Steps of a sharded lookup, as profiler labels name them."""

    KJT_SPLITS_DIST = "splits_dist"
    KJT_TENSORS_DIST = "tensors_dist"
    LOOKUP = "lookup"
    OUTPUT_DIST = "output_dist"
    OUTPUT_DIST_WAIT = "output_dist_wait"


class PipelineType(enum.Enum):
    """The train pipelines (``shardkit.distributed.train_pipeline``)."""

    NONE = "none"
    TRAIN_BASE = "train_base"
    TRAIN_SPARSE_DIST = "train_sparse_dist"
    TRAIN_PREFETCH_SPARSE_DIST = "train_prefetch_sparse_dist"


class ParameterStorage(enum.Enum):
    """Memory a shard occupies: GPU memory or host memory."""

    HBM = "hbm"
    DDR = "ddr"


class StorageUsageType(enum.Enum):
    """Which sharder's rule `compute_storage_usage` applies."""

    BASE_QUANT = "BaseQuantEmbeddingSharder"
    BASE = "BaseEmbeddingSharder"
    DEFAULT = "ModuleSharder"


class ComputeDevice(enum.Enum):
    """Where lookups run."""

    CUDA = "cuda"
    CPU = "cpu"
    MTIA = "mtia"


@enum.unique
class ComputeKernel(enum.Enum):
    """The kernel of modules other than embedding collections (only a default)."""

    DEFAULT = "default"


class CommOp(enum.Enum):
    """The collectives a quantized comm codec may apply to (keys of a codecs registry)."""

    POOLED_EMBEDDINGS_ALL_TO_ALL = "pooled_embeddings_all_to_all"
    POOLED_EMBEDDINGS_REDUCE_SCATTER = "pooled_embeddings_reduce_scatter"
    SEQUENCE_EMBEDDINGS_ALL_TO_ALL = "sequence_embeddings_all_to_all"


class ShardingStrategy(enum.Enum):
    """TorchRec's strategies for 2D parallelism (`DMPCollection`: shardkit has ``DEFAULT`` and
    ``PER_MODULE`` without submodule configs, the same thing)."""

    DEFAULT = "default"
    PER_MODULE = "per_module"
    FULLY_SHARDED = "fully_sharded"


class CacheStatistics(abc.ABC):
    """Statistics of a table's ids that size an FBGEMM cache (TorchRec's interface)."""

    @property
    @abc.abstractmethod
    def expected_lookups(self) -> float:
        """Distinct ids expected in one global batch."""

    @abc.abstractmethod
    def expected_miss_rate(self, clf: float) -> float:
        """Miss rate of a cache holding ``clf`` of the table's rows (1.0 at 0, 0.0 at 1)."""

    @property
    @abc.abstractmethod
    def cacheability(self) -> float:
        """0: very cacheable ... 1: not at all."""


@dataclass
class CacheParams:
    """FBGEMM's UVM-cache settings for a table (TorchRec's fields).

    shardkit has no cache: every shard lives whole in its rank's memory. A `CacheParams` is
    data; giving one to a plan or to the planner's constraints is refused by name.
    """

    algorithm: Any = None
    load_factor: float | None = None
    reserved_memory: float | None = None
    precision: Any = None
    prefetch_pipeline: bool | None = None
    stats: CacheStatistics | None = None
    multipass_prefetch_config: Any = None

    def __hash__(self) -> int:
        return hash((self.algorithm, self.load_factor, self.reserved_memory, self.precision,
                     self.prefetch_pipeline, self.multipass_prefetch_config))  # fmt: skip


@dataclass
class KeyValueParams:
    """FBGEMM's SSD / parameter-server table settings (TorchRec's fields); like `CacheParams`,
    data that shardkit refuses where it is used."""

    ssd_storage_directory: str | None = None
    ssd_rocksdb_write_buffer_size: int | None = None
    ssd_rocksdb_shards: int | None = None
    gather_ssd_cache_stats: bool | None = None
    stats_reporter_config: Any = None
    use_passed_in_path: bool = True
    l2_cache_size: int | None = None
    max_l1_cache_size: int | None = None
    enable_async_update: bool | None = None
    bulk_init_chunk_size: int | None = None
    lazy_bulk_init_enabled: bool | None = None
    enable_raw_embedding_streaming: bool | None = None
    res_store_shards: int | None = None
    kvzch_tbe_config: Any = None
    load_ckpt_without_opt: bool = False
    ps_hosts: tuple[tuple[str, int], ...] | None = None
    ps_client_thread_num: int | None = None
    ps_max_key_per_request: int | None = None
    ps_max_local_index_length: int | None = None

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, name) for name in self.__dataclass_fields__))


class ModuleShardingPlan:
    """The plan of one module (base of `EmbeddingModuleShardingPlan`)."""

    def _serialize(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} does not serialize")


class ObjectPoolShardingType(enum.Enum):
    """How TorchRec shards an object pool (pools are not in shardkit)."""

    ROW_WISE = "row_wise"
    REPLICATED_ROW_WISE = "replicated_row_wise"


@dataclass
class ObjectPoolShardingPlan(ModuleShardingPlan):
    """TorchRec's plan of an object pool; data only (shardkit shards no object pools)."""

    sharding_type: ObjectPoolShardingType
    inference: bool = False
    memory_capacity_per_rank: list[int] | None = None

    def _serialize(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sharding_type": self.sharding_type.name,
            "inference": self.inference,
        }
        if self.memory_capacity_per_rank is not None:
            out["memory_capacity_per_rank"] = self.memory_capacity_per_rank
        return out


@dataclass
class ShardingBucketMetadata:
    """Buckets of a row-wise table: ``num_buckets_per_shard[i]`` buckets of ``bucket_size``
    rows in shard ``i``, its first one number ``bucket_offsets_per_shard[i]``."""

    num_buckets_per_shard: list[int]
    bucket_offsets_per_shard: list[int]
    bucket_size: int


def get_tensor_size_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements."""
    return t.numel() * t.element_size()


def compute_storage_usage(
    tensor: torch.Tensor,
    compute_device_type: str,
    compute_kernel: str,
    storage_usage_type: StorageUsageType,
) -> dict[str, int]:
    """``{"hbm": bytes}`` on GPUs, ``{"ddr": bytes}`` on CPUs (TorchRec's rule for shardkit's
    kernels, which keep a table in the compute device's memory)."""
    del compute_kernel
    size = get_tensor_size_bytes(tensor)
    if StorageUsageType(storage_usage_type) == StorageUsageType.BASE_QUANT:
        size += tensor.shape[0] * 4  # a scale and a bias per row
    kind = ParameterStorage.DDR if compute_device_type == "cpu" else ParameterStorage.HBM
    return {kind.value: size}


def rank_device(device_type: str, rank: int) -> torch.device:
    """``cpu``, or ``<device_type>:<rank>``."""
    if device_type == "cpu":
        return torch.device("cpu")
    return torch.device(f"{device_type}:{rank}")
