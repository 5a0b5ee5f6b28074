"""`ShardedManagedCollisionCollection`: the remappers of managed-collision tables, sharded with
their tables (TorchRec's ``torchrec.distributed.mc_modules``).

[Note: sharded managed collision]
A managed-collision table sharded row-wise over ``W`` ranks keeps its ``B`` buckets (``B``
divisible by ``W``) in ``W`` runs of ``B / W`` whole buckets: rank ``i`` (the ``i``-th row shard)
holds rows ``[bounds[i * B / W], bounds[(i + 1) * B / W])`` of the table AND the remapper of
those buckets (slots ``[start, end)`` of every ``_mch_*`` buffer, see [Note: managed-collision
slots]). A table-wise table keeps its whole remapper on the table's rank. Each forward:

1. every rank sends each raw id of each table to the rank of its bucket (row-wise; the id's
   bucket is its block of the input range after the module's ``input_hash_func``, as
   TorchRec routes it) or of the table
   (table-wise): one all-to-all of counts (with a status flag, so a bad input on one rank
   raises on all), one of ids;
2. each rank remaps the ids it received from every rank as ONE training iteration of its
   remapper (the unsharded module sees the global batch as one iteration: the same ids, the
   same decisions), and resets the embedding rows (and their fused optimizer state) whose id
   changed, in its own shard;
3. the rows go back to the ids' ranks by the reverse all-to-all; the remapped KJT then goes
   through the sharded collection like any other input.

The row-wise shard bounds are the bucket bounds (``floor`` splits); where the plan's even split
differs (rows not divisible by ``W``), the sharder moves the bounds (one INFO line per table).
A remapper of one bucket (MCH's default) is rebuilt row-wise with one bucket per rank, as TorchRec
rebuilds its sharded remappers (`rebucketed`): the table then behaves as the unsharded module with
``buckets=W``, and its checkpoints load at ``W`` ranks (or into that module), not at others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed._shard.metadata import ShardMetadata as TorchShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import (
    ShardedTensorMetadata,
    TensorProperties,
)

from shardkit import comm
from shardkit.modules import BaseEmbeddingConfig, with_values
from shardkit.modules.mc_modules import ManagedCollisionModule, MCHManagedCollisionModule
from shardkit.sharding._collection._state import quiet_sharded_tensor
from shardkit.sharding._dist._input import InputError
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor
from shardkit.types import ParameterSharding, ShardingEnv

__all__ = ["McTable", "ShardedManagedCollisionCollection"]

logger = logging.getLogger(__name__)

# rows -> None: reset rows (global numbers) of one table in this rank's shard
ResetRows = Callable[[str, torch.Tensor], None]


class McTable:
    """Where one managed-collision table's remapper lives (the same on every rank).

    Args:
        name: the table.
        num_rows: its rows (``zch_size``).
        owners: the rank of each run of buckets, in row order (table-wise: one).
        bounds: the row bounds of the runs (``len(owners) + 1``).
        buckets: the table's buckets.
    """

    def __init__(
        self, name: str, num_rows: int, owners: list[int], bounds: list[int], buckets: int
    ) -> None:
        self.name = name
        self.num_rows = num_rows
        self.owners = owners
        self.bounds = bounds
        self.buckets = buckets

    def run_of(self, rank: int) -> int | None:
        return self.owners.index(rank) if rank in self.owners else None

    def owner_of(self, buckets: torch.Tensor) -> torch.Tensor:
        """``[N]`` buckets -> ``[N]`` ranks that own them."""
        owners = torch.tensor(self.owners, dtype=torch.int64, device=buckets.device)
        return owners[buckets // (self.buckets // len(self.owners))]


def mc_tables(
    modules: Mapping[str, ManagedCollisionModule], plan: Mapping[str, ParameterSharding]
) -> dict[str, McTable]:
    """Every table's `McTable` from its unsharded remapper and its (bucket-aligned) plan."""
    out = {}
    for name, module in modules.items():
        spec = plan[name].sharding_spec
        assert spec is not None, "managed-collision tables are row-wise or table-wise"
        shards = sorted(spec.shards, key=lambda s: s.shard_offsets[0])
        owners = [s.placement.rank() for s in shards]
        bounds = [s.shard_offsets[0] for s in shards] + [module.output_size()]
        out[name] = McTable(name, module.output_size(), owners, bounds, module.buckets())
    return out


