"""The fused optimizer of a sharded collection, in TorchRec's layout.

[Note: fused optimizer state in TorchRec's layout]
``collection.fused_optimizer`` (and so ``dmp.fused_optimizer``) is keyed by table, as
TorchRec's ``EmbeddingFusedOptimizer``: ``params`` maps ``"<tables>.<table>.weight"`` to the
table's ShardedTensor (the one ``state_dict()`` shows), and ``state[param]`` holds one entry per
state buffer, named ``"<table>.<state>"`` by FBGEMM's convention (the first buffer is
``momentum1``, Adam's and LAMB's second ``exp_avg_sq``), each a ShardedTensor with global
offsets whose local shards are views of this rank's live state:

- state with one value per element (Adagrad, Adam's moments): the table's own shape and
  shards;
- state with one value per row (row-wise Adagrad): 1-D. A table whose shards all span its
  columns (table-wise, row-wise, table-row-wise) has ``[rows]``, each shard at its first row;
  one split into column blocks (column-wise, table-column-wise, grid) keeps an accumulator per
  block, ``[rows * blocks]``, block ``c``'s rows at ``c * rows`` (TorchRec's offsets);
- data-parallel tables with the FUSED kernel: plain tensors of the whole table (replicated).

So ``torch.distributed.checkpoint`` reshards it between plans as it does the weights: a load
into another plan's ``fused_optimizer.state_dict()`` fills that plan's views, and
``load_state_dict`` copies them into the live state (a no-op copy when they are the views). A
checkpoint of a column-split row-wise state loads only into a plan with as many column blocks:
the accumulators of other splits are other numbers (the shapes differ, and torch's loader says
so).

One difference from TorchRec, deliberately: rules whose update reads the step count (Adam,
LAMB, the partial row-wise ones, LARS) also carry ``"<table>.step"``, the live 0-d counter
(replicated), so their bias correction resumes where it stopped after a load; TorchRec's
restarts it. SGD and the Adagrads, whose update does not read it, carry exactly TorchRec's
entries. A saved state without step counts (TorchRec's) loads, and the counts stay; through
``torch.distributed.checkpoint`` a strict load of such a checkpoint names the missing
``"<table>.step"`` key, and ``DefaultLoadPlanner(allow_partial_load=True)`` loads the rest. The
unsharded collection's fused optimizer (`shardkit.optim.FusedOptimizer`) saves the same names,
so DCP loads either module's checkpoint into the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import (
    ShardedTensorMetadata,
    TensorProperties,
)

from shardkit.optim import KeyedOptimizer, RowOptimizer
from shardkit.sharding._collection._state import placement, quiet_sharded_tensor, sharded_tensor
from shardkit.sharding._layout import ShardSlice

__all__ = ["ShardedFusedOptimizer"]


class _Local(NamedTuple):
    """One local piece of a table: its slice of the table, the stack's rule it lives under,
    its rows' start in that stack, and its Parameter."""

    slice: ShardSlice
    optimizer: RowOptimizer
    start: int
    param: torch.Tensor


