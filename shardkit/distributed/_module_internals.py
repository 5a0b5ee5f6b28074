"""The smaller names of ``torchrec.distributed.embeddingbag`` and ``.embedding``: the awaitables
and contexts a sharded collection's steps pass along, the grouping of its tables by sharding
type and device ("sharding infos"), and helpers on KJTs and outputs.

shardkit's sharded collections return their outputs directly (a KeyedTensor, a dict of
JaggedTensors) rather than awaitables; these classes build the same outputs from awaitables
for code written against TorchRec's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from shardkit.modules import (
    EmbeddingBagCollectionInterface,
    EmbeddingTableConfig,
    PoolingType,
    get_embedding_names_by_table,
)
from shardkit.modules.embedding_modules import EmbeddingCollectionInterface
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from shardkit.streamable import Multistreamable
from shardkit.types import (
    Awaitable,
    EnumerableShardingSpec,
    LazyAwaitable,
    LazyGetItemMixin,
    ParameterSharding,
    ShardMetadata,
    ShardPlacement,
)

__all__ = [
    "EC_INDEX_DEDUP",
    "EmbeddingAwaitable",
    "EmbeddingBagCollectionAwaitable",
    "EmbeddingBagCollectionContext",
    "EmbeddingCollectionAwaitable",
    "EmbeddingCollectionContext",
    "EmbeddingShardingInfo",
    "VariableBatchEmbeddingBagCollectionAwaitable",
    "construct_output_kt",
    "create_ec_sharding_infos",
    "create_sharding_infos_by_sharding_device_group",
    "ec_index_dedup",
    "get_device_from_parameter_sharding",
    "pad_vbe_kjt_lengths",
    "replace_placement_with_meta_device",
    "set_ec_index_dedup",
]

logger = logging.getLogger(__name__)


def construct_output_kt(
    embeddings: list[torch.Tensor], embedding_names: list[str], embedding_dims: list[int]
) -> KeyedTensor:
    """``[B, D_i]`` blocks side by side as a KeyedTensor keyed by ``embedding_names``."""
    values = embeddings[0] if len(embeddings) == 1 else torch.cat(embeddings, dim=1)
    return KeyedTensor(embedding_names, embedding_dims, values)


class EmbeddingAwaitable(LazyAwaitable[torch.Tensor]):
    """The tensor of one awaitable."""

    def __init__(self, awaitable: Awaitable[torch.Tensor]) -> None:
        super().__init__()
        self._awaitable = awaitable

    def _wait_impl(self) -> torch.Tensor:
        return self._awaitable.wait()


class EmbeddingBagCollectionAwaitable(LazyGetItemMixin, LazyAwaitable[KeyedTensor]):
    """The KeyedTensor of pooled embeddings, from one awaitable ``[B, D]`` block per sharding."""

    def __init__(self, awaitables: Sequence[Awaitable[torch.Tensor]], embedding_dims: list[int],
                 embedding_names: list[str], module_fqn: str | None = None,
                 sharding_types: list[str] | None = None) -> None:  # fmt: skip
        super().__init__()
        self._awaitables = list(awaitables)
        self._dims, self._names = embedding_dims, embedding_names

    def _wait_impl(self) -> KeyedTensor:
        return construct_output_kt([a.wait() for a in self._awaitables], self._names, self._dims)


class VariableBatchEmbeddingBagCollectionAwaitable(EmbeddingBagCollectionAwaitable):
    """Pooled embeddings of deduplicated examples expanded back to the batch:
    ``inverse_indices`` (keys, ``[F, B]``) gives each feature's row for every example."""

    def __init__(self, awaitables: Sequence[Awaitable[torch.Tensor]],
                 inverse_indices: tuple[list[str], torch.Tensor], embedding_dims: list[int],
                 embedding_names: list[str], **kwargs: Any) -> None:  # fmt: skip
        super().__init__(awaitables, embedding_dims, embedding_names)
        self._inverse = inverse_indices

    def _wait_impl(self) -> KeyedTensor:
        pooled = super()._wait_impl().to_dict()
        keys, indices = self._inverse
        row = {key: i for i, key in enumerate(keys)}
        blocks = [pooled[n].index_select(0, indices[row[n.split("@")[0]]]) for n in self._names]
        return construct_output_kt(blocks, self._names, self._dims)


