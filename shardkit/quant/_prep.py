"""TorchRec's quantization switches: attributes set on float modules before quantizing
(``quant_prep_*``), which the quantized collections' ``from_float`` reads.

[Note: FBGEMM layout switches]
``register_tbes``, ``row_alignment`` and ``cache_features_order`` choose how FBGEMM's
table-batched modules store and order rows (registering them as submodules, padding each row to
``row_alignment`` bytes, caching the feature permutation). None changes what a lookup returns.
shardkit's quantized tables are stored in torch's layout, unpadded (see [Note: quantized rows]):
the switches are read, checked and kept on the module (``row_alignment`` must be a positive
integer), and the outputs are the same whatever they are, as in TorchRec. Splitting scale and
bias out of the state dict and row pruning do change what is stored: they are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

__all__ = [
    "DEFAULT_ROW_ALIGNMENT",
    "MODULE_ATTR_CACHE_FEATURES_ORDER",
    "MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT",
    "MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS",
    "MODULE_ATTR_REGISTER_TBES_BOOL",
    "MODULE_ATTR_REMOVE_STBE_PADDING_BOOL",
    "MODULE_ATTR_ROW_ALIGNMENT_INT",
    "MODULE_ATTR_USE_BATCHING_HINTED_OUTPUT",
    "MODULE_ATTR_USE_UNFLATTENED_LENGTHS_FOR_BATCHING",
    "for_each_module_of_type_do",
    "layout_switches",
    "quant_prep_customize_row_alignment",
    "quant_prep_enable_cache_features_order",
    "quant_prep_enable_quant_state_dict_split_scale_bias",
    "quant_prep_enable_quant_state_dict_split_scale_bias_for_types",
    "quant_prep_enable_register_tbes",
]

# TorchRec's attribute names (the values are TorchRec's, so either library's constant works).
MODULE_ATTR_REGISTER_TBES_BOOL = "__register_tbes_in_named_modules"
MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS = "__quant_state_dict_split_scale_bias"
MODULE_ATTR_ROW_ALIGNMENT_INT = "__register_row_alignment_in_named_modules"
MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT = "__emb_name_to_num_rows_post_pruning"
MODULE_ATTR_REMOVE_STBE_PADDING_BOOL = "__remove_stbe_padding"
MODULE_ATTR_USE_UNFLATTENED_LENGTHS_FOR_BATCHING = "__use_unflattened_lengths_for_batching"
MODULE_ATTR_USE_BATCHING_HINTED_OUTPUT = "__use_batching_hinted_output"
MODULE_ATTR_CACHE_FEATURES_ORDER = "__cache_features_order"
DEFAULT_ROW_ALIGNMENT = 16  # FBGEMM's row padding in bytes; see [Note: FBGEMM layout switches]


def for_each_module_of_type_do(
    module: nn.Module,
    module_types: Sequence[type[nn.Module]],
    op: Callable[[nn.Module], None],
) -> None:
    """TorchRec's helper: ``op(m)`` for every submodule ``m`` (``module`` included) of one of
    ``module_types``."""
    for child in module.modules():
        if isinstance(child, tuple(module_types)):
            op(child)


def quant_prep_enable_register_tbes(
    module: nn.Module, module_types: Sequence[type[nn.Module]]
) -> None:
    """Mark the modules of ``module_types`` in ``module`` to register their tables as
    submodules (see [Note: FBGEMM layout switches])."""
    for_each_module_of_type_do(
        module, module_types, lambda m: setattr(m, MODULE_ATTR_REGISTER_TBES_BOOL, True)
    )


def quant_prep_enable_quant_state_dict_split_scale_bias(module: nn.Module) -> None:
    """Mark ``module`` to write its n-bit tables' ``state_dict`` as TorchRec does with this
    switch: codes in ``weight``, float16 ``weight_qscale`` and ``weight_qbias`` (see [Note:
    TorchRec's quantized rows])."""
    setattr(module, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, True)


def quant_prep_enable_quant_state_dict_split_scale_bias_for_types(
    module: nn.Module, module_types: Sequence[type[nn.Module]]
) -> None:
    """`quant_prep_enable_quant_state_dict_split_scale_bias` for every module of
    ``module_types`` in ``module``."""
    for_each_module_of_type_do(
        module,
        module_types,
        lambda m: setattr(m, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, True),
    )


def quant_prep_customize_row_alignment(
    module: nn.Module, module_types: Sequence[type[nn.Module]], row_alignment: int
) -> None:
    """Set the row alignment of the modules of ``module_types`` in ``module``."""
    for_each_module_of_type_do(
        module, module_types, lambda m: setattr(m, MODULE_ATTR_ROW_ALIGNMENT_INT, row_alignment)
    )


def quant_prep_enable_cache_features_order(
    module: nn.Module, module_types: Sequence[type[nn.Module]]
) -> None:
    """Mark the modules of ``module_types`` in ``module`` to cache their feature order."""
    for_each_module_of_type_do(
        module, module_types, lambda m: setattr(m, MODULE_ATTR_CACHE_FEATURES_ORDER, True)
    )


def layout_switches(*modules: nn.Module) -> dict[str, Any]:
    """The switches ``from_float`` passes on, read from ``modules`` (the first that has each),
    as TorchRec reads them: ``register_tbes``, ``row_alignment``, ``cache_features_order``,
    ``quant_state_dict_split_scale_bias``.

    Raises:
        ValueError: row pruning asked for (refused; see [Note: FBGEMM layout switches]).
    """
    attrs = {
        "register_tbes": (MODULE_ATTR_REGISTER_TBES_BOOL, False),
        "row_alignment": (MODULE_ATTR_ROW_ALIGNMENT_INT, DEFAULT_ROW_ALIGNMENT),
        "cache_features_order": (MODULE_ATTR_CACHE_FEATURES_ORDER, False),
        "quant_state_dict_split_scale_bias": (MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, False),
    }
    out = {}
    for key, (attr, default) in attrs.items():
        found = [getattr(m, attr) for m in modules if hasattr(m, attr)]
        out[key] = found[0] if found else default
    if any(
        getattr(m, MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT, None) for m in modules
    ):
        raise ValueError(
            "row pruning (MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT) is not "
            "supported; quantize the whole tables"
        )
    return out


def check_row_alignment(row_alignment: Any) -> None:
    """``row_alignment`` must be a positive int (bytes)."""
    if isinstance(row_alignment, bool) or not isinstance(row_alignment, int) or row_alignment < 1:
        raise ValueError(
            f"row_alignment must be a positive number of bytes (FBGEMM's default "
            f"{DEFAULT_ROW_ALIGNMENT}), got {row_alignment!r}"
        )
