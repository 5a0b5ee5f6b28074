"""Where the tables of an embedding collection live: stacked per dim in `BatchedTables`.

[Note: table views]
Each table is a registered ``nn.Parameter`` (``embedding_bags.<table>.weight``: TorchRec's
names, ``state_dict`` and ``named_parameters`` as users expect) whose storage is a slice of its
group's stacked buffer, so the batched kernel reads all tables of a group at once. Moving or
converting the module (``.to``, ``.to_empty``, ``.half``) would give every parameter its own new
storage and break the sharing, so `TableStack.convert` converts the buffers and re-points the same
Parameter objects at slices of the new buffers.

[Note: table names]
A table's name is a key of its collection's `TableDict` and so a part of its state-dict keys
(``embedding_bags.<name>.weight``), which join module names with ".". Any non-empty string
without "." works there, including the names of nn.ModuleDict's own attributes (``items``,
``keys``, ``values``, ``to``, ``forward``, ``type``, ``training``): ``nn.Module.add_module``
refuses those because ``tables.items`` would then mean two things, so `TableDict` stores them in
``_modules`` itself. ``tables["items"]``, ``named_parameters``, ``state_dict`` and
``load_state_dict`` go through ``_modules`` and see the table; attribute access
(``tables.items``, ``get_submodule("embedding_bags.items")``) keeps meaning the attribute.
The names that cannot work are refused: "" by `BaseEmbeddingConfig`, names with "." by
`check_configs` when a collection is built (the planner also uses the configs to describe a
plain module's parameters, whose names have dots).

The rest of shardkit reaches a collection's tables only through the functions here that
``shardkit.modules`` exports: `collection_tables` (what a sharder or the planner reads of an
unsharded collection), `stack_tables` (a new stack of tables with its fused optimizer) and
`fused_tables` (that optimizer's view of each table, for a `FusedOptimizer`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from shardkit.kernels import advise_new_table
from shardkit.modules._kernel import BatchedTables
from shardkit.modules.embedding_configs import (
    TABLE_NAME_RULE,
    BaseEmbeddingConfig,
    EmbeddingBagConfig,
    PoolingType,
    data_type_to_dtype,
)
from shardkit.optim import (
    FusedOptimizer,
    FusedOptimizerConfig,
    FusedTable,
    RowOptimizer,
    fused_config_of,
)

__all__ = [
    "CollectionTables",
    "TableDict",
    "TableGroup",
    "TableStack",
    "TableWeight",
    "check_configs",
    "collection_tables",
    "fused_config",
    "fused_tables",
    "is_mean",
    "stack_tables",
]

logger = logging.getLogger(__name__)


class TableDict(nn.ModuleDict):
    """A collection's tables by name (``embedding_bags``, ``embeddings``): an ``nn.ModuleDict``
    that takes every name a state-dict key can hold, ``"items"`` and ``"to"`` included (see
    [Note: table names])."""

    def __setitem__(self, name: str, module: nn.Module) -> None:
        if name in self._modules or not hasattr(self, name):
            self.add_module(name, module)  # refuses "", names with "." and non-Modules
        elif not isinstance(module, nn.Module):
            raise TypeError(f"{torch.typename(module)} is not a Module subclass")
        else:  # one of nn.ModuleDict's own attribute names
            self._modules[name] = module

    def __setattr__(self, name: str, value: object) -> None:
        # nn.Module refuses a plain value under a child's name ("cannot assign 'bool' as child
        # module 'training'", from train()): attributes and tables live apart here.
        if name in self.__dict__.get("_modules", {}) and not isinstance(value, nn.Module):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)  # type: ignore[arg-type]  # stub: Tensor | Module


class TableWeight(nn.Module):
    """Holds one table's ``weight`` (a view of its group's buffer, see [Note: table views])."""

    def __init__(self, config: BaseEmbeddingConfig, weight: nn.Parameter) -> None:
        super().__init__()
        self.num_embeddings = config.num_embeddings
        self.embedding_dim = config.embedding_dim
        self.pooling = getattr(config, "pooling", PoolingType.NONE)
        self.weight = weight

    def extra_repr(self) -> str:
        pooling = "" if self.pooling == PoolingType.NONE else f", pooling={self.pooling.value}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pooling}"


@dataclass
class TableGroup:
    """Tables of one dim, dtype and fused optimizer, looked up by one kernel call."""

    tables: BatchedTables
    table_indices: list[int]  # into the collection's configs
    params: list[nn.Parameter]  # the tables' Parameters, in `table_indices` order
    config: FusedOptimizerConfig | None


class TableStack:
    """Builds and owns the groups of a collection's tables."""

    def __init__(
        self,
        configs: Sequence[BaseEmbeddingConfig],
        params: Sequence[nn.Parameter],
        fused_config: FusedOptimizerConfig | None,
        table_prefix: str,
    ) -> None:
        self.table_prefix = table_prefix  # "embedding_bags" or "embeddings"
        self.configs = list(configs)
        self.params = list(params)
        self.default_config = fused_config
        self.groups: list[TableGroup] = []
        self.fused_optimizer: FusedOptimizer | None = None

    def wanted_configs(self) -> list[FusedOptimizerConfig | None]:
        """Per table: the optimizer asked for with `apply_optimizer_in_backward`, else the
        collection's ``fused_params``."""
        return [fused_config_of(p) or self.default_config for p in self.params]

    def build(self, device: torch.device) -> None:
        """(Re)stack the tables by (dim, dtype, optimizer), keeping their current values."""
        wanted = self.wanted_configs()
        keys: dict[tuple, list[int]] = {}
        for index, config in enumerate(self.configs):
            dtype = data_type_to_dtype(config.data_type)
            keys.setdefault((config.embedding_dim, dtype, wanted[index]), []).append(index)
        old_values = [p.data for p in self.params]
        self.groups = [
            self._build_group(indices, config, dtype, device, old_values)
            for (_, dtype, config), indices in keys.items()
        ]
        self.fused_optimizer = self._fused_optimizer()
        logger.info(
            "stacked %d table(s) into %d batched group(s): %s",
            len(self.configs),
            len(self.groups),
            [
                (self.configs[g.table_indices[0]].embedding_dim, len(g.table_indices))
                for g in self.groups
            ],
        )

    def needs_rebuild(self) -> bool:
        current: list[FusedOptimizerConfig | None] = [None] * len(self.configs)
        for group in self.groups:
            for index in group.table_indices:
                current[index] = group.config
        return current != self.wanted_configs()

    def _build_group(
        self,
        indices: list[int],
        config: FusedOptimizerConfig | None,
        dtype: torch.dtype,
        device: torch.device,
        old_values: list[torch.Tensor],
    ) -> TableGroup:
        tables = stack_tables(
            [self.configs[index].num_embeddings for index in indices],
            self.configs[indices[0]].embedding_dim,
            dtype=dtype,
            device=device,
            optimizer=config,
        )
        for index, view in zip(indices, tables.table_views()):
            old = old_values[index]
            if old.device.type != "meta" and old.numel() and device.type != "meta":
                view.copy_(old)
            self.params[index].data = view
        return TableGroup(tables, indices, [self.params[i] for i in indices], config)

    def convert(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> list[nn.Parameter]:
        """Apply ``Module._apply``'s ``fn`` to every buffer; re-point the Parameters at the new
        buffers. Returns the parameters: the same objects, unless the tensor type changed
        (e.g. meta -> cpu), where new ones carry the old ones' attributes (as ``Module._apply``)."""
        for group in self.groups:
            was_meta = group.tables.weight.device.type == "meta"
            group.tables.weight = fn(group.tables.weight)
            if group.tables.optimizer is not None:
                group.tables.optimizer.to_(fn)
            if was_meta:  # (``to_empty``: new memory, not yet written)
                advise_new_table(group.tables.weight)
                if group.tables.optimizer is not None:
                    for state in group.tables.optimizer.state.values():
                        advise_new_table(state)
                    group.tables.optimizer.reset_state()  # not garbage: zeros (or Adagrad's)
            for position, (index, view) in enumerate(
                zip(group.table_indices, group.tables.table_views())
            ):
                param = self.params[index]
                if torch._has_compatible_shallow_copy_type(param, view):
                    param.data = view
                else:
                    new = nn.Parameter(view, requires_grad=param.requires_grad)
                    new.__dict__.update(param.__dict__)
                    self.params[index] = group.params[position] = new
        if self.fused_optimizer is not None:
            self.fused_optimizer = self._fused_optimizer()
        return self.params

    def reset_parameters(self) -> None:
        """TorchRec's init: uniform in ``[weight_init_min, weight_init_max]`` (or ``init_fn``)."""
        for config, param in zip(self.configs, self.params):
            if param.device.type == "meta":
                continue
            with torch.no_grad():
                if callable(config.init_fn):
                    config.init_fn(param)
                else:
                    param.uniform_(config.get_weight_init_min(), config.get_weight_init_max())

    def _fused_optimizer(self) -> FusedOptimizer | None:
        fused = []
        for group in self.groups:
            names = [self.configs[index].name for index in group.table_indices]
            keys = [(f"{self.table_prefix}.{name}.weight", name) for name in names]
            fused.extend(fused_tables(group.tables, keys, group.params))
        return FusedOptimizer(fused) if fused else None


def check_configs(configs: Sequence[BaseEmbeddingConfig], kind: type) -> None:
    """Table names without "." and unique, unique feature names across tables, the right config
    class."""
    for config in configs:
        if not isinstance(config, kind):
            raise TypeError(f"expected {kind.__name__}, got {type(config).__name__} for {config!r}")
    names = [c.name for c in configs]
    dotted = [name for name in names if "." in name]
    if dotted:
        raise ValueError(
            f'table name {dotted[0]!r} contains ".": {TABLE_NAME_RULE}; e.g. '
            f"{dotted[0].replace('.', '_')!r}"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"table names must be unique; {repeated} appear more than once")
    owner: dict[str, str] = {}
    for config in configs:
        for feature in config.feature_names:
            if feature in owner:
                raise ValueError(
                    f"feature '{feature}' is looked up in two tables ('{owner[feature]}' and "
                    f"'{config.name}'); a feature maps to one table"
                )
            owner[feature] = config.name


def fused_config(fused_params: Mapping | None) -> FusedOptimizerConfig | None:
    return None if fused_params is None else FusedOptimizerConfig.from_fused_params(fused_params)


def is_mean(config: BaseEmbeddingConfig) -> bool:
    return isinstance(config, EmbeddingBagConfig) and config.pooling == PoolingType.MEAN


@dataclass(frozen=True)
class CollectionTables:
    """What the rest of shardkit reads of an unsharded embedding collection's tables.

    Args:
        configs: the table configs, in the module's order.
        weights: each table's weight Parameter ``[num_embeddings, embedding_dim]``, same order
            (views of the collection's stacked buffers; see [Note: table views]).
        fused_config: the optimizer the collection's ``fused_params`` asked for (None: none);
            `apply_optimizer_in_backward` on a table overrides it for that table.
    """

    configs: tuple[BaseEmbeddingConfig, ...]
    weights: tuple[nn.Parameter, ...]
    fused_config: FusedOptimizerConfig | None


def collection_tables(module: nn.Module) -> CollectionTables:
    """The tables of ``module``, an `EmbeddingBagCollection` or `EmbeddingCollection`."""
    stack = getattr(module, "_stack", None)
    if not isinstance(stack, TableStack):
        raise TypeError(
            f"{type(module).__name__} is not a shardkit embedding collection; expected an "
            "EmbeddingBagCollection or EmbeddingCollection"
        )
    return CollectionTables(tuple(stack.configs), tuple(stack.params), stack.default_config)


def stack_tables(
    num_rows: Sequence[int],
    dim: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    optimizer: FusedOptimizerConfig | None,
) -> BatchedTables:
    """Uninitialised tables of ``num_rows[k]`` rows each, stacked in one ``[sum(num_rows), dim]``
    buffer, with the state of ``optimizer`` fused into their backward (None: dense gradients)."""
    row_starts = [0]
    for rows in num_rows:
        row_starts.append(row_starts[-1] + rows)
    weight = torch.empty((row_starts[-1], dim), dtype=dtype, device=device)
    advise_new_table(weight)  # before the first write: [Note: huge pages from the first write]
    fused = None
    if optimizer is not None:
        fused = RowOptimizer(optimizer, row_starts[-1], dim, device, prepare=advise_new_table)
    return BatchedTables(weight, row_starts, fused)


def fused_tables(
    tables: BatchedTables,
    keys: Sequence[tuple[str, str]],
    params: Sequence[nn.Parameter],
) -> list[FusedTable]:
    """The fused optimizer's view of each table of ``tables`` (none if no optimizer is fused).

    Args:
        tables: the stack.
        keys: per table of the stack, (the Parameter's key in the module, the table's name).
        params: per table of the stack, its Parameter (a view of the stack).
    """
    if tables.optimizer is None:
        return []
    starts = tables.row_starts
    return [
        FusedTable(
            name=key,
            table=table,
            param=param,
            optimizer=tables.optimizer,
            row_start=starts[k],
            row_end=starts[k + 1],
        )
        for k, ((key, table), param) in enumerate(zip(keys, params, strict=True))
    ]
