"""State dicts of sharded collections: each table as one ShardedTensor with global offsets.

[Note: sharded state dicts]
``state_dict()`` shows table ``t`` as ``embedding_bags.t.weight``: a ShardedTensor of the whole
table's shape whose local shards are views of this rank's shard Parameters and whose metadata
lists every shard (offsets, sizes, rank). ``torch.distributed.checkpoint`` saves each rank's
shards in parallel and loads them into any other sharding (it writes in place into the views),
which is how checkpoints are resharded. ``load_state_dict`` takes that key with either a
ShardedTensor whose shards match this rank's, or a full tensor (e.g. an unsharded checkpoint),
from which each rank copies its blocks. Data-parallel tables are plain tensors.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata as TorchShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import (
    ShardedTensorMetadata,
    TensorProperties,
)

from shardkit.sharding._layout import ShardSlice

__all__ = [
    "block_of",
    "fused_state",
    "load_fused_state",
    "placement",
    "reset_rows",
    "sharded_tensor",
]


def placement(rank: int, device: torch.device, group: dist.ProcessGroup | None) -> str:
    """torch's placement string of rank ``rank`` of ``group``: placements name global ranks
    (in 2-D parallelism ``group`` is a subgroup)."""
    where = "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
    if group is not None and group is not dist.group.WORLD:
        rank = dist.get_global_rank(group, rank)
    return f"rank:{rank}/{where}"


def _metadata(
    shard: ShardSlice, device: torch.device, group: dist.ProcessGroup | None
) -> TorchShardMetadata:
    return TorchShardMetadata(
        shard_offsets=[shard.row_start, shard.col_start],
        shard_sizes=[shard.rows, shard.cols],
        placement=placement(shard.rank, device, group),
    )


def sharded_tensor(
    shape: tuple[int, int],
    all_shards: Sequence[ShardSlice],
    local: Sequence[tuple[ShardSlice, torch.Tensor]],
    device: torch.device,
    group: dist.ProcessGroup | None,
) -> ShardedTensor:
    """One table as a ShardedTensor: ``local`` are (slice, tensor) of this rank's shards."""
    shards = [s for s in all_shards if s.rows and s.cols]  # empty shards hold nothing
    if not local:
        dtype = torch.float32
    else:
        dtype = local[0][1].dtype
    metadata = ShardedTensorMetadata(
        shards_metadata=[_metadata(s, device, group) for s in shards],
        size=torch.Size(shape),
        tensor_properties=TensorProperties(dtype=dtype, layout=torch.strided, requires_grad=False),
    )
    local_shards = [
        Shard(tensor=tensor, metadata=_metadata(slice_, device, group))
        for slice_, tensor in local
        if slice_.rows and slice_.cols
    ]
    with quiet_sharded_tensor():
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            local_shards, metadata, process_group=group
        )


