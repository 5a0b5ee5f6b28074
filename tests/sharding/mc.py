"""Shared pieces of the sharded managed-collision tests: tables, modules, raw-id batches and
comparisons against the unsharded module (the spec)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardkit import KeyedJaggedTensor
from shardkit.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
)
from shardkit.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from shardkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from shardkit.optim import EmbOptimType
from shardkit.sharding import (
    construct_module_sharding_plan,
    fused_state,
    quiet_sharded_tensor,
    row_wise,
    table_wise,
)
from shardkit.types import ShardingEnv
from tests.sharding.common import local_part

BIG = 2**40
SPACE = 10_007  # the ids' range after `spread`


def spread(ids: torch.Tensor, size: int) -> torch.Tensor:
    """The remappers' input_hash_func: spreads the raw ids over ``[0, size)``, whose blocks are
    the buckets (TorchRec's routing)."""
    return ids % size


FRESH = 0.25  # what init_fn writes into a row whose id changed
FEATURES = ["u", "v", "i"]
BUCKETS = 6  # divisible by 1, 2 and 3 ranks
LOCAL_BATCH = 2


def fresh(weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.init.constant_(weight, FRESH)


def tables(bags: bool = True) -> list:
    """13 and 12 rows (not divisible by 2 or 5), 4 and 3 columns."""
    kind = EmbeddingBagConfig if bags else EmbeddingConfig
    return [
        kind(name="users", embedding_dim=4, num_embeddings=13, feature_names=["u", "v"],
             init_fn=fresh),
        kind(name="goods", embedding_dim=4 if not bags else 3, num_embeddings=12,
             feature_names=["i"], init_fn=fresh),
    ]  # fmt: skip


def mc_module(
    bags: bool = True,
    optimizer: EmbOptimType = EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    *,
    buckets: int = BUCKETS,
):
    """The unsharded spec: two managed-collision tables in 6 buckets (or ``buckets``), evicting
    every 2 steps."""
    torch.manual_seed(0)
    configs = tables(bags)
    fused = {"optimizer": optimizer, "learning_rate": 0.1, "eps": 1e-8}
    mcc = ManagedCollisionCollection(
        {
            c.name: MCHManagedCollisionModule(
                c.num_embeddings, "cpu", DistanceLFU_EvictionPolicy(), 2, buckets=buckets,
                name=c.name, input_hash_size=SPACE, input_hash_func=spread,
            )
            for c in configs
        },
        configs,
    )  # fmt: skip
    if bags:
        ebc = EmbeddingBagCollection(tables=configs, fused_params=fused)
        module = ManagedCollisionEmbeddingBagCollection(ebc, mcc, return_remapped_features=True)
    else:
        ec = EmbeddingCollection(tables=configs, fused_params=fused)
        module = ManagedCollisionEmbeddingCollection(ec, mcc, return_remapped_features=True)
    with torch.no_grad():  # random rows, so that a row reset to FRESH shows
        for param in module.parameters():
            param.uniform_(-1.0, 1.0)
    return module


def raw_batch(step: int, size: int) -> KeyedJaggedTensor:
    """Bags of 0-3 raw 40-bit ids from a pool of 30 per feature (more than the rows: ids
    compete and get evicted); power-law-ish by squaring a uniform draw."""
    g = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(0, 4, (len(FEATURES) * size,), generator=g)
    pool = (torch.rand(int(lengths.sum()), generator=g) ** 2 * 30).long()
    return KeyedJaggedTensor(keys=FEATURES, values=BIG + 7919 * pool, lengths=lengths)


def plan_for(module, kind: str, world_size: int):
    """``row_wise`` for both tables, or ``table_wise`` on ranks 1 and 0."""
    if kind == "row_wise":
        gens = {"users": row_wise(), "goods": row_wise()}
    else:
        gens = {"users": table_wise(rank=1 % world_size), "goods": table_wise(rank=0)}
    return construct_module_sharding_plan(module, gens, world_size=world_size, device_type="cpu")


def env() -> ShardingEnv:
    return ShardingEnv.from_process_group(dist.group.WORLD)


def loss(out, rank: int, step: int, world_size: int, bags: bool, local: bool) -> torch.Tensor:
    """Mean over the global batch of a weighted sum of the outputs (per rank: its examples)."""
    values = out.values() if bags else torch.cat([out[f].values() for f in FEATURES])
    g = torch.Generator().manual_seed(50 + step)
    scale = torch.rand(values.shape[-1], generator=g)
    total = (values * scale).sum()
    return total / (LOCAL_BATCH * (1 if local else world_size))


def local_output(reference_out, rank: int, bags: bool, world_size: int, kjt):
    """Rank ``rank``'s part of the reference's output on the global batch."""
    if bags:
        return reference_out.values()[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]
    mine = local_part(kjt, rank, world_size).to_dict()
    out = []
    for f in FEATURES:
        offsets = kjt[f].offsets()
        lo = int(offsets[rank * LOCAL_BATCH])
        out.append(reference_out[f].values()[lo : lo + mine[f].values().numel()])
    return torch.cat(out)


def local_remapped(reference_remapped: KeyedJaggedTensor, rank: int, world_size: int):
    return local_part(reference_remapped, rank, world_size).values()


def compare_state(sharded, reference) -> None:
    """Tables, fused optimizer state (step counters included) and remapper buffers of this
    rank's shards equal the unsharded module's."""
    emb, ref_emb = sharded._embedding_module, reference._embedding_module
    ref_tables = getattr(ref_emb, "embedding_bags", None) or ref_emb.embeddings
    fused = fused_state(emb)
    ref_fused = ref_emb.fused_optimizer
    for name, table in emb.tables.items():
        full = ref_tables[name].weight.detach()
        ref_state = ref_fused.state[ref_tables[name].weight]
        for shard, param in zip(table.shard_slices, table.shards):
            rows = slice(shard.row_start, shard.row_start + shard.rows)
            torch.testing.assert_close(param.detach(), full[rows], msg=f"{name} rows {rows}")
            for key, value in ref_state.items():
                if key == "step":  # the buffer's counter, saved once per table
                    assert int(fused[f"{name}.step"]) == int(value) > 0, (
                        name,
                        fused[f"{name}.step"],
                    )
                    continue
                mine = _local_block(fused[f"{name}.{key}"], shard.row_start)
                expected = value[rows] if value.dim() == 2 else value[rows].unsqueeze(1)
                torch.testing.assert_close(mine, expected.expand_as(mine), msg=f"{name} {key}")
    ref_state = reference._managed_collision_collection.state_dict()
    mine = sharded._managed_collision_collection.state_dict()
    for key, value in mine.items():
        if hasattr(value, "local_shards"):
            with quiet_sharded_tensor():
                for shard in value.local_shards():
                    start = shard.metadata.shard_offsets[0]
                    end = start + shard.metadata.shard_sizes[0]
                    torch.testing.assert_close(shard.tensor, ref_state[key][start:end], msg=key)
        else:
            torch.testing.assert_close(value, ref_state[key], msg=key)


def _local_block(sharded_tensor, row_start: int) -> torch.Tensor:
    with quiet_sharded_tensor():
        for shard in sharded_tensor.local_shards():
            if shard.metadata.shard_offsets[0] == row_start:
                return shard.tensor
    raise AssertionError(f"no local shard at row {row_start}")
