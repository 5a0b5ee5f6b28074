"""``torchrec.distributed.fbgemm_qcomm_codec``: quantized comm configs and codec registries
(the sharders accept None or no-op codecs; see `shardkit.types.ModuleSharder`)."""

from shardkit.sharding import (
    CommType,
    QCommsConfig,
    comm_type_to_sparse_type,
    get_qcomm_codecs,
    get_qcomm_codecs_registry,
)

__all__ = [
    "CommType",
    "QCommsConfig",
    "comm_type_to_sparse_type",
    "get_qcomm_codecs",
    "get_qcomm_codecs_registry",
]