class ShardedManagedCollisionCollection(nn.Module):
    """The remappers of a `ManagedCollisionCollection` whose tables are sharded row-wise or
    table-wise: this rank keeps the remapper of its buckets of each table. See
    [Note: sharded managed collision].

    Args:
        module: the unsharded `ManagedCollisionCollection` (its state, if any, is copied).
        plan: table name -> bucket-aligned `ParameterSharding` (see `aligned_plan`).
        env: the ranks.
        device: where this rank's remappers live.
        remappers: the unsharded remappers to shard, if not the module's own (`rebucketed`).
    """

    def __init__(
        self,
        module: Any,
        plan: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device,
        *,
        remappers: Mapping[str, nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self._env = env
        self._device = device
        self._configs: list[BaseEmbeddingConfig] = list(module.embedding_configs())
        unsharded = dict(remappers or module._managed_collision_modules.items())
        self._tables = mc_tables(unsharded, plan)
        self._feature_names = [f for c in self._configs for f in c.feature_names]
        self._features_per_table = [len(c.feature_names) for c in self._configs]
        local = {}
        for name, original in unsharded.items():
            run = self._tables[name].run_of(env.rank)
            if run is not None:
                local[name] = _local_module(original, self._tables[name], run, device)
        self._managed_collision_modules = nn.ModuleDict(local)
        self._register_state_dict_hook(_state_dict_hook)
        self._register_load_state_dict_pre_hook(self._load_pre_hook)

    def embedding_configs(self) -> list[BaseEmbeddingConfig]:
        return list(self._configs)

    def forward(self, features: KeyedJaggedTensor, reset: ResetRows) -> KeyedJaggedTensor:
        """Raw ids -> rows (keys in table order), remapped by the ranks that own them; rows
        whose id changed are passed to ``reset`` on the rank that holds them."""
        features, error = self._table_order(features)
        values = features.values() if error is None else torch.empty(0, dtype=torch.int64)
        ids, owners, counts = self._route(features, values, error)
        sent = counts.sum(1)
        header = torch.cat([counts, torch.tensor([[int(error is not None)]] * len(counts))], 1)
        got_header = comm.all_to_all_single(header.flatten(), group=self._env.pg)
        assert isinstance(got_header, torch.Tensor)
        received_header = got_header.view(self._env.world_size, -1)
        _agree(received_header[:, -1], error, self._env.rank)
        received_counts = received_header[:, :-1]
        order = torch.argsort(owners, stable=True)  # by rank, then (as sent) by table
        received = comm.all_to_all_single(
            ids[order],
            input_split_sizes=sent.tolist(),
            output_split_sizes=received_counts.sum(1).tolist(),
            group=self._env.pg,
        )
        assert isinstance(received, torch.Tensor)
        rows = self._remap(received, received_counts, reset)
        back = comm.all_to_all_single(
            rows,
            input_split_sizes=received_counts.sum(1).tolist(),
            output_split_sizes=sent.tolist(),
            group=self._env.pg,
        )
        assert isinstance(back, torch.Tensor)
        remapped = torch.empty_like(back)
        remapped[order] = back
        return with_values(features, remapped.to(features.values().dtype))

    def _table_order(self, features: KeyedJaggedTensor) -> tuple[KeyedJaggedTensor, str | None]:
        keys = features.keys()
        missing = [f for f in self._feature_names if f not in keys]
        if missing:
            return features, (
                f"ManagedCollisionCollection: features {missing} of its tables are not keys of "
                f"the input KeyedJaggedTensor (keys {keys}); give every table's features"
            )
        order = [keys.index(f) for f in self._feature_names]
        if order != list(range(len(keys))):
            features = features.permute(order)
        return features, None

    def _route(
        self, features: KeyedJaggedTensor, values: torch.Tensor, error: str | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(``[N]`` ids to send, ``[N]`` their ranks, ``[W, T]`` ids per rank and table); the
        ids are in table order, row-wise tables' ids already preprocessed (hashed)."""
        world, num_tables = self._env.world_size, len(self._configs)
        counts = torch.zeros(world, num_tables, dtype=torch.int64)
        if error is not None:
            empty = torch.empty(0, dtype=torch.int64)
            return empty, empty, counts
        starts = features.offset_per_key()
        ids, owners, key = [], [], 0
        for index, (config, num_keys) in enumerate(zip(self._configs, self._features_per_table)):
            part = values[starts[key] : starts[key + num_keys]].to(torch.int64)
            key += num_keys
            table = self._tables[config.name]
            if len(table.owners) > 1:
                local = self._managed_collision_modules[config.name]
                assert isinstance(local, MCHManagedCollisionModule)  # aligned_plan checked it
                jagged = local.preprocess({config.name: _jagged(part)})[config.name]
                part = jagged.values().to(torch.int64)
                owner = table.owner_of(local.bucket_of(part))
            else:
                owner = torch.full_like(part, table.owners[0])
            ids.append(part)
            owners.append(owner)
            counts[:, index] = torch.bincount(owner, minlength=world)
        return torch.cat(ids), torch.cat(owners), counts

    def _remap(
        self, received: torch.Tensor, received_counts: torch.Tensor, reset: ResetRows
    ) -> torch.Tensor:
        """Remap every id received (``[N]``, from each rank its tables' ids in table order) as
        one iteration of each local remapper; reset the rows whose id changed."""
        num_tables = len(self._configs)
        table_of = torch.arange(num_tables).repeat(self._env.world_size)
        table_of = torch.repeat_interleave(table_of, received_counts.flatten())
        rows = torch.empty_like(received)
        for index, config in enumerate(self._configs):
            if config.name not in self._managed_collision_modules:
                continue
            module = self._managed_collision_modules[config.name]
            assert isinstance(module, ManagedCollisionModule)  # aligned_plan checked
            at = (table_of == index).nonzero().squeeze(1)
            features = {config.name: _jagged(received[at])}
            if len(self._tables[config.name].owners) == 1:
                features = module.preprocess(features)  # table-wise: hashed here
            features = module.profile(features)
            rows[at] = module.remap(features)[config.name].values().to(torch.int64)
            changed = module.evict()
            if changed is not None and changed.numel():
                reset(config.name, changed)
        return rows

    def evict(self) -> dict[str, torch.Tensor | None]:
        """Nothing to report: evicted rows are reset inside `forward` (on their rank)."""
        return {name: None for name in self._managed_collision_modules}

    def _load_pre_hook(self, state_dict, prefix, *args: Any) -> None:
        """Full tensors (an unsharded state dict) or ShardedTensors -> this rank's slots."""
        for name, table in self._tables.items():
            base = f"{prefix}_managed_collision_modules.{name}."
            run = table.run_of(self._env.rank)
            for key in [k for k in state_dict if k.startswith(base)]:
                if run is None:
                    del state_dict[key]
                elif key.rsplit(".", 1)[1].startswith("_mch_"):
                    start, end = table.bounds[run], table.bounds[run + 1]
                    state_dict[key] = _slots_of(state_dict[key], start, end, key)


def _agree(status: torch.Tensor, error: str | None, rank: int) -> None:
    if error is not None:
        raise InputError(f"rank {rank}: {error}")
    bad = status.nonzero().squeeze(1).tolist()
    if bad:
        raise InputError(
            f"rank(s) {bad} refused their input to a managed-collision collection (their error "
            "names the problem); every rank stops"
        )


def _local_module(
    original: Any, table: McTable, run: int, device: torch.device
) -> ManagedCollisionModule:
    """This rank's remapper: rows ``[bounds[run], bounds[run + 1])``, its state copied."""
    start, end = table.bounds[run], table.bounds[run + 1]
    local = original.rebuild_with_output_id_range((start, end), device=device)
    state = {
        key: value[start:end] if key.startswith("_mch_") else value
        for key, value in original.state_dict().items()
    }
    local.load_state_dict(state)
    return local


def _slots_of(value: Any, start: int, end: int, key: str) -> torch.Tensor:
    if isinstance(value, ShardedTensor):
        with quiet_sharded_tensor():
            shards = value.local_shards()
        for shard in shards:
            meta = shard.metadata
            if list(meta.shard_offsets) == [start] and list(meta.shard_sizes) == [end - start]:
                return shard.tensor
        raise ValueError(
            f"{key}: the ShardedTensor given has no local shard of slots [{start}, {end}) (this "
            "rank's); to load another sharding, load with shardkit.checkpoint, which reshards"
        )
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.numel() < end:
        raise ValueError(f"{key}: expected a 1-D tensor of >= {end} slots, got {value!r:.80}")
    return value[start:end]


def _state_dict_hook(module: ShardedManagedCollisionCollection, state_dict, prefix, _meta) -> None:
    """Each ``_mch_*`` buffer as a ShardedTensor over the table's slots (its remapper's runs),
    which the checkpoint library saves once per run and reads into any other sharding."""
    for name, local in module._managed_collision_modules.items():
        table = module._tables[name]
        for key, value in local.state_dict().items():
            if key.startswith("_mch_"):
                full = f"{prefix}_managed_collision_modules.{name}.{key}"
                state_dict[full] = _sharded_slots(table, value, module._env)


def _sharded_slots(table: McTable, local: torch.Tensor, env: ShardingEnv) -> ShardedTensor:
    where = "cpu" if local.device.type == "cpu" else f"{local.device.type}:{local.device.index}"

    def meta(run: int) -> TorchShardMetadata:
        start, end = table.bounds[run], table.bounds[run + 1]
        return TorchShardMetadata([start], [end - start], f"rank:{table.owners[run]}/{where}")

    runs = range(len(table.owners))
    metadata = ShardedTensorMetadata(
        shards_metadata=[meta(r) for r in runs],
        size=torch.Size([table.num_rows]),
        tensor_properties=TensorProperties(dtype=local.dtype, layout=torch.strided),
    )
    run = table.owners.index(env.rank)  # only this rank's remappers are saved: it owns a run
    with quiet_sharded_tensor():
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            [Shard(tensor=local, metadata=meta(run))], metadata, process_group=env.pg
        )


def _jagged(values: torch.Tensor) -> JaggedTensor:
    """One bag of all ``values`` (what a remapper takes)."""
    return JaggedTensor(values=values, lengths=torch.tensor([values.numel()]))
