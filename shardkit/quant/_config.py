"""How a float module is quantized: TorchRec's ``QuantConfig`` and torch dtype -> `DataType`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from shardkit.modules import BaseEmbeddingConfig, DataType
from shardkit.quant._pack import check_data_type

__all__ = ["QuantConfig", "dtype_to_data_type", "quantized_configs"]

_DATA_TYPES = {
    torch.float32: DataType.FP32,
    torch.float16: DataType.FP16,
    torch.bfloat16: DataType.BF16,
    torch.qint8: DataType.INT8,
    torch.quint8: DataType.INT8,
    torch.int8: DataType.INT8,
    torch.uint8: DataType.INT8,
    torch.quint4x2: DataType.INT4,
    torch.quint2x4: DataType.INT2,
}


class QuantConfig(NamedTuple):
    """TorchRec's quantization config: ``weight().dtype`` is the tables' storage type (e.g.
    ``torch.qint8``, ``torch.quint4x2``, ``torch.float16``), ``activation().dtype`` the output's;
    ``per_table_weight_dtype`` overrides the storage per table name. ``weight`` and ``activation``
    are factories (torch's ``PlaceholderObserver.with_args(dtype=...)`` works too)."""

    activation: Callable[[], Any]
    weight: Callable[[], Any]
    per_table_weight_dtype: Mapping[str, torch.dtype] | None = None


def dtype_to_data_type(dtype: torch.dtype) -> DataType:
    """``torch.qint8`` -> INT8, ``torch.quint4x2`` -> INT4, ``torch.float16`` -> FP16, ..."""
    if dtype not in _DATA_TYPES:
        known = ", ".join(str(d) for d in _DATA_TYPES)
        raise ValueError(f"no table storage type for {dtype}; use one of {known}")
    return _DATA_TYPES[dtype]


def quantized_configs(
    configs: Sequence[BaseEmbeddingConfig], qconfig: Any
) -> list[BaseEmbeddingConfig]:
    """The configs with the data type ``qconfig`` gives each table (checked: see
    `check_data_type`)."""
    default = qconfig.weight().dtype
    per_table = getattr(qconfig, "per_table_weight_dtype", None) or {}
    out = []
    for config in configs:
        data_type = dtype_to_data_type(per_table.get(config.name, default))
        check_data_type(config.name, data_type, config.embedding_dim)
        out.append(dataclasses.replace(config, data_type=data_type))
    return out