@contextlib.contextmanager
def quiet_sharded_tensor() -> Iterator[None]:
    """torch deprecates ShardedTensor in favour of DTensor, which cannot place arbitrary blocks
    (a table on rank 1, column shards on chosen ranks); TorchRec and torch.distributed.checkpoint
    still use it, and so do we, without a warning per call."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Please use DTensor instead", category=FutureWarning
        )
        yield


def block_of(value: Any, shard: ShardSlice, key: str) -> torch.Tensor:
    """This shard's block of a saved table: from a full tensor, or from a ShardedTensor whose
    local shard has the same offsets and sizes."""
    if isinstance(value, ShardedTensor):
        with quiet_sharded_tensor():
            shards = value.local_shards()
        for local in shards:
            meta = local.metadata
            if list(meta.shard_offsets) == [shard.row_start, shard.col_start] and list(
                meta.shard_sizes
            ) == [shard.rows, shard.cols]:
                return local.tensor
        raise ValueError(
            f"{key}: the ShardedTensor given has no local shard at rows {shard.row_start}+"
            f"{shard.rows}, columns {shard.col_start}+{shard.cols} (this rank's shard); to load "
            "another sharding, load with torch.distributed.checkpoint into this module's "
            "state_dict(), which reshards"
        )
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{key}: expected a tensor or ShardedTensor, got {type(value).__name__}")
    rows, cols = shard.row_start + shard.rows, shard.col_start + shard.cols
    if value.dim() != 2 or value.shape[0] < rows or value.shape[1] < cols:
        raise ValueError(
            f"{key}: a table of shape {tuple(value.shape)} cannot hold this rank's shard "
            f"(rows {shard.row_start}:{rows}, columns {shard.col_start}:{cols})"
        )
    return value[shard.row_start : rows, shard.col_start : cols]


def fused_state(collection: Any) -> dict[str, Any]:
    """The fused optimizer's state of a sharded collection, laid out like its tables.

    ``{"<table>.<state>": ShardedTensor [rows, dim]}`` plus ``"<table>.step"``. Row-wise
    Adagrad's one value per row is repeated across the shard's columns, so that the state
    tiles the table exactly like the weights and reshards the same way (see
    `load_fused_state`). Blocks of 2-D state are views of the live state (a load through
    torch.distributed.checkpoint writes into them in place), row-wise Adagrad's repeated
    blocks are copies: always write back with `load_fused_state`.
    """
    out: dict[str, Any] = {}
    for config, tables, position, slice_ in _fused_shards(collection):
        optimizer = tables.optimizer
        start, end = tables.row_starts[position], tables.row_starts[position + 1]
        for name, state in optimizer.state.items():
            block = state[start:end]
            if block.dim() == 1:  # row-wise: [rows] -> [rows, cols]
                block = block.unsqueeze(1).expand(-1, slice_.cols)
            out.setdefault(f"{config.name}.{name}", []).append((slice_, block.contiguous()))
        out[f"{config.name}.step"] = torch.tensor(float(optimizer.step))
    shapes = {c.name: (c.num_embeddings, c.embedding_dim) for c in collection._configs}
    replicated = _replicated(collection)
    for key, value in list(out.items()):
        if isinstance(value, list):
            table = key.rsplit(".", 1)[0]
            if table in replicated:  # a data-parallel replica's state: the whole table
                out[key] = value[0][1]
                continue
            out[key] = sharded_tensor(
                shapes[table],
                collection.table_shards(table),
                value,
                collection._device,
                collection._env.pg,
            )
    return out


def load_fused_state(collection: Any, state: dict[str, Any]) -> None:
    """Write state laid out by `fused_state` (and filled, e.g., by a checkpoint load) back into
    the live optimizer. For row-wise Adagrad a shard takes its first column when all its
    columns agree (bit-exact on the same plan) and their mean otherwise (a checkpoint of column
    shards, each with its own accumulator, loaded into a table of wider shards)."""
    for config, tables, position, slice_ in _fused_shards(collection):
        optimizer = tables.optimizer
        start, end = tables.row_starts[position], tables.row_starts[position + 1]
        for name, live in optimizer.state.items():
            value = state[f"{config.name}.{name}"]
            block = block_of(value, slice_, f"{config.name}.{name}")
            if live.dim() == 1:
                same = bool((block == block[:, :1]).all())
                block = block[:, 0] if same else block.mean(1)
            live[start:end].copy_(block)
        step = state.get(f"{config.name}.step")
        if step is not None:
            optimizer.step = int(step)


def _fused_shards(collection: Any):
    """(config, stacked tables, position in the stack, block of the table) of every fused local
    shard, and of every data-parallel replica with the FUSED kernel (the whole table)."""
    configs = {c.name: c for c in collection._configs}
    for shard_group in collection._shard_groups:
        if shard_group.tables.optimizer is None:
            continue
        for position, slice_ in enumerate(shard_group.spec.shards):
            yield configs[slice_.table], shard_group.tables, position, slice_
    rank = collection._env.rank
    for group in getattr(collection, "_replica_groups", []):
        if group.tables.optimizer is None:  # DENSE: the user's optimizer holds the state
            continue
        for position, name in enumerate(group.names):
            config = configs[name]
            whole = ShardSlice(name, rank, 0, config.num_embeddings, 0, config.embedding_dim)
            yield config, group.tables, position, whole


def _replicated(collection: Any) -> set[str]:
    return {name for group in getattr(collection, "_replica_groups", []) for name in group.names}


@torch.no_grad()
def reset_rows(collection: Any, config: Any, rows: torch.Tensor) -> None:
    """Re-initialise the rows ``[E]`` (global row numbers) of table ``config.name`` held by this
    rank, and their fused optimizer state, as the unsharded managed-collision module does when
    an id loses its row: the config's ``init_fn``, else its uniform range."""
    table = collection.tables[config.name]
    for slice_, param in zip(table.shard_slices, table.shards):
        local = _rows_in(slice_, rows)
        if local.numel():
            param.data[local] = _initial_rows(config, local.numel(), slice_.cols, param)
    for found, tables, position, slice_ in _fused_shards(collection):
        if found.name != config.name:
            continue
        local = _rows_in(slice_, rows)
        optimizer = tables.optimizer
        start = tables.row_starts[position]
        initial = optimizer.config.initial_accumulator_value
        for name, state in optimizer.state.items():
            state[start + local] = initial if name == "momentum1" else 0.0


def _rows_in(slice_: ShardSlice, rows: torch.Tensor) -> torch.Tensor:
    inside = (rows >= slice_.row_start) & (rows < slice_.row_start + slice_.rows)
    return rows[inside] - slice_.row_start


def _initial_rows(config: Any, num_rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    rows = torch.empty(num_rows, cols, dtype=like.dtype, device=like.device)
    if callable(config.init_fn):
        result = config.init_fn(rows)
        return result if isinstance(result, torch.Tensor) else rows
    return rows.uniform_(config.get_weight_init_min(), config.get_weight_init_max())
