"""Quantizing the tables of a saved float ``state_dict`` (what ``shardkit export --quantize``
writes), with no model at hand."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from shardkit.modules import DataType
from shardkit.quant._pack import check_data_type, pack

__all__ = ["quantize_table_weights"]

_TABLE_KEY = re.compile(r"(^|\.)(embedding_bags|embeddings)\.([^.]+)\.weight$")


def quantize_table_weights(
    state_dict: Mapping[str, torch.Tensor],
    data_type: DataType,
    *,
    per_table_data_type: Mapping[str, DataType] | None = None,
) -> dict[str, torch.Tensor]:
    """``state_dict`` with every table (each ``...embedding_bags.<table>.weight`` and
    ``...embeddings.<table>.weight``, 2-D float) stored as ``data_type`` (see [Note: quantized
    rows]); other entries unchanged. The result loads into the same model after
    `shardkit.inference.quantize_embeddings` with that data type (``assign=True`` on meta).

    Raises:
        ValueError: naming the table, if it cannot be stored so (e.g. INT4 with an odd dim).
    """
    per_table = per_table_data_type or {}
    out = {}
    for key, tensor in state_dict.items():
        match = _TABLE_KEY.search(key)
        if match is None or tensor.dim() != 2 or not tensor.is_floating_point():
            out[key] = tensor
            continue
        table = match.group(3)
        chosen = per_table.get(table, data_type)
        check_data_type(table, chosen, tensor.shape[1])
        out[key] = pack(tensor, chosen)
    return out
