"""Embedding collections behind a `ManagedCollisionCollection`, TorchRec's
``mc_embedding_modules``: raw ids in, remapped by the collection, looked up in the tables.

When an eviction gives a row to a new id (or frees it), the row's embedding is re-initialised
(the table config's ``init_fn``, else its uniform init range) and its fused optimizer state
reset before the lookup, as TorchRec's sharded modules do; a new id never inherits the vector
its row learnt for an evicted one. (An optimizer outside the tables, e.g. ``torch.optim.Adam``
over ``named_parameters()``, keeps its own state for the row.)

Example::

    tables = [EmbeddingBagConfig(name="users", num_embeddings=1000, embedding_dim=16,
                                 feature_names=["user_id"])]
    mc_ebc = ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(tables=tables),
        ManagedCollisionCollection(
            {"users": MCHManagedCollisionModule(1000, "cpu", LFU_EvictionPolicy(), 100)},
            tables,
        ),
        return_remapped_features=True,
    )
    pooled, remapped = mc_ebc(kjt)   # KeyedTensor [B, 16]; the KJT of rows (or None)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from shardkit.compat import refuse
from shardkit.modules._graph_ops import graph_remap, in_key_order, register
from shardkit.modules._mc_collection import ManagedCollisionCollection
from shardkit.modules.embedding_configs import BaseEmbeddingConfig
from shardkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = [
    "BaseManagedCollisionEmbeddingCollection",
    "ManagedCollisionEmbeddingBagCollection",
    "ManagedCollisionEmbeddingCollection",
]

Embeddings = KeyedTensor | dict[str, JaggedTensor]


class BaseManagedCollisionEmbeddingCollection(nn.Module):
    """An embedding collection whose input ids are first remapped by managed collision.

    Args:
        embedding_module: the tables (configs equal to the collection's).
        managed_collision_collection: remaps raw ids to rows of those tables.
        return_remapped_features: also return the remapped KJT.
        allow_in_place_embed_weight_update: kept for TorchRec's signature; evicted rows are
            always re-initialised in place, outside autograd.
    """

    def __init__(
        self,
        embedding_module: EmbeddingBagCollection | EmbeddingCollection,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        allow_in_place_embed_weight_update: bool = False,
    ) -> None:
        super().__init__()
        configs = _configs(embedding_module)
        if configs != managed_collision_collection.embedding_configs():
            raise ValueError(
                f"{type(self).__name__}: the embedding module's tables "
                f"{[c.name for c in configs]} and the ManagedCollisionCollection's "
                f"{[c.name for c in managed_collision_collection.embedding_configs()]} must be "
                "the same configs; build both from one list of configs"
            )
        self._managed_collision_collection = managed_collision_collection
        self._embedding_module = embedding_module
        self._return_remapped_features = return_remapped_features
        self._allow_in_place_embed_weight_update = allow_in_place_embed_weight_update
        self._configs = {c.name: c for c in configs}
        self._graph_handle = register(self)

    def __setstate__(self, state: dict) -> None:  # copy.deepcopy and pickle come here
        super().__setstate__(state)
        self._graph_handle = register(self)

    def forward(
        self, features: KeyedJaggedTensor, mutate_miss_lengths: bool = True
    ) -> tuple[Embeddings, KeyedJaggedTensor | None]:
        """``features``: raw ids. Returns (the embedding module's output, the remapped KJT if
        ``return_remapped_features`` else None)."""
        if torch.compiler.is_compiling() and not features.variable_stride_per_key():
            # keys stay in the input's order; torch.export: see [Note: managed collision in an
            # exported program], torch.compile: [Note: collections under torch.compile]
            if torch.compiler.is_exporting():
                remapped = self._managed_collision_collection.traced(features)
            else:
                remapped = graph_remap(self, features, mutate_miss_lengths)
            embeddings = self._embedding_module(remapped)
            if not self._return_remapped_features:
                return embeddings, None
            features_in_tables = [f for c in self._configs.values() for f in c.feature_names]
            return embeddings, in_key_order(remapped, features_in_tables)
        remapped = self._managed_collision_collection(features, mutate_miss_lengths)
        self._reset_rows(self._managed_collision_collection.evict())
        embeddings = self._embedding_module(remapped)
        return embeddings, (remapped if self._return_remapped_features else None)

    @torch.no_grad()
    def _reset_rows(self, evictions: Mapping[str, torch.Tensor | None]) -> None:
        module = self._embedding_module
        fused = getattr(module, "fused_optimizer", None)
        for name, rows in evictions.items():
            if rows is None or rows.numel() == 0:
                continue
            # duck-typed: a quantized collection (serving) holds its tables under the same names
            tables = getattr(
                module, "embedding_bags" if hasattr(module, "embedding_bags") else "embeddings"
            )
            weight = tables[name].weight
            if not isinstance(weight, nn.Parameter):
                raise ValueError(
                    f"table '{name}': ids were evicted, but its embedding module "
                    f"({type(module).__name__}) cannot reset rows (e.g. quantized for serving); "
                    "call .eval() to only remap ids"
                )
            weight.data[rows] = _initial_rows(self._configs[name], rows.numel(), weight)
            if fused is not None and weight in fused.state:
                _reset_optimizer_rows(fused, weight, rows)


class ManagedCollisionEmbeddingBagCollection(BaseManagedCollisionEmbeddingCollection):
    """`EmbeddingBagCollection` behind managed collision: ``(KeyedTensor, KJT or None)`` out.

    Args: as `BaseManagedCollisionEmbeddingCollection`, with ``embedding_bag_collection``.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        allow_in_place_embed_weight_update: bool = False,
    ) -> None:
        super().__init__(
            embedding_bag_collection,
            managed_collision_collection,
            return_remapped_features,
            allow_in_place_embed_weight_update,
        )

    @property
    def _embedding_bag_collection(self) -> EmbeddingBagCollection:
        return self._embedding_module  # type: ignore[return-value]


