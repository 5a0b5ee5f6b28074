"""`FeatureProcessedEmbeddingBagCollection`: feature processors, then a weighted EBC, TorchRec's
``fp_embedding_modules``.

Example::

    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name="clicks", embedding_dim=16, num_embeddings=1000, feature_names=["last_clicked"])],
        is_weighted=True)
    fp_ebc = FeatureProcessedEmbeddingBagCollection(
        ebc, PositionWeightedModuleCollection({"last_clicked": 20}))
    fp_ebc(kjt)   # KeyedTensor [B, 16]: sum over each bag of w[position] * E[id]

``state_dict``: ``_embedding_bag_collection.embedding_bags.<table>.weight`` and
``_feature_processors.position_weights.<feature>`` (a collection) or
``_feature_processors.<feature>.position_weight`` (a dict of `PositionWeightedModule`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from shardkit.modules.embedding_modules import EmbeddingBagCollection
from shardkit.modules.feature_processor_ import (
    FeatureProcessor,
    FeatureProcessorsCollection,
    PositionWeightedModule,
    positions,
    traced_position_weights,
)
from shardkit.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = [
    "FeatureProcessedEmbeddingBagCollection",
    "FeatureProcessorDictWrapper",
    "apply_feature_processors_to_kjt",
]


def apply_feature_processors_to_kjt(
    features: KeyedJaggedTensor, feature_processors: Mapping[str, nn.Module] | nn.ModuleDict
) -> KeyedJaggedTensor:
    """``features`` with the weights each key's processor gives (1.0 for keys without one)."""
    by_key = features.to_dict()
    keys: list[str] = features.keys()
    weights = []
    for key in keys:
        jt = by_key[key]
        if key in feature_processors:
            weights.append(_processed(feature_processors[key], jt, key).weights())
        else:
            weights.append(torch.ones(jt.values().numel(), device=jt.values().device))
    return KeyedJaggedTensor(
        keys=features.keys(),
        values=features.values(),
        weights=torch.cat(weights) if weights else features.weights_or_none(),
        lengths=features.lengths(),
        stride=features.stride(),
        length_per_key=features.length_per_key(),
    )


def _processed(processor: nn.Module, jt, key: str):
    try:
        return processor(jt)
    except ValueError as error:  # name the feature: a processor knows only its bags
        raise ValueError(f"feature '{key}': {error}") from error


class FeatureProcessorDictWrapper(FeatureProcessorsCollection):
    """A ``{feature: FeatureProcessor}`` dict as a `FeatureProcessorsCollection`."""

    def __init__(self, feature_processors: nn.ModuleDict) -> None:
        super().__init__()
        self._feature_processors = feature_processors

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        return apply_feature_processors_to_kjt(features, self._feature_processors)


class FeatureProcessedEmbeddingBagCollection(nn.Module):
    """Feature processors (e.g. position weights) then a weighted `EmbeddingBagCollection`.

    The processors' weights replace any weights of the input; features of the input that no
    table takes are dropped (dict form) or passed to the EBC, which ignores them (collection).

    Args:
        embedding_bag_collection: the tables, built with ``is_weighted=True``.
        feature_processors: a `FeatureProcessorsCollection`, or ``{feature: FeatureProcessor}``
            with exactly the tables' features.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        feature_processors: Mapping[str, FeatureProcessor] | FeatureProcessorsCollection,
    ) -> None:
        super().__init__()
        if not embedding_bag_collection.is_weighted():
            raise ValueError(
                "FeatureProcessedEmbeddingBagCollection needs an EmbeddingBagCollection built "
                "with is_weighted=True: the feature processors' weights are its per-id weights"
            )
        self._embedding_bag_collection = embedding_bag_collection
        self._feature_names = [
            f for c in embedding_bag_collection.embedding_bag_configs() for f in c.feature_names
        ]
        self._feature_processors: nn.Module
        if isinstance(feature_processors, FeatureProcessorsCollection):
            self._feature_processors = feature_processors
        else:
            _check_keys(set(feature_processors), self._feature_names)
            self._feature_processors = nn.ModuleDict(feature_processors)

    def split(self) -> tuple[FeatureProcessorsCollection, EmbeddingBagCollection]:
        """(the processors as one collection, the EBC): how sharders take it apart."""
        processors = self._feature_processors
        if isinstance(processors, nn.ModuleDict):
            processors = FeatureProcessorDictWrapper(processors)
        return processors, self._embedding_bag_collection  # type: ignore[return-value]

    def is_weighted(self) -> bool:
        return self._embedding_bag_collection.is_weighted()

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """``features``: ids, one key per feature, batch ``B``. Returns ``[B, sum(dims)]``."""
        if isinstance(self._feature_processors, FeatureProcessorsCollection):
            return self._embedding_bag_collection(self._feature_processors(features))
        keys: list[str] = features.keys()
        missing = [f for f in self._feature_names if f not in keys]
        if missing:
            raise ValueError(
                f"FeatureProcessedEmbeddingBagCollection: features {missing} are not keys of "
                f"the input (keys {features.keys()}); give every table's features"
            )
        processors = dict(self._feature_processors.items())  # type: ignore[operator]
        if torch.compiler.is_compiling() and all(
            isinstance(p, PositionWeightedModule) and not p._pre_processed
            for p in processors.values()
        ):  # see [Note: position weights in a graph]; the EBC ignores the other keys
            position = positions(features.offsets(), features.values().numel())
            by_key = {key: p.position_weight for key, p in processors.items()}
            weights = traced_position_weights(features, position, by_key)
            return self._embedding_bag_collection(
                KeyedJaggedTensor(keys, features.values(), weights, lengths=features.lengths())
            )
        order = [keys.index(f) for f in self._feature_names]
        processed = apply_feature_processors_to_kjt(
            features.permute(order),
            self._feature_processors,  # type: ignore[arg-type]
        )
        return self._embedding_bag_collection(processed)


def _check_keys(given: set[str], features: list[str]) -> None:
    if given != set(features):
        raise ValueError(
            f"feature processors are given for {sorted(given)} but the tables' features are "
            f"{sorted(features)}; give one FeatureProcessor per feature (or use a "
            "FeatureProcessorsCollection)"
        )
