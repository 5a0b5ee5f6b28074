"""How a float module is quantized: the data type TorchRec's ``QuantConfig`` gives each table."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from shardkit.modules import BaseEmbeddingConfig, DataType
from shardkit.modules.embedding_configs import dtype_to_data_type
from shardkit.quant._pack import check_data_type

__all__ = ["quantized_configs"]

# [Note: uint8 storage] `dtype_to_data_type` answers as TorchRec does: torch.uint8 is
# DataType.UINT8, the qint8/quint8/int8 family DataType.INT8. A table asked for in UINT8 is
# stored in INT8's rows (the same bytes: uint8 codes with a scale and bias), as FBGEMM stores
# both as SparseType.INT8 (`data_type_to_sparse_type`).
_STORED_AS = {DataType.UINT8: DataType.INT8}


def quantized_configs(
    configs: Sequence[BaseEmbeddingConfig], qconfig: Any
) -> list[BaseEmbeddingConfig]:
    """The configs with the data type ``qconfig`` (a `QuantConfig`) gives each table: its
    ``weight().dtype``, or ``per_table_weight_dtype[name]`` (checked: see `check_data_type`)."""
    default = qconfig.weight().dtype
    per_table = getattr(qconfig, "per_table_weight_dtype", None) or {}
    out = []
    for config in configs:
        data_type = dtype_to_data_type(per_table.get(config.name, default))
        data_type = _STORED_AS.get(data_type, data_type)  # See [Note: uint8 storage]
        check_data_type(config.name, data_type, config.embedding_dim)
        out.append(dataclasses.replace(config, data_type=data_type))
    return out
