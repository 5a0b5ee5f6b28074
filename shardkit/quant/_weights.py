"""Reading and writing the stored rows of every quantized table in a model, by table name: what
TorchRec's ``get_table_to_weights_from_tbe`` / ``assign_weights_to_tbe`` do over FBGEMM's
table-batched modules, over shardkit's quantized collections.

A table's weights are ``(codes, scale_bias)``, the pair `quantize_state_dict` makes:
``codes`` ``[rows, code columns]`` (uint8 for INT8/INT4/INT2, the floats for FP32/FP16) and
``scale_bias`` ``[rows, 8]`` (INT8: float32 scale and bias as bytes) or ``[rows, 4]`` (INT4/INT2:
float16), None for the float types. See [Note: quantized rows] for the layout.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import nn

from shardkit.modules import BaseEmbeddingConfig
from shardkit.quant._collections import EmbeddingBagCollection, EmbeddingCollection
from shardkit.quant._pack import code_columns

__all__ = ["TableWeights", "assign_table_weights", "table_weights"]

TableWeights = tuple[torch.Tensor, torch.Tensor | None]


def _tables(model: nn.Module) -> Iterator[tuple[BaseEmbeddingConfig, torch.Tensor]]:
    """Every quantized table of ``model``: its config and its stored rows (a live view)."""
    for module in model.modules():
        configs: list[BaseEmbeddingConfig]
        if isinstance(module, EmbeddingBagCollection):
            configs, tables = list(module.embedding_bag_configs()), module.embedding_bags
        elif isinstance(module, EmbeddingCollection):
            configs, tables = list(module.embedding_configs()), module.embeddings
        else:
            continue
        for config in configs:
            rows = tables[config.name].weight
            assert isinstance(rows, torch.Tensor), "a table holder keeps its rows as buffer weight"
            yield config, rows


def table_weights(model: nn.Module) -> dict[str, TableWeights]:
    """``{table name: (codes, scale_bias or None)}`` of every quantized collection in ``model``
    (views of the stored rows)."""
    out: dict[str, TableWeights] = {}
    for config, stored in _tables(model):
        codes = code_columns(config.embedding_dim, config.data_type)
        out[config.name] = (
            stored[:, :codes],
            stored[:, codes:] if stored.shape[1] > codes else None,
        )
    return out


def assign_table_weights(model: nn.Module, weights: Mapping[str, TableWeights]) -> None:
    """Copy ``weights`` (as `table_weights` gives them) into the quantized tables of ``model``
    in place; every table of ``model`` must be in ``weights`` with its stored shape and dtype.

    Raises:
        ValueError: naming the table that is missing or does not fit.
    """
    for config, stored in _tables(model):
        if config.name not in weights:
            raise ValueError(
                f"no weights for quantized table {config.name!r}; got {sorted(weights)}"
            )
        codes, scale_bias = weights[config.name]
        rows = codes if scale_bias is None else torch.cat([codes, scale_bias], 1)
        if rows.shape != stored.shape or rows.dtype != stored.dtype:
            raise ValueError(
                f"weights of table {config.name!r} are {tuple(rows.shape)} {rows.dtype} (codes "
                f"and scale/bias side by side); the table stores {tuple(stored.shape)} "
                f"{stored.dtype} ({config.data_type.name}): quantize with the same data type"
            )
        with torch.no_grad():
            stored.copy_(rows)
