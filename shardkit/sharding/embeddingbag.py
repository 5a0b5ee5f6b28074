"""`ShardedEmbeddingBagCollection`: an `EmbeddingBagCollection` whose tables are spread over ranks.

Forward = input dist (each rank's ids to the shards' ranks, [Note: input exchange]) -> local
lookup (one batched kernel per group of local shards, optimizer fused into backward) -> output
dist (pooled rows back to the bags' ranks, [Note: routes]). The contract is the unsharded
module's: the same KJT in (this rank's part of the global batch), the same KeyedTensor out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardkit.modules import EmbeddingBagCollection, PoolingType, data_type_to_dtype
from shardkit.modules._kernel import lookup
from shardkit.optim import FusedOptimizer, FusedOptimizerConfig, FusedTable, fused_config_of
from shardkit.planner import EmbeddingComputeKernel, ParameterSharding, ShardingEnv
from shardkit.sharding._grad import scale_grad
from shardkit.sharding._groups import Group, build_group, classes, group_input, group_specs
from shardkit.sharding._input_dist import PendingInput, exchange_start
from shardkit.sharding._inputs import source_batch
from shardkit.sharding._layout import Route, ShardSlice, build_layout
from shardkit.sharding._output_dist import HostGroups, distribute
from shardkit.sharding._state import block_of, sharded_tensor
from shardkit.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["ShardedEmbeddingBagCollection"]

logger = logging.getLogger(__name__)

# Input dists started ahead of their forward that a collection keeps (the pipeline needs 2).
_MAX_PREFETCHED = 2

# The fused optimizer of a FUSED table nobody chose one for (FBGEMM's and TorchRec's default).
DEFAULT_FUSED = FusedOptimizerConfig("exact_sgd", learning_rate=0.01)


@dataclass
class DistributedInput:
    """A batch whose ids are on their way to the shards (see `input_dist`)."""

    features: KeyedJaggedTensor
    pending: PendingInput


class ShardedTable(nn.Module):
    """This rank's shards of one table (``shards[k]`` is a view of a kernel group's stack)."""

    def __init__(self, shards: list[ShardSlice], params: list[nn.Parameter]) -> None:
        super().__init__()
        self.shard_slices = shards
        self.shards = nn.ParameterList(params)

    def extra_repr(self) -> str:
        blocks = [
            f"rows {s.row_start}+{s.rows}, cols {s.col_start}+{s.cols}" for s in self.shard_slices
        ]
        return "; ".join(blocks) or "no shard on this rank"


def _state_dict_hook(module: ShardedEmbeddingBagCollection, state_dict, prefix, _meta) -> None:
    # data-parallel tables appear once, as embedding_bags.<t>.weight (not also under _local)
    for key in [k for k in state_dict if k.startswith(f"{prefix}_local.")]:
        del state_dict[key]
    for config, table in module._sharded_tables():
        for k in range(len(table.shards)):
            del state_dict[f"{prefix}embedding_bags.{config.name}.shards.{k}"]
        local = [(s, p.detach()) for s, p in zip(table.shard_slices, table.shards)]
        state_dict[f"{prefix}embedding_bags.{config.name}.weight"] = sharded_tensor(
            (config.num_embeddings, config.embedding_dim),
            module.table_shards(config.name),
            local,
            module._device,
            module._env.pg,
        )


class ShardedEmbeddingBagCollection(nn.Module):
    """An `EmbeddingBagCollection` sharded by ``plan`` over the ranks of ``env``.

    Args:
        module: the unsharded collection; its configs, and its weights when they are
            materialised (each rank copies its shards; on "meta" shards are initialised anew).
        plan: table name -> `ParameterSharding` for this module.
        env: the ranks and their process group.
        device: where this rank's shards live.
        fused_params: the fused optimizer of FUSED tables that `apply_optimizer_in_backward` did
            not set (default: the module's own ``fused_params``, else SGD with lr 0.01).
        local_world_size: ranks per host (for table-row-wise); default: all on one host.
        gradient_division: scale the tables' gradients by ``1 / world size`` so that they match
            data-parallel's averaged dense gradients (and unsharded training on the global
            batch with a mean loss), as TorchRec does by default.
    """

    def __init__(
        self,
        module: EmbeddingBagCollection,
        plan: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | str | None = None,
        *,
        fused_params: Mapping[str, Any] | None = None,
        local_world_size: int | None = None,
        gradient_division: bool = True,
    ) -> None:
        super().__init__()
        self._configs = module.embedding_bag_configs()
        self._is_weighted = module.is_weighted()
        self._env = env
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._validate_ids = module.validate_ids
        world = env.world_size
        self._layout = build_layout(
            self._configs, plan, world_size=world, local_world_size=local_world_size or world
        )
        self._gradient_scale = 1.0 / world if gradient_division else 1.0
        self._with_weights = self._is_weighted or any(
            c.pooling == PoolingType.MEAN for c in self._configs
        )
        keys = self._table_keys(module, plan, fused_params)
        self._specs = [group_specs(self._layout, r, keys) for r in range(world)]
        self._classes = classes(self._layout)
        self._groups = self._build_groups(module)
        self._hosts = None
        if self._layout.units_of(Route.HOST_SUMMED):
            self._hosts = HostGroups(world, self._layout.local_world_size, env.rank)
        self.embedding_bags = nn.ModuleDict()
        self._local = self._build_local(module)
        self._register_tables()
        self.fused_optimizer = self._make_fused_optimizer()
        self._prefetched: list[DistributedInput] = []
        self._register_state_dict_hook(_state_dict_hook)
        self._register_load_state_dict_pre_hook(self._load_state_dict_pre_hook)
        logger.info(
            "rank %d: %d local shard group(s), %d output class(es), %d data-parallel table(s)",
            env.rank,
            len(self._groups),
            len(self._classes),
            len(self._local_tables),
        )

    # -- construction --------------------------------------------------------------------

    def _table_keys(self, module, plan, fused_params) -> list[tuple]:
        default = None
        if fused_params is not None:
            default = FusedOptimizerConfig.from_fused_params(fused_params)
        module_default = module._stack.default_config
        keys = []
        for config, param in zip(self._configs, module._stack.params):
            dtype = data_type_to_dtype(config.data_type)
            if plan[config.name].compute_kernel != EmbeddingComputeKernel.FUSED:
                keys.append((dtype, None))
                continue
            chosen = fused_config_of(param) or default or module_default or DEFAULT_FUSED
            keys.append((dtype, chosen))
        return keys

    def _build_groups(self, module: EmbeddingBagCollection) -> list[Group]:
        weights = {c.name: p for c, p in zip(self._configs, module._stack.params)}
        by_name = {c.name: c for c in self._configs}

        def initial(shard: ShardSlice) -> torch.Tensor | None:
            full = weights[shard.table]
            if full.device.type == "meta":
                config = by_name[shard.table]
                block = torch.empty(shard.rows, shard.cols)
                return block.uniform_(config.get_weight_init_min(), config.get_weight_init_max())
            rows = slice(shard.row_start, shard.row_start + shard.rows)
            cols = slice(shard.col_start, shard.col_start + shard.cols)
            return full.detach()[rows, cols]

        return [build_group(spec, self._device, initial) for spec in self._specs[self._env.rank]]

    def _build_local(self, module: EmbeddingBagCollection) -> EmbeddingBagCollection | None:
        """Data-parallel tables: a replica, looked up like the unsharded module (dense kernel)."""
        tables = [
            c for u in self._layout.units_of(Route.LOCAL) for c in [self._configs[u.table_index]]
        ]
        unique = list({c.name: c for c in tables}.values())
        self._local_tables = [c.name for c in unique]
        if not unique:
            return None
        local = EmbeddingBagCollection(
            tables=unique,
            is_weighted=self._is_weighted,
            device=self._device,
            validate_ids=self._validate_ids,
        )
        source = dict(zip((c.name for c in self._configs), module._stack.params))
        with torch.no_grad():
            for name in self._local_tables:
                if source[name].device.type != "meta":
                    local.embedding_bags[name].weight.copy_(source[name])
        return local

    def _register_tables(self) -> None:
        shards: dict[str, list] = {}
        for group in self._groups:
            for slice_, param in zip(group.spec.shards, group.params):
                entry = shards.setdefault(slice_.table, ([], []))
                entry[0].append(slice_)
                entry[1].append(param)
        for config in self._configs:
            if config.name in self._local_tables:
                assert self._local is not None
                self.embedding_bags[config.name] = self._local.embedding_bags[config.name]
            else:
                slices, params = shards.get(config.name, ([], []))
                self.embedding_bags[config.name] = ShardedTable(slices, params)

    def _make_fused_optimizer(self) -> FusedOptimizer | None:
        tables = []
        for group in self._groups:
            if group.tables.optimizer is None:
                continue
            starts = group.tables.row_starts
            for k, (slice_, param) in enumerate(zip(group.spec.shards, group.params)):
                index = self.embedding_bags[slice_.table].shard_slices.index(slice_)
                tables.append(
                    FusedTable(
                        name=f"embedding_bags.{slice_.table}.shards.{index}",
                        table=slice_.table,
                        param=param,
                        optimizer=group.tables.optimizer,
                        row_start=starts[k],
                        row_end=starts[k + 1],
                    )
                )
        return FusedOptimizer(tables) if tables else None

    # -- state dict: see [Note: sharded state dicts] --------------------------------------

    def _sharded_tables(self) -> list[tuple[Any, ShardedTable]]:
        return [
            (c, self.embedding_bags[c.name])
            for c in self._configs
            if isinstance(self.embedding_bags[c.name], ShardedTable)
        ]

    def table_shards(self, table: str) -> list[ShardSlice]:
        """Every shard of ``table`` in the job (from the layout)."""
        found: dict[tuple, ShardSlice] = {}
        for unit in self._layout.units:
            for shard in unit.shards:
                if shard.table == table:
                    found.setdefault((shard.row_start, shard.col_start), shard)
        return [found[k] for k in sorted(found)]

    def _load_state_dict_pre_hook(self, state_dict, prefix, *args: Any) -> None:
        for name in self._local_tables:
            key = f"{prefix}embedding_bags.{name}.weight"
            if key in state_dict:
                state_dict[f"{prefix}_local.embedding_bags.{name}.weight"] = state_dict[key]
        for config, table in self._sharded_tables():
            key = f"{prefix}embedding_bags.{config.name}.weight"
            if key not in state_dict:
                continue
            value = state_dict.pop(key)
            for k, slice_ in enumerate(table.shard_slices):
                state_dict[f"{prefix}embedding_bags.{config.name}.shards.{k}"] = block_of(
                    value, slice_, key
                )

    # -- forward ---------------------------------------------------------------------------

    def embedding_bag_configs(self) -> list:
        return list(self._configs)

    def is_weighted(self) -> bool:
        return self._is_weighted

    def input_dist(self, features: KeyedJaggedTensor) -> DistributedInput:
        """Start sending this rank's ids to the shards' ranks (the all-to-alls run async)."""
        source = source_batch(
            features,
            self._configs,
            weighted=self._is_weighted,
            with_weights=self._with_weights,
            validate_ids=self._validate_ids,
        )
        pending = exchange_start(
            source, self._layout, self._env.rank, self._env.pg, with_weights=self._with_weights
        )
        return DistributedInput(features, pending)

    def compute_and_output_dist(self, dist_input: DistributedInput) -> KeyedTensor:
        """Look up the received ids and send the pooled rows home."""
        received = dist_input.pending.wait()
        batch_size = received.batch_size
        rows: dict[tuple, list[torch.Tensor]] = {}
        for group in self._groups:
            ids, offsets, weights = group_input(group, received)
            out = lookup(group.tables, ids, offsets, weights, group.params)
            rows.setdefault(group.spec.output_class, []).append(out)
        units: dict[int, torch.Tensor] = {}
        for output_class in self._classes:
            units.update(
                distribute(
                    output_class,
                    rows.get(output_class, []),
                    self._specs,
                    rank=self._env.rank,
                    batch_size=batch_size,
                    group=self._env.pg,
                    hosts=self._hosts,
                )
            )
        return self._assemble(units, dist_input.features, batch_size)

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Start the input dist of ``features`` now; the forward that receives this very KJT
        object uses it (see `TrainPipelineSparseDist`)."""
        self._prefetched.append(self.input_dist(features))
        del self._prefetched[:-_MAX_PREFETCHED]

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        for index, prefetched in enumerate(self._prefetched):
            if prefetched.features is features:
                del self._prefetched[: index + 1]  # older ones were never used
                return self.compute_and_output_dist(prefetched)
        return self.compute_and_output_dist(self.input_dist(features))

    def _assemble(self, units, features: KeyedJaggedTensor, batch_size: int) -> KeyedTensor:
        local = None
        if self._local is not None:
            names = [
                f
                for n in self._local_tables
                for c in self._configs
                if c.name == n
                for f in c.feature_names
            ]
            keys = features.keys()
            local = self._local(features.permute([keys.index(f) for f in names])).to_dict()
        per_feature: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for unit in self._layout.units:
            if unit.route == Route.LOCAL:
                assert local is not None
                out = local[unit.feature]
            else:
                out = scale_grad(units[unit.index], self._gradient_scale)
            per_feature.setdefault(unit.feature, []).append((unit.col_start, out))
        names, dims, values = [], [], []
        for config in self._configs:
            for feature in config.feature_names:
                blocks = [t for _, t in sorted(per_feature[feature], key=lambda b: b[0])]
                values.append(blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1))
                names.append(feature)
                dims.append(config.embedding_dim)
        return KeyedTensor(names, dims, torch.cat(values, dim=1))
