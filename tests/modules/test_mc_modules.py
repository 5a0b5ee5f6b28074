"""Managed collision: what each policy keeps, buckets as independent remappers (what row-wise
sharding needs), eval mode, ttl, threshold filters, state_dict round trips, and the errors."""

from __future__ import annotations

import pytest
import torch

from shardkit import EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.modules._mc_slots import bucket_of
from shardkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHEvictionPolicy,
    MCHEvictionPolicyMetadataInfo,
    MCHManagedCollisionModule,
    average_threshold_filter,
    dynamic_threshold_filter,
    probabilistic_threshold_filter,
)
from shardkit.sparse import JaggedTensor

BIG = 2**40  # raw ids far beyond any table
SPACE = 10_007  # the ids' range after `spread`, the input_hash_func of the multi-bucket modules


def spread(ids: torch.Tensor, size: int) -> torch.Tensor:
    """An input_hash_func (TorchRec's job for it: spread the ids over their range, whose blocks
    are the buckets)."""
    return ids % size


def _policy(kind: str, ttl: int | None = None):
    if kind == "lfu":
        return LFU_EvictionPolicy()
    if kind == "lru":
        return LRU_EvictionPolicy(decay_exponent=1.5, ttl=ttl)
    return DistanceLFU_EvictionPolicy(decay_exponent=1.5, ttl=ttl)


def _module(zch=12, kind="lfu", interval=2, buckets=1, **kwargs) -> MCHManagedCollisionModule:
    if buckets > 1:
        kwargs = {"input_hash_size": SPACE, "input_hash_func": spread, **kwargs}
    return MCHManagedCollisionModule(
        zch, "cpu", _policy(kind), interval, buckets=buckets, name="t", **kwargs
    )


def _jt(values) -> dict[str, JaggedTensor]:
    values = torch.as_tensor(values, dtype=torch.int64)
    return {"t": JaggedTensor(values=values, lengths=torch.ones(values.numel(), dtype=torch.long))}


def _stream(seed: int, steps: int, size: int = 16, vocab: int = 60) -> list[torch.Tensor]:
    """Power-law (Zipf) raw ids in a 40-bit space: the k-th most frequent is ``k**2 * 7919 + BIG``."""
    g = torch.Generator().manual_seed(seed)
    probs = 1.0 / torch.arange(1, vocab + 1)
    ranks = [torch.multinomial(probs, size, replacement=True, generator=g) for _ in range(steps)]
    return [k**2 * 7919 + BIG for k in ranks]


def _rows(module, values) -> torch.Tensor:
    return module(_jt(values))["t"].values()