class ShardedFusedOptimizer(KeyedOptimizer):
    """The optimizer fused into a sharded collection's backward, keyed by table in TorchRec's
    layout (see [Note: fused optimizer state in TorchRec's layout]). ``step`` and
    ``zero_grad`` do nothing: the kernel steps the tables in backward. ``param_groups`` are
    the stacks' live hyperparameter dicts, so an LR change (or scheduler) takes effect at the
    next backward. The state's tensors are views of the live state (sharded collections
    never move their buffers)."""

    def __init__(self, collection: Any) -> None:
        self._collection = collection
        self._pieces: dict[str, list[_Local]] = {}
        self._replicated: set[str] = set()
        for group in collection._shard_groups:
            optimizer = group.tables.optimizer
            if optimizer is None:
                continue
            starts = group.tables.row_starts
            for k, (slice_, param) in enumerate(zip(group.spec.shards, group.params)):
                if slice_.rows and slice_.cols:
                    piece = _Local(slice_, optimizer, starts[k], param)
                    self._pieces.setdefault(slice_.table, []).append(piece)
        configs = {c.name: c for c in collection._configs}
        for replicas in collection._replica_groups:
            optimizer = replicas.tables.optimizer
            if optimizer is None:
                continue
            starts = replicas.tables.row_starts
            for k, (name, param) in enumerate(zip(replicas.names, replicas.params)):
                config = configs[name]
                whole = ShardSlice(
                    name, collection._env.rank, 0, config.num_embeddings, 0, config.embedding_dim
                )
                self._pieces[name] = [_Local(whole, optimizer, starts[k], param)]
                self._replicated.add(name)
        order = [c.name for c in collection._configs if c.name in self._pieces]
        params = {f"{collection._TABLES}.{name}.weight": self._weight(name) for name in order}
        groups: list[dict[str, Any]] = []
        for name, weight in zip(order, params.values()):
            group = self._pieces[name][0].optimizer.param_group
            if all(g is not group for g in groups):
                group["params"] = []
                groups.append(group)
            group["params"].append(weight)
        state = {weight: self._table_state(name) for name, weight in zip(order, params.values())}
        super().__init__(params, state, groups)

    def __repr__(self) -> str:
        return f"ShardedFusedOptimizer({list(self.params)})"

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Nothing to do: the tables were updated during backward."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: fused tables never hold a gradient."""

    def local_state_tensors(self) -> list[torch.Tensor]:
        """This rank's live floating-point state blocks, table by table (what replicas of a
        sharding group average)."""
        found: list[torch.Tensor] = []
        for entries in self.state.values():
            for value in entries.values():
                if isinstance(value, ShardedTensor):
                    with quiet_sharded_tensor():
                        found.extend(shard.tensor for shard in value.local_shards())
                elif value.is_floating_point() and value.dim():
                    found.append(value)
        return found

    # -- building the layout ---------------------------------------------------------------

    def _weight(self, name: str) -> torch.Tensor:
        pieces = self._pieces[name]
        if name in self._replicated:
            return pieces[0].param
        collection = self._collection
        config = next(c for c in collection._configs if c.name == name)
        return sharded_tensor(
            (config.num_embeddings, config.embedding_dim),
            collection.table_shards(name),
            [(p.slice, p.param.detach()) for p in pieces],
            collection._device,
            collection._env.pg,
        )

    def _table_state(self, name: str) -> dict[str, Any]:
        pieces = self._pieces[name]
        optimizer = pieces[0].optimizer
        renamed = optimizer.torchrec_state_names()
        entries: dict[str, Any] = {}
        for ours, theirs in renamed.items():
            blocks = [p.optimizer.state[ours][p.start : p.start + p.slice.rows] for p in pieces]
            if name in self._replicated:
                entries[f"{name}.{theirs}"] = blocks[0]
            else:
                entries[f"{name}.{theirs}"] = self._sharded_state(name, blocks)
        if optimizer.reads_step:
            entries[f"{name}.step"] = optimizer.step_count
        return entries

    def _sharded_state(self, name: str, blocks: Sequence[torch.Tensor]) -> ShardedTensor:
        collection = self._collection
        shards = [s for s in collection.table_shards(name) if s.rows and s.cols]
        config = next(c for c in collection._configs if c.name == name)
        rows = config.num_embeddings
        if blocks[0].dim() == 2:  # one value per element: the table's own layout
            pieces = self._pieces[name]
            return sharded_tensor(
                (rows, config.embedding_dim),
                shards,
                [(p.slice, b) for p, b in zip(pieces, blocks)],
                collection._device,
                collection._env.pg,
            )
        columns = sorted({s.col_start for s in shards})

        def offset(s: ShardSlice) -> int:
            return columns.index(s.col_start) * rows + s.row_start

        def metadata(s: ShardSlice) -> ShardMetadata:
            return ShardMetadata(
                shard_offsets=[offset(s)],
                shard_sizes=[s.rows],
                placement=placement(s.rank, collection._device, collection._env.pg),
            )

        global_metadata = ShardedTensorMetadata(
            shards_metadata=[metadata(s) for s in shards],
            size=torch.Size([rows * len(columns)]),
            tensor_properties=TensorProperties(
                dtype=blocks[0].dtype, layout=torch.strided, requires_grad=False
            ),
        )
        local = [
            Shard(tensor=b, metadata=metadata(p.slice)) for p, b in zip(self._pieces[name], blocks)
        ]
        with quiet_sharded_tensor():
            return ShardedTensor._init_from_local_shards_and_global_metadata(
                local, global_metadata, process_group=collection._env.pg
            )