@dataclass
class EmbeddingBagCollectionContext(Multistreamable):
    """What a sharded EBC keeps between its steps."""

    sharding_contexts: list[Any] = field(default_factory=list)
    inverse_indices: tuple[list[str], torch.Tensor] | None = None
    variable_batch_per_feature: bool = False
    divisor: torch.Tensor | None = None
    early_releasable_inputs: list[KeyedJaggedTensor] = field(default_factory=list)

    def record_stream(self, stream: torch.Stream) -> None:
        if self.inverse_indices is not None:
            self.inverse_indices[1].record_stream(stream)


@dataclass
class EmbeddingCollectionContext(Multistreamable):
    """What a sharded EC keeps between its steps."""

    sharding_contexts: list[Any] = field(default_factory=list)
    input_features: list[KeyedJaggedTensor] = field(default_factory=list)
    reverse_indices: list[torch.Tensor] = field(default_factory=list)
    seq_vbe_ctx: list[Any] = field(default_factory=list)
    table_name_to_unpruned_hash_sizes: dict[str, int] = field(default_factory=dict)
    early_releasable_inputs: list[KeyedJaggedTensor] = field(default_factory=list)

    def record_stream(self, stream: torch.Stream) -> None:
        for features in self.input_features:
            features.record_stream(stream)