def _state(module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("kind", ["lfu", "lru", "dlfu"])
@pytest.mark.parametrize("buckets", [1, 3])
def test_kept_ids_get_distinct_rows_and_the_rest_the_reserved_row(kind, buckets):
    module = _module(zch=12, kind=kind, buckets=buckets)
    for batch in _stream(0, 6):
        _rows(module, batch)
    module.eval()
    kept = module._mch_sorted_raw_ids[module._mch_sorted_raw_ids != torch.iinfo(torch.int64).max]
    rows = _rows(module, kept)
    assert rows.unique().numel() == kept.numel() == 12 - buckets  # every slot used, no collision
    reserved = torch.tensor(module._slots.miss_rows.tolist())
    assert not bool(torch.isin(rows, reserved).any())
    unseen = torch.tensor([5, 6, 7]) + 3 * BIG  # never seen: each in its bucket's reserved row
    expected = reserved[bucket_of(spread(unseen, SPACE), buckets, SPACE)]
    torch.testing.assert_close(_rows(module, unseen), expected)


def test_lfu_keeps_the_most_frequent_ids():
    module = _module(zch=4, kind="lfu", interval=1)
    _rows(module, [BIG + 1] * 5 + [BIG + 2] * 4 + [BIG + 3] * 3 + [BIG + 4] * 2)
    module.eval()
    rows = _rows(module, [BIG + 1, BIG + 2, BIG + 3, BIG + 4])
    assert rows[:3].unique().numel() == 3 and int(rows[3]) == 3  # 3 slots + the reserved row 3


def test_lru_keeps_the_most_recent_ids_and_ttl_frees_stale_ones():
    lru = _module(zch=4, kind="lru", interval=1)
    for step in range(5):
        _rows(lru, [BIG + step])
    lru.eval()
    rows = _rows(lru, [BIG + 0, BIG + 1, BIG + 2, BIG + 3, BIG + 4])
    assert rows[:2].tolist() == [3, 3] and rows[2:].unique().numel() == 3  # 0 and 1 evicted
    ttl = MCHManagedCollisionModule(6, "cpu", LRU_EvictionPolicy(ttl=2), 1, name="t")
    _rows(ttl, [BIG + 9])
    assert int(ttl.open_slots()) == 4
    for _ in range(3):
        _rows(ttl, [BIG + 8])
    assert int(ttl.open_slots()) == 4  # BIG + 9 unseen for 3 > ttl iterations: its slot freed
    assert ttl.evict().numel() == 2  # the rows of BIG + 9 and BIG + 8


def test_distance_lfu_trades_frequency_for_recency():
    module = _module(zch=3, kind="dlfu", interval=1)
    _rows(module, [BIG + 1] * 4)  # frequent, then gone
    for _ in range(3):
        _rows(module, [BIG + 2, BIG + 3])
    module.eval()
    rows = _rows(module, [BIG + 1, BIG + 2, BIG + 3])
    assert int(rows[0]) == 2 and rows[1:].unique().numel() == 2  # 4 / 4**1.5 < 3 / 1


def test_evictions_happen_every_interval_and_not_in_eval():
    module = _module(zch=6, kind="lfu", interval=3)
    assert _rows(module, [BIG, BIG]).tolist() == [5, 5]
    assert _rows(module, [BIG]).tolist() == [5]
    first = _rows(module, [BIG])  # iteration 3: evicts first, then remaps
    assert int(first) != 5 and module.evict().tolist() == [int(first)]
    module.eval()
    before = _state(module)
    for _ in range(4):
        _rows(module, [BIG + 1])
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # eval only remaps
    assert module.evict() is None and int(module._current_iter_tensor) == 3


@pytest.mark.parametrize("kind", ["lfu", "lru", "dlfu"])
def test_buckets_decide_alone_as_row_wise_shards_will(kind):
    """A 4-bucket module equals 2 modules of 2 buckets each (rebuilt for rows [0, 10) and
    [10, 20)) fed the ids of their buckets: same rows out, same state slot for slot."""
    whole = _module(zch=20, kind=kind, interval=2, buckets=4)
    bounds = whole._segments
    assert bounds == [0, 5, 10, 15, 20]
    halves = [whole.rebuild_with_output_id_range((0, 10)), whole.rebuild_with_output_id_range((10, 20))]  # fmt: skip
    for batch in _stream(1, 9, size=24):
        expected = _rows(whole, batch)
        for half, owned in zip(halves, ([0, 1], [2, 3])):
            mine = torch.isin(bucket_of(spread(batch, SPACE), 4, SPACE), torch.tensor(owned))
            torch.testing.assert_close(_rows(half, batch[mine]), expected[mine])
    for key, value in whole.state_dict().items():
        if key.startswith("_mch_"):
            torch.testing.assert_close(torch.cat([h.state_dict()[key] for h in halves]), value)
    foreign = batch[bucket_of(spread(batch, SPACE), 4, SPACE) == 3][:1]
    with pytest.raises(ValueError, match=r"raw id \d+ is in bucket 3 of 4; this module owns buckets \[0, 2\)"):  # fmt: skip
        _rows(halves[0], foreign)


def test_a_shard_loads_its_slice_of_the_whole_state():
    whole = _module(zch=20, kind="dlfu", interval=2, buckets=4)
    for batch in _stream(2, 6, size=24):
        _rows(whole, batch)
    half = whole.rebuild_with_output_id_range((10, 20))
    state = {k: v[10:] if k.startswith("_mch_") else v for k, v in whole.state_dict().items()}
    half.load_state_dict(state)
    whole.eval(), half.eval()
    batch = torch.cat(_stream(3, 2, size=24))
    mine = bucket_of(spread(batch, SPACE), 4, SPACE) >= 2
    torch.testing.assert_close(_rows(half, batch[mine]), _rows(whole, batch)[mine])


@pytest.mark.parametrize("kind", ["lfu", "lru", "dlfu"])
def test_state_dict_round_trip_resumes_exactly(kind):
    """Saved at an eviction, loaded into a fresh module: the whole state (iteration included)
    comes back and the next steps give the same rows and state as the uninterrupted run."""
    stream = _stream(4, 10)
    run = _module(kind=kind, interval=2, buckets=2)
    for batch in stream[:4]:
        _rows(run, batch)
    saved = _state(run)
    resumed = _module(kind=kind, interval=2, buckets=2)
    resumed.load_state_dict(saved)
    for key, value in resumed.state_dict().items():
        torch.testing.assert_close(value, saved[key])
    assert int(resumed._current_iter_tensor) == 4
    for batch in stream[4:]:
        torch.testing.assert_close(_rows(resumed, batch), _rows(run, batch))
    for key, value in run.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value)