class ManagedCollisionEmbeddingCollection(BaseManagedCollisionEmbeddingCollection):
    """`EmbeddingCollection` behind managed collision: ``({feature: JaggedTensor}, KJT or
    None)`` out.

    Args: as `BaseManagedCollisionEmbeddingCollection`, with ``embedding_collection``.
    """

    def __init__(
        self,
        embedding_collection: EmbeddingCollection,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        allow_in_place_embed_weight_update: bool = False,
    ) -> None:
        super().__init__(
            embedding_collection,
            managed_collision_collection,
            return_remapped_features,
            allow_in_place_embed_weight_update,
        )

    @property
    def _embedding_collection(self) -> EmbeddingCollection:
        return self._embedding_module  # type: ignore[return-value]


def _configs(module: nn.Module) -> list[BaseEmbeddingConfig]:
    if isinstance(module, EmbeddingBagCollection):
        return list(module.embedding_bag_configs())
    if isinstance(module, EmbeddingCollection):
        return list(module.embedding_configs())
    raise TypeError(
        f"managed collision wraps an EmbeddingBagCollection or EmbeddingCollection, got "
        f"{type(module).__name__}"
    )


def _initial_rows(config: BaseEmbeddingConfig, num_rows: int, like: torch.Tensor) -> torch.Tensor:
    """``[num_rows, D]`` fresh rows: the config's ``init_fn`` or its uniform init range."""
    rows = torch.empty(num_rows, config.embedding_dim, dtype=like.dtype, device=like.device)
    if callable(config.init_fn):
        result = config.init_fn(rows)
        return result if isinstance(result, torch.Tensor) else rows
    return rows.uniform_(config.get_weight_init_min(), config.get_weight_init_max())


def _reset_optimizer_rows(
    fused: torch.optim.Optimizer, weight: torch.Tensor, rows: torch.Tensor
) -> None:
    """The fused optimizer's state of ``rows`` back to its initial values."""
    group = next(g for g in fused.param_groups if any(p is weight for p in g["params"]))
    for name, state in fused.state[weight].items():
        if name == "step":  # the buffer's step counter, not per row
            continue
        initial = group.get("initial_accumulator_value", 0.0) if name == "momentum1" else 0.0
        state[rows] = initial


_INTERNAL = (
    "a helper inside TorchRec's managed-collision collections; shardkit's collections do this "
    "themselves: call the ManagedCollisionEmbeddingBagCollection (or ...EmbeddingCollection)"
)
__getattr__ = refuse(
    __name__,
    {"evict": _INTERNAL, "return_custom_metadata": _INTERNAL,
     "return_remapped_lengths_as_mask": _INTERNAL},
)  # fmt: skip
