"""Turning a trained float model into a quantized one for serving, TorchRec's
``torchrec.inference.modules.quantize_embeddings``."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from shardkit.compat import refuse
from shardkit.inference._sharded import shard_quant_model
from shardkit.modules import EmbeddingBagCollection, EmbeddingCollection
from shardkit.quant import EmbeddingBagCollection as QuantEmbeddingBagCollection
from shardkit.quant import EmbeddingCollection as QuantEmbeddingCollection
from shardkit.quant import QuantConfig

__all__ = [
    "DEFAULT_QUANT_MAPPING",
    "quantize_embeddings",
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
    targets = {EmbeddingBagCollection, *(additional_qconfig_spec_keys or ())}
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


_PREDICT = (
    "part of TorchRec's TorchScript/gRPC predict stack; shardkit serves from a plain process: "
    "build the model, quantize_embeddings, load the exported state dict "
    "(examples/serve_quantized.py, docs/serving.md)"
)
_TBE = "FBGEMM table-batched-embedding weights; shardkit's quantized tables are not TBEs"
__getattr__ = refuse(
    __name__,
    {
        **{
            name: _PREDICT
            for name in (
                "BatchingMetadata",
                "PredictFactory",
                "PredictModule",
                "QualNameMetadata",
            )
        },
        "quantize_inference_model": "TorchRec's one-call quantization for TorchScript "
        "inference; shardkit.inference.quantize_embeddings quantizes the tables (feature "
        "processors and managed collision keep working around them)",
        "quantize_feature": "casts float features to fp16 for TorchScript inference; shardkit "
        "serves float features as they are",
        "DEFAULT_FUSED_PARAMS": _TBE,
        "FEATURE_PROCESSED_EBC_TYPE": "TorchRec's key for quantizing feature-processed "
        "collections; quantize_embeddings quantizes their tables and keeps the float position "
        "weights",
        "DEFAULT_SHARDERS": "TorchRec's quantized sharders for its TorchScript predict stack; "
        "shard_quant_model spreads quantized tables table-wise over ranks itself",
        "assign_weights_to_tbe": _TBE,
        "get_table_to_weights_from_tbe": _TBE,
        "quantize_dense": "shardkit keeps dense layers float32 for serving; "
        "torch.ao.quantization.quantize_dynamic quantizes nn.Linear layers if you want it",
        "set_pruning_data": "row pruning of quantized tables is not supported; serve the whole "
        "table",
    },
)
