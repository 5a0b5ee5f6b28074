"""``fbgemm_gpu.split_table_batched_embeddings_ops_common``: FBGEMM's enums for where tables live,
how bags pool, how a cache evicts and how ids are bounds-checked (FBGEMM's members and values).

shardkit keeps every table whole in its rank's memory (`EmbeddingLocation.DEVICE`), pools by the
tables' `PoolingType`, has no cache, and checks ids itself: these are values, and the FBGEMM
settings that name them (UVM caching, ``bounds_check_mode``) are refused where they are given.
"""

from __future__ import annotations

import enum

__all__ = ["BoundsCheckMode", "CacheAlgorithm", "EmbeddingLocation", "PoolingMode"]


@enum.unique
class EmbeddingLocation(enum.IntEnum):
    DEVICE = 0
    MANAGED = 1
    MANAGED_CACHING = 2
    HOST = 3
    MTIA = 4


@enum.unique
class PoolingMode(enum.IntEnum):
    SUM = 0
    MEAN = 1
    NONE = 2


@enum.unique
class CacheAlgorithm(enum.Enum):
    LRU = 0
    LFU = 1


@enum.unique
class BoundsCheckMode(enum.IntEnum):
    FATAL = 0
    WARNING = 1
    IGNORE = 2
    NONE = 3
    V2_IGNORE = 4
    V2_WARNING = 5
    V2_FATAL = 6
