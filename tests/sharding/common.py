"""Shared pieces of the sharded-collection tests: tables with awkward sizes, global batches,
plans by name, and a small DLRM with its batches."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

from shardkit import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    JaggedTensor,
    KeyedJaggedTensor,
    PoolingType,
)
from shardkit.models import DLRM
from shardkit.planner import (
    EmbeddingComputeKernel,
    EnumerableShardingSpec,
    ShardingType,
    ShardMetadata,
)
from shardkit.sharding import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    grid_shard,
    row_wise,
    table_row_wise,
    table_wise,
)
from shardkit.types import ParameterSharding

LIMITS = {"a": 11, "b": 11, "c": 7, "d": 5, "e": 9}
FEATURES = list(LIMITS)


def configs(pooling: PoolingType = PoolingType.SUM) -> list[EmbeddingBagConfig]:
    """Rows and dims that divide by nothing: 11 x 4 (two features), 7 x 6, 5 x 4, 9 x 5."""
    return [
        EmbeddingBagConfig(
            name="t0", embedding_dim=4, num_embeddings=11, feature_names=["a", "b"], pooling=pooling
        ),
        EmbeddingBagConfig(
            name="t1", embedding_dim=6, num_embeddings=7, feature_names=["c"], pooling=pooling
        ),
        EmbeddingBagConfig(name="t2", embedding_dim=4, num_embeddings=5, feature_names=["d"]),
        EmbeddingBagConfig(
            name="t3", embedding_dim=5, num_embeddings=9, feature_names=["e"], pooling=pooling
        ),
    ]


def global_batch(seed: int, size: int, weighted: bool) -> KeyedJaggedTensor:
    """Bags of 0-3 ids with duplicates; feature 'e' has no ids at all in even steps."""
    g = torch.Generator().manual_seed(seed)
    lengths, values = [], []
    for key in FEATURES:
        key_lengths = torch.randint(0, 4, (size,), generator=g)
        if key == "e" and seed % 2 == 0:
            key_lengths.zero_()
        lengths.append(key_lengths)
        values.append(torch.randint(0, LIMITS[key], (int(key_lengths.sum()),), generator=g))
    values = torch.cat(values)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor(
        keys=FEATURES, values=values, lengths=torch.cat(lengths), weights=weights
    )


def local_part(kjt: KeyedJaggedTensor, rank: int, world_size: int) -> KeyedJaggedTensor:
    """Rank ``rank``'s examples of a global batch: ``[rank * B, (rank + 1) * B)``."""
    size = kjt.stride() // world_size
    parts = {}
    for key, jt in kjt.to_dict().items():
        offsets = jt.offsets()
        lo, hi = int(offsets[rank * size]), int(offsets[(rank + 1) * size])
        weights = jt.weights_or_none()
        parts[key] = JaggedTensor(
            values=jt.values()[lo:hi],
            lengths=jt.lengths()[rank * size : (rank + 1) * size],
            weights=None if weights is None else weights[lo:hi],
        )
    return KeyedJaggedTensor.from_jt_dict(parts)


def _table_column_wise(ranks: list[int]):
    """Column shards placed table-wise (several may share a rank)."""

    def generate(param, local_size, world_size, device_type, sharder):
        rows, cols = param.shape
        widths = [cols // len(ranks) + (i < cols % len(ranks)) for i in range(len(ranks))]
        shards, start = [], 0
        for width, rank in zip(widths, ranks):
            shards.append(ShardMetadata([0, start], [rows, width], f"rank:{rank}/cpu"))
            start += width
        return ParameterSharding(
            ShardingType.TABLE_COLUMN_WISE,
            EmbeddingComputeKernel.FUSED,
            ranks,
            EnumerableShardingSpec(shards),
        )

    return generate


def generators(kind: str, world_size: int, local_size: int):
    """Per table index: the plan generator for sharding type ``kind`` (or 'mixed')."""
    hosts = world_size // local_size
    by_kind = {
        "table_wise": lambda i: table_wise(rank=(i + 1) % world_size),
        "row_wise": lambda i: row_wise(),
        "column_wise": lambda i: column_wise(
            ranks=[(i + r) % world_size for r in range(min(world_size, 3))]
        ),
        "table_column_wise": lambda i: _table_column_wise([i % world_size, i % world_size]),
        "table_row_wise": lambda i: table_row_wise(host_index=i % hosts),
        "grid_shard": lambda i: grid_shard(host_indexes=list(range(hosts))),
        "data_parallel": lambda i: data_parallel(),
    }
    if kind == "mixed":
        kinds = ["row_wise", "table_wise", "column_wise", "data_parallel"]
        return [by_kind[kinds[i]](i) for i in range(4)]
    return [by_kind[kind](i) for i in range(4)]


def make_plan(ebc, kind: str, world_size: int, local_size: int):
    gens = generators(kind, world_size, local_size)
    return construct_module_sharding_plan(
        ebc,
        {f"t{i}": gens[i] for i in range(4)},
        world_size=world_size,
        local_size=local_size,
        device_type="cpu",
    )


def dlrm() -> DLRM:
    """A small DLRM: 4 tables of dim 4 with awkward row counts, one feature each."""
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=4, num_embeddings=rows, feature_names=[f"f{i}"]
        )
        for i, rows in enumerate([13, 7, 30, 5])
    ]
    ebc = EmbeddingBagCollection(tables=tables)
    return DLRM(
        ebc, dense_in_features=3, dense_arch_layer_sizes=[8, 4], over_arch_layer_sizes=[8, 1]
    )


