"""TorchRec's ``torchrec.quant.embedding_modules``: quantized embedding collections for serving
on CPU (torch's quantized operators; see `shardkit.quant`), the ones with feature processors or
managed collision in front, and TorchRec's quantization switches.

Build them from trained float modules::

    quantized = EmbeddingBagCollection.from_float(ebc)  # ebc.qconfig set, or use:
    model = quantize_embeddings(model, dtype=torch.qint8, inplace=True)  # shardkit.inference
"""

from shardkit.compat import refuse
from shardkit.quant._collections import (
    EmbeddingBagCollection,
    EmbeddingCollection,
    quantize_state_dict,
)
from shardkit.quant._composed import (
    FeatureProcessedEmbeddingBagCollection,
    QuantManagedCollisionEmbeddingBagCollection,
    QuantManagedCollisionEmbeddingCollection,
)
from shardkit.quant._prep import (
    DEFAULT_ROW_ALIGNMENT,
    MODULE_ATTR_CACHE_FEATURES_ORDER,
    MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS,
    MODULE_ATTR_REGISTER_TBES_BOOL,
    MODULE_ATTR_REMOVE_STBE_PADDING_BOOL,
    MODULE_ATTR_ROW_ALIGNMENT_INT,
    MODULE_ATTR_USE_BATCHING_HINTED_OUTPUT,
    MODULE_ATTR_USE_UNFLATTENED_LENGTHS_FOR_BATCHING,
    for_each_module_of_type_do,
    quant_prep_customize_row_alignment,
    quant_prep_enable_cache_features_order,
    quant_prep_enable_quant_state_dict_split_scale_bias,
    quant_prep_enable_quant_state_dict_split_scale_bias_for_types,
    quant_prep_enable_register_tbes,
)

__all__ = [
    "DEFAULT_ROW_ALIGNMENT",
    "MODULE_ATTR_CACHE_FEATURES_ORDER",
    "MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS",
    "MODULE_ATTR_REGISTER_TBES_BOOL",
    "MODULE_ATTR_REMOVE_STBE_PADDING_BOOL",
    "MODULE_ATTR_ROW_ALIGNMENT_INT",
    "MODULE_ATTR_USE_BATCHING_HINTED_OUTPUT",
    "MODULE_ATTR_USE_UNFLATTENED_LENGTHS_FOR_BATCHING",
    "EmbeddingBagCollection",
    "EmbeddingCollection",
    "FeatureProcessedEmbeddingBagCollection",
    "QuantManagedCollisionEmbeddingBagCollection",
    "QuantManagedCollisionEmbeddingCollection",
    "for_each_module_of_type_do",
    "quant_prep_customize_row_alignment",
    "quant_prep_enable_cache_features_order",
    "quant_prep_enable_quant_state_dict_split_scale_bias",
    "quant_prep_enable_quant_state_dict_split_scale_bias_for_types",
    "quant_prep_enable_register_tbes",
    "quantize_state_dict",
]

__getattr__ = refuse(
    __name__,
    {
        "MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT": "row pruning of quantized "
        "tables is not supported; serve the whole table",
    },
)
