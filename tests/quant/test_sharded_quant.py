"""Quantized tables served across ranks (table-wise) against the unsharded quantized module
(the spec): the same pooled rows for every rank's requests, with INT8, INT4 and FP16 tables,
weighted and not, uneven batch sizes per rank, a rank with no table, and the errors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shardkit import KeyedJaggedTensor
from shardkit.inference import ShardedQuantEmbeddingBagCollection, shard_quant_model
from shardkit.modules import DataType, EmbeddingBagConfig
from shardkit.quant import EmbeddingBagCollection as QuantEBC

TABLES = {"t0": (11, 4, DataType.INT8), "t1": (7, 6, DataType.INT4), "t2": (5, 4, DataType.FP16)}
FEATURES = {"a": "t0", "b": "t0", "c": "t1", "d": "t2"}


def _quantized(weighted: bool) -> QuantEBC:
    configs = [
        EmbeddingBagConfig(
            name=name, num_embeddings=rows, embedding_dim=dim, data_type=data_type,
            feature_names=[f for f, t in FEATURES.items() if t == name],
        )
        for name, (rows, dim, data_type) in TABLES.items()
    ]  # fmt: skip
    module = QuantEBC(configs, weighted)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for buffer in module.buffers():
            buffer.copy_(torch.randint(0, 256, buffer.shape, generator=g).to(buffer.dtype))
    return module


def _requests(rank: int, weighted: bool) -> KeyedJaggedTensor:
    """Rank ``r`` asks ``r + 1`` examples (uneven batches), bags of 0-3 ids."""
    g = torch.Generator().manual_seed(10 + rank)
    size = rank + 1
    lengths = torch.randint(0, 4, (len(FEATURES) * size,), generator=g)
    limits = torch.tensor([TABLES[t][0] for t in FEATURES.values()]).repeat_interleave(size)
    limits = limits.repeat_interleave(lengths)
    values = (torch.rand(int(lengths.sum()), generator=g) * limits).long()
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor(keys=list(FEATURES), values=values, lengths=lengths, weights=weights)


def _serve(rank, world_size, weighted, placement):
    reference = _quantized(weighted)
    model, plans = shard_quant_model(torch.nn.Sequential(_quantized(weighted)),
                                     world_size=world_size, placement=placement)  # fmt: skip
    assert isinstance(model[0], ShardedQuantEmbeddingBagCollection)
    kjt = _requests(rank, weighted)
    out = model(kjt)
    expected = reference(kjt)
    assert out.keys() == expected.keys()
    torch.testing.assert_close(out.values(), expected.values(), rtol=0, atol=0)
    return plans["0"]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_sharded_quantized_tables_serve_as_the_unsharded_module(run_ranks, world_size, weighted):
    plans = run_ranks(_serve, world_size, weighted, None)
    assert sorted(set(plans[0].values())) == list(range(world_size))


def test_a_rank_without_tables_still_serves_its_requests(run_ranks):
    run_ranks(_serve, 3, False, {"t0": 1, "t1": 1, "t2": 2})


def test_shard_quant_model_refuses_gpu_and_other_world_sizes(run_ranks):
    run_ranks(_refusals, 1)


def _refusals(rank, world_size):
    with pytest.raises(ValueError, match=r"compute_device='cuda'.*CPU-only\); pass 'cpu'"):
        shard_quant_model(_quantized(False), compute_device="cuda")
    with pytest.raises(ValueError, match=r"world_size=2\): .* start 2 ranks \(this group has 1\)"):
        shard_quant_model(_quantized(False), world_size=2)
    with pytest.raises(ValueError, match=r"sharding_plan=\.\.\.\): .* placement=\{table: rank\}"):
        shard_quant_model(_quantized(False), sharding_plan={})
    with pytest.raises(ValueError, match=r"tables without a rank \['t2'\]"):
        ShardedQuantEmbeddingBagCollection(_quantized(False), {"t0": 0, "t1": 0})
    assert dist.get_world_size() == 1


def test_torchrecs_path_has_the_sharded_quantized_collection():
    from shardkit.compat import NotInShardkitError
    from shardkit.distributed import quant_embeddingbag

    assert (
        quant_embeddingbag.ShardedQuantEmbeddingBagCollection is ShardedQuantEmbeddingBagCollection
    )
    with pytest.raises(NotInShardkitError, match=r"has no QuantEmbeddingBagCollectionSharder: "
                       r"TorchRec's quantized sharders .*shard_quant_model\(model\) spreads"):  # fmt: skip
        from shardkit.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder  # noqa: F401
