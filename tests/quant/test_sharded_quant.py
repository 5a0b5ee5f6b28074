"""Quantized tables served across ranks (table-wise) against the unsharded quantized module
(the spec): the same pooled rows for every rank's requests, with INT8, INT4 and FP16 tables,
weighted and not, float32 and half output (half rows on the wire), uneven batch sizes per rank,
a rank with no table, and the errors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shardkit import KeyedJaggedTensor, comm
from shardkit.inference import (
    ShardedQuantEmbeddingBagCollection,
    ShardedQuantEmbeddingCollection,
    shard_quant_model,
)
from shardkit.inference._row_wise import split_tables
from shardkit.modules import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from shardkit.quant import EmbeddingBagCollection as QuantEBC
from shardkit.quant import EmbeddingCollection as QuantEC

TABLES = {"t0": (11, 4, DataType.INT8), "t1": (7, 6, DataType.INT4), "t2": (5, 4, DataType.FP16)}
FEATURES = {"a": "t0", "b": "t0", "c": "t1", "d": "t2"}


def _quantized(weighted: bool, mean: bool = False, half: bool = False) -> QuantEBC:
    configs = [
        EmbeddingBagConfig(
            name=name, num_embeddings=rows, embedding_dim=dim, data_type=data_type,
            feature_names=[f for f, t in FEATURES.items() if t == name],
            pooling=PoolingType.MEAN if mean and name == "t0" else PoolingType.SUM,
        )
        for name, (rows, dim, data_type) in TABLES.items()
    ]  # fmt: skip
    module = QuantEBC(configs, weighted, output_dtype=torch.half if half else torch.float)
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


def _float_dtypes_sent(module, kjt) -> tuple[torch.Tensor, set[torch.dtype]]:
    """``module(kjt)`` and the floating dtypes of what it sent through all-to-alls."""
    sent, real = set(), comm.all_to_all_single

    def recording(x, *args, **kwargs):
        if x.is_floating_point():
            sent.add(x.dtype)
        return real(x, *args, **kwargs)

    comm.all_to_all_single = recording
    try:
        return module(kjt), sent
    finally:
        comm.all_to_all_single = real


def _serve(rank, world_size, weighted, placement, half=False):
    reference = _quantized(weighted, half=half)
    model, plans = shard_quant_model(torch.nn.Sequential(_quantized(weighted, half=half)),
                                     world_size=world_size, placement=placement)  # fmt: skip
    assert isinstance(model[0], ShardedQuantEmbeddingBagCollection)
    kjt = _requests(rank, weighted)
    out, sent = _float_dtypes_sent(model, kjt)
    expected = reference(kjt)
    assert out.keys() == expected.keys()
    torch.testing.assert_close(out.values(), expected.values(), rtol=0, atol=0)
    return plans["0"], sent


@pytest.mark.parametrize(
    ("world_size", "weighted", "half"),
    [(1, False, False), (2, False, False), (1, True, False), (3, True, False), (2, False, True),
     (3, True, True)],
)  # fmt: skip
def test_sharded_quantized_tables_serve_as_the_unsharded_module(
    run_ranks, world_size, weighted, half
):
    results = run_ranks(_serve, world_size, weighted, None, half)
    assert sorted(set(results[0][0].values())) == list(range(world_size))
    weights = {torch.float32} if weighted else set()  # per-id weights travel in float32
    for _, sent in results:  # the pooled rows in the output dtype: half of float32's bytes
        assert sent == weights | {torch.half if half else torch.float32}


def test_a_rank_without_tables_still_serves_its_requests(run_ranks):
    run_ranks(_serve, 3, False, {"t0": 1, "t1": 1, "t2": 2})
    run_ranks(_serve_sequences, 3, {"t0": 1, "t1": 1, "t2": 2})


def _quantized_sequences() -> QuantEC:
    configs = [
        EmbeddingConfig(name=name, num_embeddings=rows, embedding_dim=dim, data_type=data_type,
                        feature_names=[f for f, t in FEATURES.items() if t == name])
        for name, (rows, dim, data_type) in TABLES.items()
    ]  # fmt: skip
    module = QuantEC(configs, output_dtype=torch.half)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for buffer in module.buffers():
            buffer.copy_(torch.randint(0, 256, buffer.shape, generator=g).to(buffer.dtype))
    return module


def _serve_sequences(rank, world_size, placement):
    """Sequence tables (one row per id), table-wise, against the unsharded quantized module;
    half output, rank 0 without tables, uneven batches. (need_indices is refused by the
    quantized collection, as by the float one.)"""
    reference = _quantized_sequences()
    sharded = ShardedQuantEmbeddingCollection(reference, placement)
    kjt = _requests(rank, weighted=False)
    out, expected = sharded(kjt), reference(kjt)
    assert list(out) == list(expected) == list(FEATURES)
    for f in FEATURES:
        assert out[f].values().dtype == torch.half
        torch.testing.assert_close(out[f].values(), expected[f].values(), rtol=0, atol=0)
        torch.testing.assert_close(out[f].lengths(), expected[f].lengths(), rtol=0, atol=0)


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
    with pytest.raises(ValueError, match=r"tables without a rank \['t2'\]"):
        ShardedQuantEmbeddingCollection(_quantized_sequences(), {"t0": 0, "t1": 0})
    sequences = ShardedQuantEmbeddingCollection(_quantized_sequences())
    kjt = KeyedJaggedTensor(keys=["a"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match=(
        r"rank\(s\) \[0\] gave a KeyedJaggedTensor the sharded quantized sequence tables cannot "
        r"serve \(this rank's lacks the features \['b', 'c', 'd'\]\); every rank must give "
        r"all of \['a', 'b', 'c', 'd'\], each id in \[0, num_embeddings\)"
    )):  # fmt: skip
        sequences(kjt)
    assert dist.get_world_size() == 1


def _dequantized(module: QuantEBC) -> dict[str, torch.Tensor]:
    """``{feature: the rows of its table [R, D] as the module reads them}``: bags of one id."""
    rows = max(r for r, _, _ in TABLES.values())
    lengths = torch.cat([(torch.arange(rows) < TABLES[t][0]).long() for t in FEATURES.values()])
    values = torch.cat([torch.arange(TABLES[t][0]) for t in FEATURES.values()])
    weights = torch.ones(values.numel()) if module.is_weighted() else None
    kjt = KeyedJaggedTensor(keys=list(FEATURES), values=values, lengths=lengths, weights=weights)
    out = module(kjt).to_dict()
    return {f: out[f][: TABLES[t][0]].float() for f, t in FEATURES.items()}


def _order_bound(module: QuantEBC, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
    """Per feature ``[B, D]``: ``L * eps * sum |w_i| |row_i|`` over a bag's ``L`` ids: what
    adding the bag's float32 terms in another order may change its sum by."""
    rows, out = _dequantized(module), {}
    for f, bags in kjt.to_dict().items():
        weights = (
            bags.weights().abs() if module.is_weighted() else torch.ones(bags.values().numel())
        )
        terms = rows[f][bags.values()].abs() * weights.unsqueeze(1)  # [N, D]
        bag_of_id = torch.repeat_interleave(torch.arange(bags.lengths().numel()), bags.lengths())
        total = torch.zeros(bags.lengths().numel(), terms.shape[1]).index_add_(0, bag_of_id, terms)
        out[f] = bags.lengths().unsqueeze(1) * torch.finfo(torch.float32).eps * total
    return out


