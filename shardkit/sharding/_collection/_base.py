"""What sharded bag and sequence collections share: shards, kernel groups, replicas of
data-parallel tables, state dicts, the fused optimizer and the input dist.

A subclass says which unsharded module it shards (``_TABLES``, the attribute and state-dict
prefix of its tables) and implements `compute_and_output_dist`.

[Note: sharded collections under torch.compile]
A sharded collection's forward is collectives (the input dist's all-to-alls, the output
dist's) around local lookups, and its backward more of them. Traced, each collective would be
a graph break, or a functional collective with another wire protocol than the one the eager
path and the other ranks run. So under `torch.compile` the whole sharded forward runs eagerly
(`torch.compiler.disable`): the model's graph breaks there once on each side, the dense part
around it compiles, and its autograd graph joins the compiled parts' as any eager op's does.
One INFO line says so, the first time a compiled model calls it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardkit.modules import (
    BaseEmbeddingConfig,
    CollectionTables,
    PoolingType,
    TableDict,
    collection_tables,
)
from shardkit.sharding._collection._build import (
    DEFAULT_FUSED,
    check_row_norm_rules,
    local_replica,
    mark_column_split_dense,
    shard_initialiser,
    table_keys,
)
from shardkit.sharding._collection._fused_optimizer import ShardedFusedOptimizer
from shardkit.sharding._collection._grad import scale_grad
from shardkit.sharding._collection._replicas import ReplicaGroup, ReplicaTable, build_replica_groups
from shardkit.sharding._collection._shard_groups import (
    ShardGroup,
    build_shard_group,
    classes,
    shard_group_specs,
)
from shardkit.sharding._collection._state_hooks import (
    ShardedTable,
    load_state_dict_pre_hook,
    state_dict_hook,
)
from shardkit.sharding._device import resolve_device
from shardkit.sharding._dist._input import (
    PendingInput,
    SourceBatch,
    exchange_start,
    exchange_status,
)
from shardkit.sharding._dist._output import HostGroups
from shardkit.sharding._dist._qcomm import check_codecs
from shardkit.sharding._dist._source import expanded_features, source_batch, variable_batch_inverse
from shardkit.sharding._layout import Route, ShardSlice, Unit, build_layout
from shardkit.sparse import KeyedJaggedTensor
from shardkit.types import ParameterSharding, ShardingEnv

__all__ = ["DEFAULT_FUSED", "DistributedInput", "ShardedCollection", "ShardedTable"]

logger = logging.getLogger(__name__)

_OUTSIDE_GRAPH: dict[Callable[..., Any], Callable[..., Any]] = {}


def _outside_graph(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.disable(fn)``, made at the first traced call rather than as a decorator:
    the decorator imports ``torch._dynamo`` and with it ``torch.distributed.fsdp`` and sympy,
    which made ``import shardkit`` take 1.7 s beyond torch's own import instead of 0.3 s (a
    loaded 2-core Zen 3) in every process, compiled or not; a traced call has dynamo loaded."""
    eager = _OUTSIDE_GRAPH.get(fn)
    if eager is None:
        eager = _OUTSIDE_GRAPH[fn] = torch.compiler.disable(fn)
    return eager


# False while a `DMPCollection` builds its groups' collections: its DENSE data-parallel tables are
# replicas over every rank (DDP on the global group, TorchRec's 2-D semantics), which the
# exchange inside one sharding group would not give (see [Note: 2-D parallelism]).
_DENSE_BY_EXCHANGE = contextvars.ContextVar("shardkit_dense_by_exchange", default=True)


@contextlib.contextmanager
def dense_replicas_by_ddp() -> Iterator[None]:
    """Collections built inside keep DENSE data-parallel tables as local replicas for DDP."""
    token = _DENSE_BY_EXCHANGE.set(False)
    try:
        yield
    finally:
        _DENSE_BY_EXCHANGE.reset(token)


@dataclass
class DistributedInput:
    """A batch whose ids are on their way to the shards (see `ShardedCollection.input_dist`)."""

    features: KeyedJaggedTensor
    pending: PendingInput
    source: SourceBatch | None = None  # this rank's checked batch, per feature
    full: KeyedJaggedTensor | None = None  # VBE: the data-parallel features, expanded
    inverse: torch.Tensor | None = None  # VBE: [F, B] each feature's bag of each example


