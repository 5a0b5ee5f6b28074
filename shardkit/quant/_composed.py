"""Quantized collections with something in front of the tables, as TorchRec's
``quant.embedding_modules`` has them: position-weighted features
(`FeatureProcessedEmbeddingBagCollection`) and managed collision
(`QuantManagedCollisionEmbeddingBagCollection`, `QuantManagedCollisionEmbeddingCollection`).

Each is the quantized collection (same tables, same ``state_dict`` keys for them) with the float
module's processors or remapper kept in front: ``from_float`` quantizes the float module's
tables and takes its processors/remapper as they are. The managed-collision ones serve only:
their remapper stays in eval (it maps ids to the rows it kept in training, and evicts nothing),
whatever ``train()`` says, as TorchRec's put theirs in inference mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules import EmbeddingBagConfig, EmbeddingConfig
from shardkit.modules import fp_embedding_modules as fp
from shardkit.modules import mc_embedding_modules as mc
from shardkit.modules.mc_modules import ManagedCollisionCollection
from shardkit.quant._collections import (
    EmbeddingBagCollection,
    EmbeddingCollection,
    QuantizedWeights,
    quantize_state_dict,
)
from shardkit.quant._config import quantized_configs
from shardkit.quant._prep import DEFAULT_ROW_ALIGNMENT, layout_switches
from shardkit.sparse import KeyedJaggedTensor

__all__ = [
    "FeatureProcessedEmbeddingBagCollection",
    "QuantManagedCollisionEmbeddingBagCollection",
    "QuantManagedCollisionEmbeddingCollection",
]


def _quantized_tables(module: nn.Module, inner: nn.Module, configs: Sequence[Any]) -> dict:
    """The keyword arguments shared by every ``from_float`` below: the quantized configs and
    weights of ``inner``'s tables (storage types from ``module.qconfig``), device, output dtype,
    layout switches."""
    qconfig = getattr(module, "qconfig", None)
    if qconfig is None:
        raise ValueError(
            f"{type(module).__name__} needs module.qconfig (a QuantConfig giving the storage "
            "dtype); or use shardkit.inference.quantize_inference_model, which sets it"
        )
    configs = quantized_configs(configs, qconfig)
    weights: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    device = quantize_state_dict(inner, weights, {c.name: c.data_type for c in configs})
    return {"tables": configs, "device": device, "output_dtype": qconfig.activation().dtype,
            "table_name_to_quantized_weights": weights, **layout_switches(module, inner)}  # fmt: skip


class FeatureProcessedEmbeddingBagCollection(EmbeddingBagCollection):
    """A quantized `EmbeddingBagCollection` behind feature processors (position weights, kept
    float): ``forward(features)`` is ``super().forward(feature_processor(features))``.

    Args: those of `EmbeddingBagCollection` (TorchRec's order) and ``feature_processor``, a
    `FeatureProcessorsCollection` (required).
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool,
        device: torch.device | str | None = None,
        output_dtype: torch.dtype = torch.float,
        table_name_to_quantized_weights: QuantizedWeights | None = None,
        register_tbes: bool = False,
        quant_state_dict_split_scale_bias: bool = False,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        feature_processor: nn.Module | None = None,
        cache_features_order: bool = False,
        *,
        validate_ids: bool = True,
    ) -> None:
        super().__init__(
            tables, is_weighted, device, output_dtype, table_name_to_quantized_weights,
            register_tbes, quant_state_dict_split_scale_bias, row_alignment,
            cache_features_order, validate_ids=validate_ids,
        )  # fmt: skip
        if feature_processor is None:
            raise ValueError(
                "FeatureProcessedEmbeddingBagCollection needs feature_processor; without one "
                "use shardkit.quant.EmbeddingBagCollection"
            )
        self.feature_processor = feature_processor

    def forward(self, features: KeyedJaggedTensor) -> Any:
        return super().forward(self.feature_processor(features))

    @classmethod
    def from_float(  # type: ignore[override]
        cls,
        module: fp.FeatureProcessedEmbeddingBagCollection,
        use_precomputed_fake_quant: bool = False,
    ) -> FeatureProcessedEmbeddingBagCollection:
        """From a float `shardkit.modules.fp_embedding_modules.FeatureProcessedEmbeddingBagCollection`
        whose ``qconfig`` gives the storage types; its processors are kept (not copied)."""
        processors, ebc = module.split()
        kwargs = _quantized_tables(module, ebc, ebc.embedding_bag_configs())
        return cls(is_weighted=ebc.is_weighted(), feature_processor=processors, **kwargs)


