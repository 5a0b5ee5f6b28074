"""Turning a trained float model into a quantized one for serving, TorchRec's
``torchrec.inference.modules``: `quantize_embeddings`, `quantize_inference_model`, the predict
interfaces (`PredictModule`, `PredictFactory`, ...) and the tables' weights by name."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from shardkit.compat import refuse
from shardkit.inference._predict import (
    BatchingMetadata,
    PredictFactory,
    PredictModule,
    QualNameMetadata,
    quantize_dense,
    quantize_feature,
)
from shardkit.inference._sharded import shard_quant_model
from shardkit.modules import EmbeddingBagCollection, EmbeddingCollection
from shardkit.modules.embedding_configs import QuantConfig
from shardkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from shardkit.quant import EmbeddingBagCollection as QuantEmbeddingBagCollection
from shardkit.quant import EmbeddingCollection as QuantEmbeddingCollection
from shardkit.quant import TableWeights, assign_table_weights, table_weights
from shardkit.quant.embedding_modules import (
    FeatureProcessedEmbeddingBagCollection as QuantFeatureProcessedEmbeddingBagCollection,
)
from shardkit.quant.embedding_modules import (
    quant_prep_enable_cache_features_order,
    quant_prep_enable_register_tbes,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_QUANTIZATION_DTYPE",
    "DEFAULT_QUANT_MAPPING",
    "FEATURE_PROCESSED_EBC_TYPE",
    "BatchingMetadata",
    "PredictFactory",
    "PredictModule",
    "QualNameMetadata",
    "assign_weights_to_tbe",
    "get_table_to_weights_from_tbe",
    "quantize_dense",
    "quantize_embeddings",
    "quantize_feature",
    "quantize_inference_model",
    "shard_quant_model",
    "trim_torch_package_prefix_from_typename",
]


def trim_torch_package_prefix_from_typename(typename: str) -> str:
    """TorchRec's helper: ``"<torch_package_0>.a.B"`` -> ``"a.B"`` (other names unchanged)."""
    if typename.startswith("<torch_package_"):
        typename = ".".join(typename.split(".")[1:])
    return typename


# float collection's type name -> its quantized class (TorchRec's table, shardkit's classes)
DEFAULT_QUANT_MAPPING: dict[str, type[nn.Module]] = {
    torch.typename(EmbeddingBagCollection): QuantEmbeddingBagCollection,
    torch.typename(EmbeddingCollection): QuantEmbeddingCollection,
}


DEFAULT_QUANTIZATION_DTYPE: torch.dtype = torch.int8  # INT8 rows, as TorchRec's default
FEATURE_PROCESSED_EBC_TYPE: str = trim_torch_package_prefix_from_typename(
    torch.typename(FeatureProcessedEmbeddingBagCollection)
)


def quantize_embeddings(
    module: nn.Module,
    dtype: torch.dtype,
    inplace: bool,
    additional_qconfig_spec_keys: Sequence[type[nn.Module]] | None = None,
    additional_mapping: Mapping[type[nn.Module], type[nn.Module]] | None = None,
    output_dtype: torch.dtype = torch.float,
    per_table_weight_dtype: Mapping[str, torch.dtype] | None = None,
) -> nn.Module:
    """Replace every float `EmbeddingBagCollection` in ``module`` by its quantized copy.

    As in TorchRec, only ``EmbeddingBagCollection`` is quantized unless more types are given:
    ``additional_qconfig_spec_keys=[EmbeddingCollection]`` quantizes those too (to
    `shardkit.quant.EmbeddingCollection`; ``additional_mapping`` names other targets). Modules
    around the tables (`FeatureProcessedEmbeddingBagCollection`, managed collision, DLRM) keep
    working: their collection is swapped in place. Works on the meta device too (then load a
    quantized ``state_dict`` with ``assign=True``).

    Args:
        module: the model (or a collection itself: then use the returned module).
        dtype: how tables are stored: ``torch.qint8`` (INT8), ``torch.quint4x2`` (INT4),
            ``torch.quint2x4`` (INT2), ``torch.float16`` or ``torch.float32``.
        inplace: change ``module`` itself (else a deep copy).
        output_dtype: dtype of the pooled output, ``torch.float`` or ``torch.half``.
        per_table_weight_dtype: ``{table name: dtype}`` overriding ``dtype`` for those tables.

    Returns:
        The quantized model.
    """
    qconfig = QuantConfig(
        activation=with_dtype(output_dtype),
        weight=with_dtype(dtype),
        per_table_weight_dtype=per_table_weight_dtype,
    )
    mapping: dict[type[nn.Module], type[nn.Module]] = {
        EmbeddingBagCollection: QuantEmbeddingBagCollection,
        EmbeddingCollection: QuantEmbeddingCollection,
        **(additional_mapping or {}),
    }
    targets: set[type[nn.Module]] = {EmbeddingBagCollection, *(additional_qconfig_spec_keys or ())}
    if not inplace:
        module = copy.deepcopy(module)
    return _swap(module, targets, mapping, qconfig)