def _serve_row_wise(rank, world_size, weighted, mean, row_wise, budget, half=False):
    reference = _quantized(weighted, mean, half)
    if budget is None:
        sharded = ShardedQuantEmbeddingBagCollection(_quantized(weighted, mean, half),
                                                     row_wise=row_wise)  # fmt: skip
    else:  # TorchRec's per-device budget: a table over it goes row-wise
        model, _ = shard_quant_model(torch.nn.Sequential(_quantized(weighted, mean)),
                                     world_size=world_size, device_memory_size=budget)  # fmt: skip
        sharded = model[0]
    kjt = _requests(rank, weighted)
    (out, sent), expected = _float_dtypes_sent(sharded, kjt), reference(kjt)
    assert out.keys() == expected.keys() and out.values().dtype == expected.values().dtype
    if half:  # the row-wise parts in float32 (added before one cast), table-wise rows in half
        assert sent == {torch.float32, torch.half}, sent
    names = [c.name for c in sharded.embedding_bag_configs()]  # this rank's, in table order
    assert names == sorted(names), names
    buffers = {k.split(".")[-2] for k in sharded.state_dict()}  # registered: all of its tables
    assert buffers == set(names) and len(buffers) > 0, (buffers, names)
    bound = _order_bound(reference, kjt)
    for f, got in out.to_dict().items():
        want = expected.to_dict()[f]
        if FEATURES[f] in sharded.row_wise_tables:  # the same terms, added in another order
            scale = want.abs().clamp(min=1) if mean and FEATURES[f] == "t0" else 1
            got, want = got.float(), want.float()  # half: then rounded once, by half an ulp
            rounding = torch.finfo(torch.half).eps * want.abs() + 2**-24 if half else 0
            within = (got - want).abs() <= bound[f] * scale + rounding + 1e-7
            assert ((got == want) | within).all(), f  # ==: past half's range both are inf
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    return sharded.row_wise_tables, sharded._placement