def test_resumed_between_evictions_the_count_restarts_as_torchrecs():
    """Saved at iteration 5 (interval 2, one iteration past an eviction), a loaded module evicts
    at iterations 7, 9, ... as TorchRec's (its ``_last_eviction_iter`` starts at the loaded
    iteration), not at 6: the ids seen at 6 get no row until 7."""
    run = _module(zch=12, interval=2)
    for _ in range(5):
        _rows(run, torch.tensor([BIG, BIG + 1]))  # 2 of the 11 slots taken: room for more
    resumed = _module(zch=12, interval=2)
    resumed.load_state_dict(_state(run))
    assert int(resumed._current_iter_tensor) == 5
    new = torch.tensor([BIG + 2])
    assert int(_rows(resumed, new)) == 11  # iteration 6: no eviction, the reserved row
    assert int(_rows(resumed, new)) != 11  # iteration 7 evicts first: a row of its own


def test_buckets_are_torchrecs_blocks_of_the_input_range():
    """An id's bucket is FBGEMM's block bucketization of ``[0, input_hash_size)`` (what TorchRec's
    row-wise input dist sends to each rank): ``x // ceil(size / buckets)`` in range, ``x mod
    buckets`` beyond; figures from TorchRec 1.8's ``bucketize_kjt_before_all2all``."""
    ids = torch.tensor([0, 4999, 5000, 9999, 10000, 12345, 15001, 2**40, 2**40 + 1, 7])
    assert bucket_of(ids, 2, 10_000).tolist() == [0, 0, 1, 1, 0, 1, 1, 0, 1, 0]
    assert bucket_of(ids, 4, 20_000).tolist() == [0, 0, 1, 1, 2, 2, 3, 0, 1, 0]
    assert bucket_of(ids, 2, 2**63 - 1).tolist() == [0] * 10  # the default range: all in 0


def test_loading_a_state_of_other_buckets_or_a_damaged_one_is_refused():
    saved = _state(_module(zch=12, buckets=2))
    with pytest.raises(ValueError, match=r"table 't' was saved with bucket bounds \[0, 6, 12\]"):
        _module(zch=12, buckets=3).load_state_dict(saved)
    damaged = dict(saved, _mch_remapped_ids_mapping=torch.arange(12).flip(0))
    with pytest.raises(ValueError, match="distinct row of its own bucket"):
        _module(zch=12, buckets=2).load_state_dict(damaged)
    moved = dict(saved, _mch_sorted_raw_ids=torch.arange(12))  # the reserved slots hold ids
    with pytest.raises(ValueError, match="last slot of each bucket must stay empty"):
        _module(zch=12, buckets=2).load_state_dict(moved)


def test_a_state_saved_with_hash_buckets_is_refused():
    """Before the block bucketization (f70f7b2) a hash of the id chose its bucket; such a state
    of several buckets holds ids in the slots of buckets the block rule does not give them,
    and would remap them silently wrong: refused, naming the id and both buckets."""
    saved = _state(_module(zch=12, buckets=2))
    _module(zch=12, buckets=2).load_state_dict(saved)  # today's state loads
    ids = saved["_mch_sorted_raw_ids"].clone()
    ids[0] = SPACE - 1  # the block rule's bucket 1, in bucket 0's first slot
    with pytest.raises(
        ValueError,
        match=rf"raw id {SPACE - 1} is saved in bucket 0 of 2, but belongs to bucket 1 "
        r"\(TorchRec's block bucketization: ids in blocks of ceil\(input_hash_size / buckets\) "
        rf"= {-(-SPACE // 2)}\); .* or start the remapper afresh",
    ):
        _module(zch=12, buckets=2).load_state_dict(dict(saved, _mch_sorted_raw_ids=ids))


def test_state_dict_has_torchrec_names():
    keys = list(_module(kind="dlfu").state_dict())
    assert keys == [
        "_output_segments_tensor",
        "_current_iter_tensor",
        "_mch_sorted_raw_ids",
        "_mch_remapped_ids_mapping",
        "_mch_counts",
        "_mch_last_access_iter",
    ]
    assert list(_module(kind="lru").state_dict())[-1] == "_mch_last_access_iter"
    assert "_mch_last_access_iter" not in _module(kind="lfu").state_dict()


def test_threshold_filters_keep_out_rare_ids():
    counts = torch.tensor([1, 1, 1, 9])
    assert average_threshold_filter(counts)[0].tolist() == [False, False, False, True]
    assert dynamic_threshold_filter(counts, 1.0)[0].tolist() == [False, False, False, True]
    torch.manual_seed(0)
    assert probabilistic_threshold_filter(torch.tensor([0, 1000]))[0].tolist() == [False, True]
    module = MCHManagedCollisionModule(
        8, "cpu", LFU_EvictionPolicy(threshold_filtering_func=average_threshold_filter), 1
    )
    _rows(module, [BIG + 1] * 5 + [BIG + 2, BIG + 3])
    module.eval()
    rows = _rows(module, [BIG + 1, BIG + 2, BIG + 3])
    assert int(rows[0]) != 7 and rows[1:].tolist() == [7, 7]