class _ServesRemapped:
    """What both managed-collision collections add: a remapper kept in eval, in front."""

    _managed_collision_collection: ManagedCollisionCollection

    def _keep_remapper(
        self,
        managed_collision_collection: ManagedCollisionCollection | None,
        configs,
        return_remapped: bool,
    ) -> None:
        if managed_collision_collection is None:
            raise ValueError(f"{type(self).__name__} needs managed_collision_collection")
        theirs = [c.name for c in managed_collision_collection.embedding_configs()]
        ours = [c.name for c in configs]
        if theirs != ours:
            raise ValueError(
                f"{type(self).__name__}: the managed collision collection's tables {theirs} "
                f"are not the collection's {ours}; give both the same configs"
            )
        self._managed_collision_collection = managed_collision_collection.eval()
        self._return_remapped_features = return_remapped

    def forward(self, features: KeyedJaggedTensor) -> Any:
        """The remapped features through the quantized tables; returns both (TorchRec's)."""
        remapped = self._managed_collision_collection(features)
        return super().forward(remapped), remapped  # type: ignore[misc]

    def train(self, mode: bool = True) -> Any:
        super().train(mode)  # type: ignore[misc]
        self._managed_collision_collection.eval()  # serving: remap only, never evict
        return self


class QuantManagedCollisionEmbeddingBagCollection(_ServesRemapped, EmbeddingBagCollection):
    """A quantized `EmbeddingBagCollection` behind a `ManagedCollisionCollection`: raw ids in,
    ``(KeyedTensor, remapped KeyedJaggedTensor)`` out (TorchRec's return).

    Args: those of `EmbeddingBagCollection` (TorchRec's order), ``managed_collision_collection``
    (required), ``return_remapped_features`` (kept for TorchRec; the remapped KJT is returned
    either way, as TorchRec's does).
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool,
        device: torch.device | str | None = None,
        output_dtype: torch.dtype = torch.float,
        table_name_to_quantized_weights: QuantizedWeights | None = None,
        register_tbes: bool = False,
        quant_state_dict_split_scale_bias: bool = False,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        managed_collision_collection: ManagedCollisionCollection | None = None,
        return_remapped_features: bool = False,
        cache_features_order: bool = False,
        *,
        validate_ids: bool = True,
    ) -> None:
        super().__init__(
            tables, is_weighted, device, output_dtype, table_name_to_quantized_weights,
            register_tbes, quant_state_dict_split_scale_bias, row_alignment,
            cache_features_order, validate_ids=validate_ids,
        )  # fmt: skip
        self._keep_remapper(managed_collision_collection, tables, return_remapped_features)

    @classmethod
    def from_float(  # type: ignore[override]
        cls,
        module: mc.ManagedCollisionEmbeddingBagCollection,
        return_remapped_features: bool = False,
    ) -> QuantManagedCollisionEmbeddingBagCollection:
        """From a float `ManagedCollisionEmbeddingBagCollection` whose ``qconfig`` gives the
        storage types; its remapper (trained) is kept."""
        ebc = module._embedding_bag_collection
        kwargs = _quantized_tables(module, ebc, ebc.embedding_bag_configs())
        return cls(is_weighted=ebc.is_weighted(),
                   managed_collision_collection=module._managed_collision_collection,
                   return_remapped_features=module._return_remapped_features, **kwargs)  # fmt: skip


class QuantManagedCollisionEmbeddingCollection(_ServesRemapped, EmbeddingCollection):
    """A quantized `EmbeddingCollection` behind a `ManagedCollisionCollection`: raw ids in,
    ``({feature: JaggedTensor}, remapped KeyedJaggedTensor)`` out."""

    def __init__(
        self,
        tables: Sequence[EmbeddingConfig],
        device: torch.device | str | None = None,
        need_indices: bool = False,
        output_dtype: torch.dtype = torch.float,
        table_name_to_quantized_weights: QuantizedWeights | None = None,
        register_tbes: bool = False,
        quant_state_dict_split_scale_bias: bool = False,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        managed_collision_collection: ManagedCollisionCollection | None = None,
        return_remapped_features: bool = False,
        cache_features_order: bool = False,
        *,
        validate_ids: bool = True,
    ) -> None:
        super().__init__(
            tables, device, need_indices, output_dtype, table_name_to_quantized_weights,
            register_tbes, quant_state_dict_split_scale_bias, row_alignment,
            cache_features_order, validate_ids=validate_ids,
        )  # fmt: skip
        self._keep_remapper(managed_collision_collection, tables, return_remapped_features)

    @classmethod
    def from_float(  # type: ignore[override]
        cls, module: mc.ManagedCollisionEmbeddingCollection, return_remapped_features: bool = False
    ) -> QuantManagedCollisionEmbeddingCollection:
        """From a float `ManagedCollisionEmbeddingCollection` (see the bag one)."""
        ec = module._embedding_collection
        need_indices = getattr(ec, "need_indices", lambda: False)()
        kwargs = _quantized_tables(module, ec, ec.embedding_configs())
        return cls(need_indices=need_indices,
                   managed_collision_collection=module._managed_collision_collection,
                   return_remapped_features=module._return_remapped_features, **kwargs)  # fmt: skip