@pytest.mark.parametrize(
    ("world_size", "weighted", "mean", "row_wise", "half"),
    [(2, False, False, ["t0", "t1", "t2"], False), (3, True, False, ["t0", "t2"], False),
     (2, True, True, ["t0"], False), (3, False, True, ["t0", "t1"], False),
     (4, False, False, ["t1", "t2"], False),  # 7, 5 rows on 4 ranks: blocks 2,2,2,1 and 2,1,1,1
     (2, False, True, ["t0"], True)],  # half output: t0's parts in float32, t1, t2's rows half
)  # fmt: skip
def test_row_wise_quantized_tables_serve_as_the_unsharded_module(
    run_ranks, world_size, weighted, mean, row_wise, half
):
    for got_row_wise, placement in run_ranks(_serve_row_wise, world_size, weighted, mean,
                                             row_wise, None, half):  # fmt: skip
        assert got_row_wise == row_wise and sorted(placement) == sorted(set(TABLES) - set(row_wise))


def test_a_table_over_one_ranks_budget_goes_row_wise(run_ranks):
    # stored bytes: t0 11 x (4 + 8) = 132 (INT8), t1 7 x (3 + 4) = 49 (INT4), t2 5 x 8 = 40 (FP16)
    results = run_ranks(_serve_row_wise, 2, False, False, (), 100)
    assert results[0] == (["t0"], {"t1": 0, "t2": 1})


def _bad_ids(rank, world_size):
    """Rank 1 alone sends an id past its table: row-wise (t0, 11 rows, feature "a"),
    table-wise (t1, 7 rows, feature "c") and a sequence table (t1 again); the owner is another
    rank, so every rank must raise before the ids move, not only the owner."""
    cases = [
        (ShardedQuantEmbeddingBagCollection(_quantized(False), row_wise=["t0"]), "a", 11),
        (ShardedQuantEmbeddingBagCollection(_quantized(False), {"t0": 1, "t1": 0, "t2": 1}), "c", 7),
        (ShardedQuantEmbeddingCollection(_quantized_sequences(), {"t0": 1, "t1": 0, "t2": 1}), "c", 7),
    ]  # fmt: skip
    messages = []
    for sharded, feature, past_end in cases:
        kjt = _requests(rank, False)
        if rank == 1:
            values = kjt.values().clone()
            at = sum(int(n) for k, n in zip(kjt.keys(), kjt.length_per_key()) if k < feature)
            values[at] = past_end  # the feature's first id (every feature has ids here)
            kjt = KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths())
        try:
            sharded(kjt)
            messages.append(None)
        except ValueError as error:
            messages.append(str(error))
    return messages


def test_ids_outside_a_table_are_refused_on_every_rank(run_ranks):
    for rank, messages in enumerate(run_ranks(_bad_ids, 2)):
        for message, feature in zip(messages, "acc"):
            mine = (
                rf"has ids outside their tables in the features \['{feature}'\]"
                if rank == 1
                else r"is fine: see the error of rank\(s\) \[1\]"
            )
            with pytest.raises(ValueError, match=rf"rank\(s\) \[1\] gave a KeyedJaggedTensor .* cannot serve \(this rank's {mine}\); every rank must give all of .*each id in \[0, num_embeddings\)"):  # fmt: skip
                raise ValueError(message)


def test_row_wise_needs_a_row_per_rank_and_each_table_once(run_ranks):
    configs = list(_quantized(False).embedding_bag_configs())
    with pytest.raises(ValueError, match=r"row_wise sharding of quantized table 't2' needs "
                       r"num_embeddings \(5\) >= ranks \(6\); place it table-wise"):  # fmt: skip
        split_tables(configs, ["t2"], 6)
    run_ranks(_twice, 1)


def _twice(rank, world_size):
    with pytest.raises(ValueError, match=r"row_wise=\['t0', 'x'\]: tables \['t0'\] also have a "
                       r"rank in placement and \['x'\] are not tables"):  # fmt: skip
        ShardedQuantEmbeddingBagCollection(
            _quantized(False), {"t0": 0, "t1": 0, "t2": 0}, row_wise=["t0", "x"]
        )


def test_torchrecs_path_has_the_sharded_quantized_collection():
    from shardkit.compat import NotInShardkitError
    from shardkit.distributed import quant_embeddingbag

    assert (
        quant_embeddingbag.ShardedQuantEmbeddingBagCollection is ShardedQuantEmbeddingBagCollection
    )
    with pytest.raises(NotInShardkitError, match=r"has no QuantEmbeddingBagCollectionSharder: "
                       r"TorchRec's quantized sharders .*shard_quant_model\(model\) spreads"):  # fmt: skip
        from shardkit.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder  # noqa: F401