def test_input_hash_func_runs_first():
    module = MCHManagedCollisionModule(
        8, "cpu", LFU_EvictionPolicy(), 1, input_hash_size=100,
        input_hash_func=lambda ids, size: torch.remainder(ids, size),
    )  # fmt: skip
    first = _rows(module, [BIG + 5])
    assert int(first) != 7 and torch.equal(_rows(module, [81]), first)  # (2**40 + 5) % 100


def test_collection_remaps_each_table_and_keeps_the_kjt_layout():
    tables = [
        EmbeddingBagConfig(name="a", embedding_dim=2, num_embeddings=6, feature_names=["f", "g"]),
        EmbeddingBagConfig(name="b", embedding_dim=2, num_embeddings=4, feature_names=["h"]),
    ]
    modules = {c.name: _module(zch=c.num_embeddings, interval=1) for c in tables}
    mcc = ManagedCollisionCollection(modules, tables)
    kjt = KeyedJaggedTensor(
        keys=["h", "extra", "f", "g"],
        values=torch.tensor([BIG + 1, 7, BIG + 2, BIG + 2, BIG + 3]),
        lengths=torch.tensor([1, 0, 1, 0, 1, 1, 0, 1]),
        weights=torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0]),
    )
    out = mcc(kjt)
    assert out.keys() == ["f", "g", "h"] and out.lengths().tolist() == [1, 1, 0, 1, 1, 0]
    assert out.weights().tolist() == [2.0, 3.0, 4.0, 0.5]
    f0, f1, g0, h0 = out.values().tolist()
    assert f0 == f1 and g0 != f0 and 5 not in (f0, g0) and h0 != 3  # each id took a row
    assert list(mcc.evict()) == ["a", "b"] and mcc.table_to_number_buckets() == {"a": 1, "b": 1}
    with pytest.raises(ValueError, match=r"features \['h'\] of its tables are not keys"):
        mcc(KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([1]), lengths=torch.tensor([1, 0])))  # fmt: skip


def test_bad_configurations_are_refused():
    tables = [EmbeddingBagConfig(name="a", embedding_dim=2, num_embeddings=6, feature_names=["f"])]
    with pytest.raises(ValueError, match=r"tables \['a'\] have none, modules \['b'\] have no"):
        ManagedCollisionCollection({"b": _module(zch=6)}, tables)
    with pytest.raises(ValueError, match="num_embeddings 6 but its managed-collision module maps to 8"):  # fmt: skip
        ManagedCollisionCollection({"a": _module(zch=8)}, tables)
    with pytest.raises(ValueError, match=r"bucket of 1 row\(s\); each bucket needs >= 2 rows"):
        _module(zch=5, buckets=3)
    with pytest.raises(ValueError, match="eviction_interval must be >= 1 iteration, got 0"):
        _module(interval=0)
    with pytest.raises(ValueError, match=r"buckets must be in \[1, 1024\], got 2000"):
        _module(zch=10_000, buckets=2000)
    with pytest.raises(ValueError, match=r"rows \[3, 9\) must start and end on the bucket bounds"):
        _module(zch=6, output_global_offset=3, output_segments=[0, 6, 12])
    with pytest.raises(TypeError, match="eviction_policy must be an MCHEvictionPolicy"):
        MCHManagedCollisionModule(6, "cpu", "lfu", 1)
    with pytest.raises(ValueError, match="ttl=0 needs an integer >= 1"):
        LRU_EvictionPolicy(ttl=0)

    class Scored(MCHEvictionPolicy):
        def eviction_scores(self, current_iter, metadata):
            return metadata["score"]

    with pytest.raises(ValueError, match=r"metadata \['score'\] is not kept by shardkit"):
        Scored([MCHEvictionPolicyMetadataInfo("score", True, False)])


def test_int32_ids_remap_as_int64_ones():
    wide, narrow = _module(zch=12, buckets=2), _module(zch=12, buckets=2)
    for step in range(4):
        ids = torch.arange(step, step + 9) * 7
        out = narrow({"t": JaggedTensor(values=ids.int(), lengths=torch.ones(9, dtype=torch.long))})
        assert out["t"].values().dtype == torch.int32
        torch.testing.assert_close(out["t"].values().long(), _rows(wide, ids))
    half = wide.rebuild_with_output_id_range((6, 12))
    ids = torch.arange(40, dtype=torch.int32)
    mine = ids[bucket_of(spread(ids.long(), SPACE), 2, SPACE) == 1]
    half({"t": JaggedTensor(values=mine, lengths=torch.ones(mine.numel(), dtype=torch.long))})