def dlrm_batch(step: int, size: int):
    """Dense features, the KJT of `dlrm`'s features and labels for ``size`` examples."""
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 3, (4 * size,), generator=g)
    limits = torch.tensor([13, 7, 30, 5]).repeat_interleave(size).repeat_interleave(lengths)
    values = (torch.rand(int(lengths.sum()), generator=g) * limits).long()
    sparse = KeyedJaggedTensor(keys=["f0", "f1", "f2", "f3"], values=values, lengths=lengths)
    dense = torch.randn(size, 3, generator=g)
    labels = (dense[:, 0] > 0).float()  # learnable, so the loss falls
    return dense, sparse, labels


def table_pairs(sharded, reference, prefix: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(what, this rank's value, the unsharded module's value)``, on the CPU, for
    every table on this rank:
    each shard's weights and fused optimizer state (the step counter where the rule reads it)
    against the same block of the reference's, each data-parallel replica against the whole
    table.

    ``prefix`` is the collections' table attribute: ``embedding_bags`` or ``embeddings``.
    """
    pairs = []
    ref_state = reference.fused_optimizer.state_dict()["state"]
    state = sharded.fused_optimizer.state_dict()["state"] if sharded.fused_optimizer else {}
    for name, table in getattr(sharded, prefix).items():
        full = getattr(reference, prefix)[name].weight.detach()
        if not hasattr(table, "shard_slices"):
            pairs.append((f"replica of {name}", table.weight.detach().cpu(), full.clone()))
            continue
        entry = state.get(f"{prefix}.{name}.weight")
        states = iter(local_fused_state(entry, table) if entry is not None else [])
        for shard, param in zip(table.shard_slices, table.shards):
            rows = slice(shard.row_start, shard.row_start + shard.rows)
            cols = slice(shard.col_start, shard.col_start + shard.cols)
            where = f"{name} rows {rows.start}:{rows.stop} cols {cols.start}:{cols.stop}"
            pairs.append((where, param.detach().cpu(), full[rows, cols].clone()))
            expected = ref_state[f"{prefix}.{name}.weight"]  # the same names (TorchRec's)
            if not (shard.rows and shard.cols):
                continue
            mine = next(states)
            assert sorted(mine) == sorted(expected), (where, sorted(mine), sorted(expected))
            for key, value in expected.items():
                block = value if value.dim() == 0 else value[rows]
                block = block[:, cols] if value.dim() == 2 else block
                pairs.append((f"{where}: {key}", mine[key].cpu(), block.clone()))
    return pairs


def local_fused_state(entry: dict[str, Any], table) -> list[dict[str, torch.Tensor]]:
    """A sharded table's fused state (TorchRec's layout: ShardedTensors, the step counter a
    plain tensor) as one ``{key: block}`` per shard of ``table.shard_slices`` (this rank's,
    in order)."""
    shards = [s for s in table.shard_slices if s.rows and s.cols]
    out: list[dict[str, torch.Tensor]] = [{} for _ in shards]
    for key, value in entry.items():
        if isinstance(value, ShardedTensor):
            blocks = [piece.tensor for piece in value.local_shards()]
            assert len(blocks) == len(shards), (key, len(blocks), len(shards))
        else:
            blocks = [value] * len(shards)
        for block, part in zip(blocks, out):
            part[key] = block
    return out


def assert_pairs_close(results, *, atol: float) -> None:
    """Every rank's ``(what, actual, expected)`` pairs are close (NaN never is)."""
    assert results and all(results), "no pairs: the test would compare nothing"
    for rank, pairs in enumerate(results):
        for what, actual, expected in pairs:
            torch.testing.assert_close(
                actual,
                expected,
                rtol=0,
                atol=atol,
                msg=lambda m, w=what, r=rank: f"rank {r}, {w}: {m}",
            )


def with_fused(reference: DLRM, fused) -> EmbeddingBagCollection:
    """Give the reference's tables the same fused optimizer the sharder gives the DMP's."""
    old = reference.sparse_arch.embedding_bag_collection
    new = EmbeddingBagCollection(tables=old.embedding_bag_configs(), fused_params=fused)
    new.load_state_dict(old.state_dict())
    reference.sparse_arch.embedding_bag_collection = new
    return new


def dlrm_plan(model: DLRM, kind: str, world_size: int):
    """A plan for `dlrm`'s four tables, all of one ``kind``."""
    ebc = model.sparse_arch.embedding_bag_collection
    gens = {
        "table_wise": lambda i: table_wise(rank=i % world_size),
        "row_wise": lambda i: row_wise(),
        "column_wise": lambda i: column_wise(ranks=list(range(world_size))),
        "data_parallel": lambda i: data_parallel(),
        "data_parallel_fused": lambda i: data_parallel(compute_kernel="fused"),
    }[kind]
    return construct_module_sharding_plan(
        ebc, {f"t{i}": gens(i) for i in range(4)}, world_size=world_size, device_type="cpu"
    )