class EmbeddingCollectionAwaitable(LazyAwaitable[dict[str, JaggedTensor]]):
    """Per-id embeddings as ``{name: JaggedTensor}``: sharding ``i``'s awaitable gives
    ``[N_i, D]`` rows for the ids of ``features_per_sharding[i]``, named by
    ``embedding_names_per_sharding[i]``."""

    def __init__(self, awaitables_per_sharding: Sequence[Awaitable[torch.Tensor]],
                 features_per_sharding: Sequence[KeyedJaggedTensor],
                 embedding_names_per_sharding: Sequence[list[str]],
                 ctx: EmbeddingCollectionContext | None = None, need_indices: bool = False,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__()
        self._parts = list(zip(awaitables_per_sharding, features_per_sharding,
                               embedding_names_per_sharding))  # fmt: skip

    def _wait_impl(self) -> dict[str, JaggedTensor]:
        out: dict[str, JaggedTensor] = {}
        for awaitable, features, names in self._parts:
            rows = awaitable.wait()
            by_key = features.to_dict()
            pieces = torch.split(rows, features.length_per_key())
            for name, key, piece in zip(names, features.keys(), pieces):
                out[name] = JaggedTensor(piece, lengths=by_key[key].lengths())
        return out


def get_device_from_parameter_sharding(ps: ParameterSharding) -> str | tuple[str, ...]:
    """The device type of a table's shards (a tuple when they differ, row-wise only)."""
    if not isinstance(ps.sharding_spec, EnumerableShardingSpec):
        raise ValueError(f"{ps.sharding_type.value} sharding has no shards to read a device from")
    kinds = tuple(shard.placement.device().type for shard in ps.sharding_spec.shards)
    return kinds[0] if len(set(kinds)) == 1 else kinds


@dataclass
class EmbeddingShardingInfo:
    """One table of a sharded collection: its config, plan, parameter and fused params."""

    embedding_config: EmbeddingTableConfig
    param_sharding: ParameterSharding
    param: torch.Tensor
    fused_params: dict[str, Any] | None = None


def _infos(module: nn.Module, plan: Mapping[str, ParameterSharding], configs: list[Any],
           prefix: str, fused_params: Mapping[str, Any] | None, pooled: bool) -> dict:  # fmt: skip
    params = dict(module.named_parameters())
    grouped: dict[tuple, list[EmbeddingShardingInfo]] = {}
    names = get_embedding_names_by_table(configs)
    for config, embedding_names in zip(configs, names):
        sharding = plan[config.name]
        device = (
            sharding.sharding_type.value
            if sharding.sharding_spec is None
            else get_device_from_parameter_sharding(sharding)
        )
        table = EmbeddingTableConfig(
            num_embeddings=config.num_embeddings, embedding_dim=config.embedding_dim,
            name=config.name, data_type=config.data_type, feature_names=list(config.feature_names),
            pooling=getattr(config, "pooling", PoolingType.NONE) if pooled else PoolingType.NONE,
            is_weighted=bool(getattr(module, "is_weighted", lambda: False)()),
            embedding_names=embedding_names, weight_init_max=config.weight_init_max,
            weight_init_min=config.weight_init_min,
        )  # fmt: skip
        info = EmbeddingShardingInfo(table, sharding, params[f"{prefix}{config.name}.weight"],
                                     dict(fused_params or {}))  # fmt: skip
        grouped.setdefault((sharding.sharding_type.value, device), []).append(info)
    return grouped


def create_sharding_infos_by_sharding_device_group(
    module: EmbeddingBagCollectionInterface, table_name_to_parameter_sharding: Mapping[str, ParameterSharding],
    prefix: str, fused_params: Mapping[str, Any] | None, suffix: str | None = "weight",
) -> dict[tuple, list[EmbeddingShardingInfo]]:  # fmt: skip
    """An EmbeddingBagCollection's tables grouped by (sharding type, device type)."""
    return _infos(module, table_name_to_parameter_sharding, module.embedding_bag_configs(),
                  prefix, fused_params, pooled=True)  # fmt: skip


def create_ec_sharding_infos(
    module: EmbeddingCollectionInterface, table_name_to_parameter_sharding: Mapping[str, ParameterSharding],
    fused_params: Mapping[str, Any] | None,
) -> dict[tuple, list[EmbeddingShardingInfo]]:  # fmt: skip
    """An EmbeddingCollection's tables grouped by (sharding type, device type)."""
    return _infos(module, table_name_to_parameter_sharding, module.embedding_configs(),
                  "embeddings.", fused_params, pooled=False)  # fmt: skip


def replace_placement_with_meta_device(sharding_infos: list[EmbeddingShardingInfo]) -> None:
    """Point every shard of ``sharding_infos`` at the meta device (same ranks)."""
    for info in sharding_infos:
        spec = info.param_sharding.sharding_spec
        if spec is None:
            continue
        shards = [ShardMetadata(s.shard_offsets, s.shard_sizes,
                                ShardPlacement.parse(f"rank:{s.placement.rank()}/meta"))
                  for s in spec.shards]  # fmt: skip
        info.param_sharding = replace(info.param_sharding,
                                      sharding_spec=EnumerableShardingSpec(shards))  # fmt: skip


# TorchRec's switch for deduplicating ids before an EmbeddingCollection's input dist: a speed
# knob (outputs are the same either way); shardkit sends ids as they are.
EC_INDEX_DEDUP = False
_EC_INDEX_DEDUP = [EC_INDEX_DEDUP]


def ec_index_dedup() -> bool:
    return _EC_INDEX_DEDUP[0]


def set_ec_index_dedup(val: bool) -> None:
    """Sets the switch `ec_index_dedup` reads (its outputs do not depend on it)."""
    _EC_INDEX_DEDUP[0] = bool(val)


def pad_vbe_kjt_lengths(features: KeyedJaggedTensor) -> KeyedJaggedTensor:
    """A variable-batch KJT with every key's lengths padded (with empty bags) to the largest
    batch size: one batch size for all keys."""
    strides = features.stride_per_key()
    widest = max(strides)
    lengths = torch.zeros(widest * len(strides), dtype=features.lengths().dtype)
    start = 0
    for i, stride in enumerate(strides):
        lengths[i * widest : i * widest + stride] = features.lengths()[start : start + stride]
        start += stride
    return KeyedJaggedTensor(keys=features.keys(), values=features.values(),
                             weights=features.weights_or_none(), lengths=lengths, stride=widest)  # fmt: skip