class ShardedCollection(nn.Module):
    """Shared by `ShardedEmbeddingBagCollection` and `ShardedEmbeddingCollection`.

    Args:
        module: the unsharded collection; its configs, and its weights when they are
            materialised (each rank copies its shards; on "meta" shards are initialised anew).
        plan: table name -> `ParameterSharding` for this module.
        env: the ranks and their process shard_group.
        device: where this rank's shards live.
        fused_params: the fused optimizer of FUSED tables that `apply_optimizer_in_backward` did
            not set (default: the module's own ``fused_params``, else SGD with lr 0.01).
        local_world_size: ranks per host (for table-row-wise); default: all on one host.
        gradient_division: scale the tables' gradients by ``1 / world size`` so that they match
            data-parallel's averaged dense gradients (and unsharded training on the global
            batch with a mean loss), as TorchRec does by default.
        qcomm_codecs_registry: codecs of the output dists by `CommOp` name, e.g.
            ``get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.BF16))``; see
            [Note: compressed collectives].
    """

    _TABLES = ""
    # data-parallel tables kept equal by exchange: FUSED ones, and DENSE ones (their dense
    # gradient computed from the exchanged ids; see [Note: dense data-parallel tables by exchange])
    _FUSED_REPLICAS = True
    _ACCEPTS_VARIABLE_BATCH = False  # a batch size per key (VBE); bags only

    def __init__(
        self,
        module: Any,
        plan: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | str | None = None,
        *,
        fused_params: Mapping[str, Any] | None = None,
        local_world_size: int | None = None,
        gradient_division: bool = True,
        qcomm_codecs_registry: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        tables = collection_tables(module)
        check_codecs(qcomm_codecs_registry, [c.name for c in tables.configs])
        self._qcomm_codecs_registry = dict(qcomm_codecs_registry or {})
        self._unsharded_module_type = type(module)
        self._configs: list[BaseEmbeddingConfig] = list(tables.configs)
        self._is_weighted = getattr(module, "is_weighted", lambda: False)()
        self._env = env
        self._device = resolve_device(device, env)
        self._validate_ids = module.validate_ids
        world = env.world_size
        self._layout = build_layout(
            self._configs, plan, world_size=world, local_world_size=local_world_size or world
        )
        self._gradient_scale = 1.0 / world if gradient_division else 1.0
        self._with_weights = self._is_weighted or any(
            getattr(c, "pooling", None) == PoolingType.MEAN for c in self._configs
        )
        keys = self._table_keys(tables, plan, fused_params)
        self._specs = [shard_group_specs(self._layout, r, keys) for r in range(world)]
        self._classes = classes(self._layout)
        self._shard_groups = self._build_shard_groups(tables)
        self._replica_groups = self._build_replica_groups(tables, keys)
        self._hosts = None
        if self._layout.units_of(Route.HOST_SUMMED):
            self._hosts = HostGroups(world, self._layout.local_world_size, env.rank)
        setattr(self, self._TABLES, TableDict())  # any table name (see TableDict)
        self._local = self._build_local(module, tables)
        self._register_tables()
        mark_column_split_dense(self, self._configs, keys, shards_of=self.table_shards)
        fused = ShardedFusedOptimizer(self)
        self.fused_optimizer: ShardedFusedOptimizer | None = fused if fused.params else None
        self._register_state_dict_hook(state_dict_hook)
        self._register_load_state_dict_pre_hook(self._load_state_dict_pre_hook)
        if self._ACCEPTS_VARIABLE_BATCH and self._local_or_replicated():
            logger.info(
                "variable-batch (VBE) input: data-parallel tables %s look up the expanded "
                "batch; the sharded tables' deduplicated bags are sent and looked up once",
                self._local_or_replicated(),
            )
        logger.info(
            "rank %d: %d local shard group(s), %d output class(es), %d data-parallel table(s)",
            env.rank,
            len(self._shard_groups),
            len(self._classes),
            len(self._local_tables),
        )

    # -- construction --------------------------------------------------------------------

    @property
    def tables(self) -> TableDict:
        return getattr(self, self._TABLES)

    @property
    def sharding_env(self) -> ShardingEnv:
        """The ranks this collection is sharded over, and their process group."""
        return self._env

    @property
    def unsharded_module_type(self) -> type[nn.Module]:
        """The type of the collection this one shards (TorchRec's `ShardedModule` property)."""
        return self._unsharded_module_type

    @property
    def qcomm_codecs_registry(self) -> dict[str, Any]:
        """The codecs of the output dists by `CommOp` name (see [Note: compressed
        collectives]); empty: float32."""
        return self._qcomm_codecs_registry

    def feature_names(self) -> list[str]:
        """The features (KJT keys) this collection looks up, in table order."""
        return [f for c in self._configs for f in c.feature_names]

    def _table_keys(self, tables: CollectionTables, plan, fused_params) -> list[tuple]:
        """Each table's (dtype, fused optimizer config or None), checked against the layout."""
        keys = table_keys(
            self._configs, tables.weights, plan=plan, fused_params=fused_params,
            module_default=tables.fused_config,
        )  # fmt: skip
        check_row_norm_rules(self._configs, keys, plan=plan, shards_of=self.table_shards)
        return keys

    def _build_shard_groups(self, tables: CollectionTables) -> list[ShardGroup]:
        initial = shard_initialiser(self._configs, tables.weights)
        return [
            build_shard_group(spec, self._device, initial) for spec in self._specs[self._env.rank]
        ]

    def _build_replica_groups(self, tables: CollectionTables, keys) -> list[ReplicaGroup]:
        """Data-parallel tables with the FUSED kernel (see [Note: sparse data-parallel tables]),
        and with the DENSE kernel where they are kept equal by exchange (see [Note: dense
        data-parallel tables by exchange])."""
        replicated = self._replicated(fused=True)
        if replicated and not self._FUSED_REPLICAS:
            raise ValueError(
                f"data-parallel tables {replicated} of a {self._unsharded_module_type.__name__} "
                "have the FUSED kernel, which data-parallel tables have only in bag collections; "
                "plan them with the DENSE kernel (data_parallel())"
            )
        weights = dict(zip((c.name for c in self._configs), tables.weights))
        exchanged = self._exchanged_dense()
        dense = [name for name in self._replicated(fused=False) if name not in exchanged]
        return build_replica_groups(
            self._configs, keys, replicated + exchanged, dense, self._device, weights, self._env.pg
        )

    def _exchanged_dense(self) -> list[str]:
        """The DENSE data-parallel tables kept equal by exchange (bag collections' only)."""
        if not (self._FUSED_REPLICAS and _DENSE_BY_EXCHANGE.get()):
            return []
        return self._replicated(fused=False)

    def _local_or_replicated(self) -> list[str]:
        return self._replicated(fused=True) + self._replicated(fused=False)

    def _replicated(self, *, fused: bool) -> list[str]:
        return [self._configs[i].name for i in self._layout.replicated_tables(fused=fused)]

    def _build_local(self, module: Any, tables: CollectionTables) -> nn.Module | None:
        """Data-parallel tables with the DENSE kernel: a replica, looked up like the unsharded
        module."""
        dense = set(self._replicated(fused=False)) - set(self._exchanged_dense())
        self._local_tables = [c.name for c in self._configs if c.name in dense]  # table order
        return local_replica(
            module, self._configs, tables.weights, names=self._local_tables,
            device=self._device, tables_attr=self._TABLES,
        )  # fmt: skip

    def _register_tables(self) -> None:
        shards: dict[str, tuple[list, list]] = {}
        for shard_group in self._shard_groups:
            for slice_, param in zip(shard_group.spec.shards, shard_group.params):
                entry = shards.setdefault(slice_.table, ([], []))
                entry[0].append(slice_)
                entry[1].append(param)
        replicas = {
            name: param
            for group in self._replica_groups
            for name, param in zip(group.names, group.params)
        }
        for config in self._configs:
            if config.name in replicas:
                self.tables[config.name] = ReplicaTable(replicas[config.name])
            elif config.name in self._local_tables:
                assert self._local is not None
                self.tables[config.name] = getattr(self._local, self._TABLES)[config.name]
            else:
                slices, params = shards.get(config.name, ([], []))
                self.tables[config.name] = ShardedTable(slices, params)

    # -- state dict: see [Note: sharded state dicts] --------------------------------------

    def _sharded_tables(self) -> list[tuple[BaseEmbeddingConfig, ShardedTable]]:
        return [
            (c, table)
            for c in self._configs
            if isinstance(table := self.tables[c.name], ShardedTable)
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
        load_state_dict_pre_hook(self, state_dict, prefix)

    # -- input dist ------------------------------------------------------------------------

    def input_dist(self, features: KeyedJaggedTensor, *, tag: int = 0) -> DistributedInput:
        """Start sending this rank's ids to the shards' ranks (the all-to-alls run async).
        ``tag``: a number every rank must send alike in its header (see `_dist._header`)."""
        inverse = None
        if self._ACCEPTS_VARIABLE_BATCH:
            inverse = variable_batch_inverse(features, self.feature_names())
        local = [u.feature for u in self._layout.units_of(Route.LOCAL)]
        full = expanded_features(features, inverse, local)
        source = source_batch(
            features,
            self._configs,
            weighted=self._is_weighted,
            with_weights=self._with_weights,
            validate_ids=self._validate_ids,
            device=self._device,
            inverse=inverse,
            expanded=full,
        )
        pending = exchange_start(
            source,
            self._layout,
            self._env.rank,
            self._env.pg,
            with_weights=self._with_weights,
            device=self._device,
            tag=tag,
        )
        vbe = inverse if isinstance(inverse, torch.Tensor) else None
        return DistributedInput(features, pending, source, full, vbe)

    def join_without_input(self, *, exhausted: bool, tag: int = 0) -> None:
        """Take part in this collection's input dist with a header alone: no batch left
        (``exhausted``), or none for this collection (see `exchange_status`)."""
        exchange_status(
            self._layout, self._env.rank, self._env.pg,
            exhausted=exhausted, device=self._device, tag=tag,
        )  # fmt: skip

    def compute_and_output_dist(self, dist_input: DistributedInput) -> Any:
        raise NotImplementedError

    def forward(self, features: KeyedJaggedTensor) -> Any:
        """The input dist, then compute and output dist; a train pipeline swaps in a forward
        that uses the input dist it started ahead (see [Note: pipelined forward] in
        `sharding._pipeline._prefetches`)."""
        if torch.compiler.is_compiling():  # see [Note: sharded collections under torch.compile]
            run_eagerly = _outside_graph(type(self)._forward_outside_graph)
            return run_eagerly(self, features, traced=True)
        return self._forward(features)

    def _forward_outside_graph(self, features: KeyedJaggedTensor, *, traced: bool) -> Any:
        if traced and not getattr(self, "_said_graph_break", False):
            self._said_graph_break = True
            logger.info(
                "torch.compile: %s runs eagerly between compiled graphs (a graph break): its "
                "input and output dists are collectives; the model around it compiles",
                type(self).__name__,
            )
        return self._forward(features)

    def _forward(self, features: KeyedJaggedTensor) -> Any:
        return self.compute_and_output_dist(self.input_dist(features))

    def _local_features(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The KJT of the data-parallel tables' features only."""
        names = [f for c in self._configs if c.name in self._local_tables for f in c.feature_names]
        keys = features.keys()
        return features.permute([keys.index(f) for f in names])

    def _local_rows(self, features: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        """Output rows of each data-parallel feature, looked up by the local replica."""
        raise NotImplementedError

    def _feature_rows(
        self, features: KeyedJaggedTensor, received: Callable[[Unit], torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Each feature's output rows: its units' column blocks side by side, in column order.

        A block comes from the data-parallel replica, or is ``received(unit)`` from the shards,
        its gradient scaled by ``gradient_division``. See [Note: routes].
        """
        local = {} if self._local is None else self._local_rows(features)
        blocks: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for unit in self._layout.units:
            if unit.route == Route.LOCAL:
                rows = local[unit.feature]
            else:
                rows = scale_grad(received(unit), self._gradient_scale)
            blocks.setdefault(unit.feature, []).append((unit.col_start, rows))
        return {feature: _side_by_side(parts) for feature, parts in blocks.items()}


def _side_by_side(blocks: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """(first column, rows ``[N, cols]``) blocks -> ``[N, sum(cols)]`` in column order."""
    parts = [rows for _, rows in sorted(blocks, key=lambda block: block[0])]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