def with_dtype(dtype: torch.dtype) -> Callable[[], Any]:
    """What TorchRec passes as ``QuantConfig.weight``/``activation``: a factory of an object with
    ``.dtype`` (as torch's ``PlaceholderObserver.with_args(dtype=...)``)."""
    return lambda: SimpleNamespace(dtype=dtype)


def _swap(
    module: nn.Module,
    targets: set[type[nn.Module]],
    mapping: Mapping[type[nn.Module], type[nn.Module]],
    qconfig: QuantConfig,
) -> nn.Module:
    if type(module) in targets:
        if type(module) not in mapping:
            raise ValueError(
                f"no quantized module for {type(module).__name__}; give additional_mapping="
                f"{{{type(module).__name__}: <its quantized class>}}"
            )
        module.qconfig = qconfig  # type: ignore[assignment]
        return mapping[type(module)].from_float(module)  # type: ignore[attr-defined]
    for name, child in list(module.named_children()):
        swapped = _swap(child, targets, mapping, qconfig)
        if swapped is not child:
            setattr(module, name, swapped)
    return module


def quantize_inference_model(
    model: nn.Module,
    quantization_mapping: Mapping[str, type[nn.Module]] | None = None,
    per_table_weight_dtype: Mapping[str, torch.dtype] | None = None,
    fp_weight_dtype: torch.dtype = DEFAULT_QUANTIZATION_DTYPE,
    quantization_dtype: torch.dtype = DEFAULT_QUANTIZATION_DTYPE,
    output_dtype: torch.dtype = torch.float,
) -> nn.Module:
    """Quantize ``model``'s embedding collections in place for serving (TorchRec's one call).

    Each `FeatureProcessedEmbeddingBagCollection` becomes a quantized one
    (`shardkit.quant.embedding_modules.FeatureProcessedEmbeddingBagCollection`, position weights
    kept float) with tables stored as ``fp_weight_dtype``; every module whose type name is in
    ``quantization_mapping`` (default `DEFAULT_QUANT_MAPPING`: bag and plain collections, also
    inside managed-collision modules) is swapped for its quantized class with
    ``quantization_dtype``; ``per_table_weight_dtype`` overrides either per table.

    Returns:
        ``model``, quantized.
    """
    mapping = DEFAULT_QUANT_MAPPING if quantization_mapping is None else quantization_mapping
    qconfig = QuantConfig(with_dtype(output_dtype), with_dtype(fp_weight_dtype),
                          per_table_weight_dtype)  # fmt: skip
    for name, module in list(model.named_modules()):
        if type(module) is FeatureProcessedEmbeddingBagCollection:
            quant_prep_enable_register_tbes(module, [FeatureProcessedEmbeddingBagCollection])
            quant_prep_enable_cache_features_order(module, [FeatureProcessedEmbeddingBagCollection])
            module.qconfig = qconfig  # type: ignore[assignment]
            _replace(model, name, QuantFeatureProcessedEmbeddingBagCollection.from_float(module))
    names = {type(m): trim_torch_package_prefix_from_typename(torch.typename(m))
             for m in model.modules()}  # fmt: skip
    swap = {cls: mapping[name] for cls, name in names.items() if name in mapping}
    quant_prep_enable_register_tbes(model, list(swap))
    quant_prep_enable_cache_features_order(model, [EmbeddingBagCollection, EmbeddingCollection])
    logger.info("quantizing %s to %s (per table: %s)", sorted(t.__name__ for t in swap),
                quantization_dtype, per_table_weight_dtype)  # fmt: skip
    return quantize_embeddings(model, dtype=quantization_dtype, inplace=True,
                               additional_qconfig_spec_keys=list(swap), additional_mapping=swap,
                               output_dtype=output_dtype,
                               per_table_weight_dtype=per_table_weight_dtype)  # fmt: skip


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` where ``model``'s submodule ``name`` is (``""``: cannot, the model itself)."""
    if not name:
        raise ValueError(
            "quantize_inference_model swaps submodules; the model itself is a "
            "FeatureProcessedEmbeddingBagCollection: use QuantFeatureProcessedEmbeddingBag"
            "Collection.from_float (shardkit.quant.embedding_modules) on it"
        )
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, new)


def get_table_to_weights_from_tbe(model: nn.Module) -> dict[str, TableWeights]:
    """``{table name: (codes, scale_bias or None)}`` of every quantized table in ``model``
    (TorchRec reads them from FBGEMM's table-batched modules; see `shardkit.quant.table_weights`
    for the layout)."""
    return table_weights(model)


def assign_weights_to_tbe(model: nn.Module, table_to_weight: Mapping[str, TableWeights]) -> None:
    """Copy ``table_to_weight`` (as `get_table_to_weights_from_tbe` gives it) into ``model``'s
    quantized tables, in place."""
    assign_table_weights(model, table_to_weight)


_TBE = "FBGEMM table-batched-embedding weights; shardkit's quantized tables are not TBEs"
__getattr__ = refuse(
    __name__,
    {
        "DEFAULT_FUSED_PARAMS": _TBE,
        "DEFAULT_SHARDERS": "TorchRec's quantized sharders for its TorchScript predict stack; "
        "shard_quant_model spreads quantized tables table-wise over ranks itself",
        "set_pruning_data": "row pruning of quantized tables is not supported; serve the whole "
        "table",
    },
)
