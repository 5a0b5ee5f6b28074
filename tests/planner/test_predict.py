"""Machine profiles and the predicted step: the profile's JSON round trip and checks, the
collective and kernel models, `predict_step` against hand-computed milliseconds, and the
planner's choice following the profile (slow collectives pick another layout than fast ones).

The profiles here are written by hand, with round numbers, so every expected value below is
arithmetic anyone can redo (see [Note: step-time model])."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.planner import (
    COLLECTIVE_KINDS,
    KernelFit,
    LinkFit,
    MachineProfile,
    ParameterConstraints,
    ShardingType,
    Topology,
    load_profile,
    miss_fraction,
    plan_tables,
)
from shardkit.planner._profile import collective_ms, expected_unique
from shardkit.sharding import construct_module_sharding_plan, row_wise, table_wise
from tests.planner._profiles import BW, LAT, profile


def one_table(rows: int = 1000):
    return [
        EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=rows, feature_names=["f"])
    ]


def predicted(plan_module, *, world: int = 2, prof: MachineProfile | None = None):
    from shardkit.planner import estimate_plan
    from shardkit.types import ShardingPlan

    stats = estimate_plan(
        ShardingPlan({"": plan_module}),
        one_table(),
        Topology.from_profile(prof or profile(), world_size=world),
        batch_size=100,
        constraints={"t": ParameterConstraints(pooling_factors=[10.0])},
        fused_params={"optimizer": "exact_sgd"},
        dense_parameters=1000,
    )
    return stats.prediction


def _module_plan(generator, world: int = 2):
    from shardkit.modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(tables=one_table(), device="meta")
    return construct_module_sharding_plan(
        ebc, {"t": generator}, world_size=world, local_size=world, device_type="cpu"
    )


def test_table_wise_step_by_hand():
    # I = 10 ids x 100 bags = 1,000 ids per rank, O = 100 bags; W = 2; the shard on rank 0
    p = predicted(_module_plan(table_wise(rank=0)))
    forward = 0.1 + 1e-6 * (1000 * 2) * 16  # per call + per id x col, the world's 2,000 ids
    backward = 0.2 + 1e-5 * 2000
    header = 8 * 8 * 2
    sent = 1000 * 8 + 1 * 100 * 8  # each rank: its ids to the one block, lengths to the shard
    received = 2000 * 8 + 2 * 100 * 8  # rank 0: every rank's ids and lengths
    input_dist = (LAT + header / BW) + (LAT + max(sent, received) / BW)
    outputs = 200 * 16 * 4  # rank 0 sends the world's 200 pooled rows
    output_dist = 2 * (LAT + outputs / BW)  # all-to-all forward, and back
    dense = 3 * 2 * 1000 * 100 / 1e9 + 28 * 1000 / 1e7  # 2 flops/param/example x3, Adam's bytes
    all_reduce = LAT + 4 * 1000 / BW
    phases = dict(p.phases)
    assert phases["embedding"] == pytest.approx(forward + backward)
    assert phases["input_dist"] == pytest.approx(input_dist)
    assert phases["output_dist"] == pytest.approx(output_dist)
    assert phases["dense"] == pytest.approx(dense)
    assert phases["dense_all_reduce"] == pytest.approx(all_reduce)
    assert phases["overhead"] == pytest.approx(1.0)
    step = forward + backward + input_dist + output_dist + dense + all_reduce + 1.0
    assert p.step_ms == pytest.approx(step)
    assert p.samples_per_s == pytest.approx(200 / step * 1e3)
    assert p.slowest_rank == 0 and p.ranks[1].embedding == 0.0
    assert p.ranks[0].total == pytest.approx(step)


def test_row_wise_step_by_hand():
    p = predicted(_module_plan(row_wise()))
    forward = 0.1 + 1e-6 * 1000 * 16  # each rank: half the rows, so half the world's ids
    backward = 0.2 + 1e-5 * 1000
    sent = 1000 * 8 + 2 * 100 * 8  # ids bucketed over both shards; lengths to each
    received = 1000 * 8 + 2 * 100 * 8
    input_dist = (LAT + 128 / BW) + (LAT + max(sent, received) / BW)
    partial = 200 * 16 * 4  # partial sums for all 200 bags: reduce-scatter, then all-gather
    phases = dict(p.phases)
    assert phases["embedding"] == pytest.approx(forward + backward)
    assert phases["input_dist"] == pytest.approx(input_dist)
    assert phases["output_dist"] == pytest.approx(2 * (LAT + partial / BW))
    assert [r.embedding for r in p.ranks] == pytest.approx([forward + backward] * 2)


def test_row_split_tables_pay_the_bucketing_of_their_ids():
    # each rank groups its batch's 1,000 ids (100 bags x 10) by shard before the exchange;
    # table-wise sends them whole (see [Note: step-time model])
    prof = replace(profile(), bucket_ms_per_id=1e-3)
    for generator, charged in ((row_wise(), 1000 * 1e-3), (table_wise(rank=0), 0.0)):
        plain = dict(predicted(_module_plan(generator)).phases)
        bucketing = dict(predicted(_module_plan(generator), prof=prof).phases)
        assert bucketing["input_dist"] == pytest.approx(plain["input_dist"] + charged)
        assert {k: v for k, v in bucketing.items() if k != "input_dist"} == pytest.approx(
            {k: v for k, v in plain.items() if k != "input_dist"}
        )
    # ranks sharing cores bucket in turns
    shared = replace(profile(cores=1), bucket_ms_per_id=1e-3)
    both = dict(predicted(_module_plan(row_wise()), prof=shared).phases)
    none = dict(predicted(_module_plan(row_wise()), prof=profile(cores=1)).phases)
    assert both["input_dist"] == pytest.approx(none["input_dist"] + 2 * 1000 * 1e-3)
    with pytest.raises(ValueError, match="bucket_ms_per_id must be a finite number >= 0"):
        replace(profile(), bucket_ms_per_id=-1.0)
    again = load_profile_dict(replace(profile(), bucket_ms_per_id=2e-6).to_dict())
    assert again.bucket_ms_per_id == 2e-6


def load_profile_dict(data: dict) -> MachineProfile:
    return MachineProfile.from_dict(json.loads(json.dumps(data)))


def test_ranks_computing_at_once_slow_each_others_kernels_by_the_calibrated_factor():
    # 2 ranks on 4 cores run at once: their kernels take kernels_together x alone (they share
    # the cache and memory bandwidth); nothing else changes (see [Note: ranks computing at once])
    plan = _module_plan(row_wise())
    plain = dict(predicted(plan).phases)
    shared = dict(predicted(plan, prof=replace(profile(), kernels_together=1.5)).phases)
    assert shared["embedding"] == pytest.approx(1.5 * plain["embedding"])
    assert {k: v for k, v in shared.items() if k != "embedding"} == pytest.approx(
        {k: v for k, v in plain.items() if k != "embedding"}
    )
    prof = replace(profile(cores=2), kernels_together=1.5)
    assert prof.kernel_slowdown(2) == 1.5 and prof.kernel_slowdown(1) == 1.0
    # more ranks than cores take turns: the time-sharing model stands alone
    assert prof.kernel_slowdown(4) == 1.0
    assert replace(prof, compute_device="cuda").kernel_slowdown(2) == 1.0
    one = _module_plan(table_wise(rank=0), world=1)
    assert predicted(one, world=1, prof=prof).phases == predicted(one, world=1).phases
    assert load_profile_dict(prof.to_dict()).kernels_together == 1.5
    older = {k: v for k, v in prof.to_dict().items() if k != "kernels_together"}
    assert load_profile_dict(older).kernels_together == 1.0  # written before it was measured
    with pytest.raises(ValueError, match="kernels_together must be a finite number >= 1"):
        replace(profile(), kernels_together=0.5)


def test_ranks_beyond_the_cores_compute_in_turns_and_their_collectives_wait():
    # 2 ranks of 1 thread on 1 core: compute time-shared (x2), and each collective waits
    # switch_wait_ms x (2 - 1) = 3 ms for its ranks to be scheduled
    # (see [Note: oversubscribed cores])
    one_core = predicted(_module_plan(table_wise(rank=0)), prof=profile(cores=1, switch_wait_ms=3))
    enough = predicted(_module_plan(table_wise(rank=0)), prof=profile(switch_wait_ms=3))
    shared, own = dict(one_core.phases), dict(enough.phases)
    for name in ("dense", "overhead"):
        assert shared[name] == pytest.approx(2 * own[name])
    # the table's kernels are rank 0's alone: rank 1 waits in the next collective meanwhile,
    # so rank 0 has the core to itself (the host's work over its cores is no more)
    assert shared["embedding"] == pytest.approx(own["embedding"])
    assert one_core.ranks[0].embedding == pytest.approx(own["embedding"])
    # the ids' header and ids; the pooled rows there and back; the dense all-reduce
    assert shared["input_dist"] == pytest.approx(own["input_dist"] + 2 * 3.0)
    assert shared["output_dist"] == pytest.approx(own["output_dist"] + 2 * 3.0)
    assert shared["dense_all_reduce"] == pytest.approx(own["dense_all_reduce"] + 3.0)
    assert one_core.step_ms == pytest.approx(sum(shared.values()))
    assert "2 ranks x 1 thread(s) share 1 cores: compute x2 (time-shared), each of the " \
        "step's 5 collectives +3 ms" in one_core.summary()  # fmt: skip
    # cores enough: the wait is never charged, and nothing is said
    assert own == pytest.approx(dict(predicted(_module_plan(table_wise(rank=0))).phases))
    assert "share" not in enough.summary() and enough.shared_cores == ""
    # 4 ranks on 1 core: 3 ranks wait ahead of each; row-wise: one collective each way
    prof = profile(cores=1, switch_wait_ms=3)
    assert prof.oversubscription(4) == 4 and prof.collective_wait_ms(4) == pytest.approx(9.0)
    four = predicted(_module_plan(row_wise(), world=4), world=4, prof=prof)
    alone = predicted(_module_plan(row_wise(), world=4), world=4, prof=profile(cores=4))
    gained = {k: dict(four.phases)[k] - dict(alone.phases)[k] for k in dict(four.phases)}
    assert gained["output_dist"] == pytest.approx(2 * 9.0)
    assert gained["dense_all_reduce"] == pytest.approx(9.0)
    assert gained["embedding"] == pytest.approx(3 * dict(alone.phases)["embedding"])
    assert [r.embedding for r in four.ranks] == pytest.approx([4 * alone.ranks[0].embedding] * 4)
    # the same table on one rank of the four: its kernels alone, the 3 others idle
    lone = predicted(_module_plan(table_wise(rank=2), world=4), world=4, prof=prof)
    apart = predicted(_module_plan(table_wise(rank=2), world=4), world=4, prof=profile(cores=4))
    assert dict(lone.phases)["embedding"] == pytest.approx(dict(apart.phases)["embedding"])
    assert dict(lone.phases)["dense"] == pytest.approx(4 * dict(apart.phases)["dense"])
    # GPUs never share: each rank has its own device
    assert replace(prof, compute_device="cuda").collective_wait_ms(4) == 0.0


def test_large_step_buffers_pay_their_page_faults():
    # See [Note: fresh pages]. Row-wise on 4 ranks, batch 100, dim 16: each rank's kernel
    # writes partial sums for all 400 bags (25,600 bytes), and its output class allocates the
    # reduce-scatter's all-to-all buffer, the all-gather's output and gloo's flat buffer (3 x
    # 25,600); with buffers of 10,000 bytes or more getting fresh pages at 1e-5 ms per byte,
    # that adds 0.256 ms to the embedding and 0.768 ms to the output distribution
    fresh = replace(profile(cores=4), fresh_buffer_bytes=10_000, fresh_page_ms_per_byte=1e-5)
    plan = _module_plan(row_wise(), world=4)
    base = dict(predicted(plan, world=4, prof=profile(cores=4)).phases)
    paid = dict(predicted(plan, world=4, prof=fresh).phases)
    gained = {k: paid[k] - base[k] for k in base}
    assert gained["embedding"] == pytest.approx(25_600 * 1e-5)
    assert gained["output_dist"] == pytest.approx(3 * 25_600 * 1e-5)
    assert gained["input_dist"] == gained["dense"] == gained["overhead"] == 0.0
    # buffers under the threshold are the allocator's own memory (the steady heap keeps a
    # step's memory mapped: [Note: a steady heap] in shardkit.kernels): nothing is charged
    small = replace(fresh, fresh_buffer_bytes=25_601)
    under = dict(predicted(plan, world=4, prof=small).phases)
    assert under["embedding"] == pytest.approx(base["embedding"])
    assert under["output_dist"] == pytest.approx(base["output_dist"])
    # ranks sharing cores fault in turns, as they compute (2 ranks per core here)
    shared = replace(fresh, cores=2)
    unpaid = dict(predicted(plan, world=4, prof=profile(cores=2)).phases)
    twice = dict(predicted(plan, world=4, prof=shared).phases)
    assert twice["output_dist"] - unpaid["output_dist"] == pytest.approx(2 * 3 * 25_600 * 1e-5)
    # table-wise on rank 0: its kernel's 400 bags (25,600 bytes) and the adjoint all-to-all's
    # rows of them; each rank receives only its own 100 bags (6,400 bytes: no faults)
    tw = _module_plan(table_wise(rank=0), world=4)
    base_tw = dict(predicted(tw, world=4, prof=profile(cores=4)).phases)
    paid_tw = dict(predicted(tw, world=4, prof=fresh).phases)
    assert paid_tw["embedding"] - base_tw["embedding"] == pytest.approx(25_600 * 1e-5)
    assert paid_tw["output_dist"] - base_tw["output_dist"] == pytest.approx(25_600 * 1e-5)


def test_fused_replicas_pay_the_page_faults_of_their_gathered_batch():
    from shardkit.sharding import data_parallel

    # 4 ranks gather 100 bags x (16 + 1) words and 1,000 ids each: 4 x 2,700 x 4 = 43,200
    # bytes, held 3 times (the output, gloo's flat buffer, the uneven chunks joined) and the
    # gradients unpacked from it (16 of every 17 words of the bags)
    plan = _module_plan(data_parallel(compute_kernel="fused"), world=4)
    fresh = replace(profile(cores=4), fresh_buffer_bytes=10_000, fresh_page_ms_per_byte=1e-5)
    base = dict(predicted(plan, world=4, prof=profile(cores=4)).phases)
    paid = dict(predicted(plan, world=4, prof=fresh).phases)
    gathered = 4 * (100 * 17 + 1000) * 4
    assert paid["output_dist"] - base["output_dist"] == pytest.approx(
        (3 + 16 / 17) * gathered * 1e-5
    )
    assert paid["embedding"] == pytest.approx(base["embedding"])  # 100 bags x 64 B: none


def test_fused_replicas_count_every_collective_their_step_makes():
    from shardkit.sharding import data_parallel

    # measured (issue 29's trace of the small case): with only replicas, the input
    # distribution still exchanges its headers and an empty batch (2 calls), and the replicas
    # gather the id counts in forward and the batch in backward (2 more)
    plan = _module_plan(data_parallel(compute_kernel="fused"))
    shared = dict(predicted(plan, prof=profile(cores=1, switch_wait_ms=3)).phases)
    own = dict(predicted(plan, prof=profile(cores=2, switch_wait_ms=3)).phases)
    assert own["input_dist"] == pytest.approx((LAT + 128 / BW) + LAT)  # header, nothing else
    assert shared["input_dist"] == pytest.approx(own["input_dist"] + 2 * 3.0)
    gathered = 2 * (100 * 17 + 1000) * 4  # 2 ranks' bags x (16 + 1) words and 1,000 ids
    assert own["output_dist"] == pytest.approx((LAT + 16 / BW) + (LAT + gathered / BW))
    assert shared["output_dist"] == pytest.approx(own["output_dist"] + 2 * 3.0)


def test_the_simulated_cluster_gives_each_rank_its_cores():
    from shardkit.planner import ClusterShape

    cluster = ClusterShape(ranks_per_host=8, inter_host_bw=1e6, inter_host_latency_ms=0.01)
    prof = cluster.apply(profile(cores=2, switch_wait_ms=3))
    assert prof.oversubscription(8) == 1 and prof.collective_wait_ms(8) == 0.0


def test_one_rank_has_no_collectives():
    p = predicted(_module_plan(table_wise(rank=0), world=1), world=1)
    phases = dict(p.phases)
    assert phases["input_dist"] == phases["output_dist"] == phases["dense_all_reduce"] == 0.0
    assert phases["embedding"] == pytest.approx(0.1 + 1e-6 * 1000 * 16 + 0.2 + 1e-5 * 1000)


def test_one_rank_collectives_take_what_calibration_measured_at_one_rank():
    alone = tuple(LinkFit(kind, 1, 0.05, 1e7) for kind in COLLECTIVE_KINDS)
    prof = replace(profile(), links=profile().links + alone)
    p = predicted(_module_plan(table_wise(rank=0), world=1), world=1, prof=prof)
    phases = dict(p.phases)
    ids = 1000 * 8 + 1 * 100 * 8  # its own ids and lengths, to itself
    assert phases["input_dist"] == pytest.approx((0.05 + 64 / 1e7) + (0.05 + ids / 1e7))
    assert phases["output_dist"] == pytest.approx(2 * (0.05 + 100 * 16 * 4 / 1e7))
    assert phases["dense_all_reduce"] == pytest.approx(0.05 + 4000 / 1e7)
    # and two ranks still use the two-rank fits
    two = predicted(_module_plan(table_wise(rank=0)), prof=prof)
    assert dict(two.phases) == pytest.approx(
        dict(predicted(_module_plan(table_wise(rank=0))).phases)
    )


def test_collective_model_extrapolates_to_other_sizes():
    prof = replace(profile(), links=(LinkFit("all_reduce", 2, 1.0, 1e6),))
    at = {"profile": prof, "local_world_size": 8}
    assert collective_ms("all_reduce", 5e5, world_size=2, **at) == pytest.approx(1.5)
    # at 2 ranks: 2 latencies of 0.5 ms; bus bandwidth 1e6 x 2 (2 - 1) / 2 = 1e6 bytes/ms;
    # at 8: 2 log2(8) latencies, and each link carries 2 (8 - 1) / 8 of the bytes
    expected = 2 * 3 * 0.5 + 5e5 * (2 * 7 / 8) / 1e6
    assert collective_ms("all_reduce", 5e5, world_size=8, **at) == pytest.approx(expected)
    assert collective_ms("all_reduce", 5e5, world_size=1, **at) == 0.0
    with pytest.raises(ValueError, match="needs the link between hosts"):
        collective_ms("all_reduce", 5e5, world_size=16, profile=prof, local_world_size=8)
    with pytest.raises(ValueError, match="no all_to_all measurement"):
        collective_ms("all_to_all", 5e5, world_size=2, **at)


def test_unique_rows_and_cache_misses():
    assert expected_unique(1000, 10) == pytest.approx(10 * (1 - math.exp(-100)))
    assert expected_unique(10, 1_000_000) == pytest.approx(10, rel=1e-4)
    assert miss_fraction(100, 1000) == 0.0
    assert miss_fraction(4000, 1000) == pytest.approx(0.75)


def test_profile_round_trip(tmp_path):
    prof = replace(
        profile(switch_wait_ms=1.5), points={"kernel:exact_sgd": [{"ids": 1, "forward_ms": 0.5}]}
    )
    path = tmp_path / "p.json"
    prof.save(path)
    loaded = load_profile(path)
    assert loaded == prof and loaded.points == prof.points and loaded.switch_wait_ms == 1.5
    older = {k: v for k, v in prof.to_dict().items() if k != "switch_wait_ms"}
    path.write_text(json.dumps(older))  # a profile from before the wait was measured
    assert load_profile(path).switch_wait_ms == 0.0
    fresh = replace(prof, fresh_buffer_bytes=32 << 20, fresh_page_ms_per_byte=6e-7)
    fresh.save(path)
    assert load_profile(path) == fresh and load_profile(path).fresh_buffer_bytes == 32 << 20
    assert loaded.name == "hand-written"
    assert Topology.from_profile(loaded, world_size=2) == Topology.from_profile(prof, world_size=2)


def test_profile_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="not a profile"):
        load_profile(bad)
    data = profile().to_dict()
    bad.write_text(json.dumps({**data, "version": 99}))
    with pytest.raises(ValueError, match="profile version 99 is not 1"):
        load_profile(bad)
    del data["memory_bw"]
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="profile has no 'memory_bw'"):
        load_profile(bad)
    with pytest.raises(ValueError, match=r"forward must be 6 finite numbers >= 0"):
        KernelFit("exact_sgd", (0, 0, -1, 0, 0, 0), (0,) * 6)
    with pytest.raises(ValueError, match=r"LinkFit\.kind must be one of"):
        LinkFit("gossip", 2, 0.1, 1.0)
    with pytest.raises(ValueError, match="bytes_per_ms > 0"):
        LinkFit("all_reduce", 2, 0.1, 0.0)
    with pytest.raises(ValueError, match="step_overhead must be 4 numbers >= 0"):
        replace(profile(), step_overhead=(1.0, -1.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="switch_wait_ms must be a finite number >= 0"):
        replace(profile(), switch_wait_ms=-1.0)
    with pytest.raises(ValueError, match=r"fresh_buffer_bytes must be an int >= 0 and fresh_page"):
        replace(profile(), fresh_page_ms_per_byte=-1e-6)
    with pytest.raises(TypeError, match="profile must be a MachineProfile"):
        Topology(world_size=2, compute_device="cpu", profile={"memory_bw": 1})


def test_uncalibrated_optimizer_takes_the_nearest_below():
    fits = (
        KernelFit("exact_sgd", (1,) * 6, (1,) * 6),
        KernelFit("exact_row_wise_adagrad", (2,) * 6, (2,) * 6),
    )
    prof = replace(profile(), kernels=fits)
    assert prof.kernel("adam").optimizer == "exact_row_wise_adagrad"
    assert prof.kernel("exact_sgd").optimizer == "exact_sgd"


def _many_tables():
    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=64, num_embeddings=1000, feature_names=[f"f{i}"]
        )
        for i in range(4)
    ]


def _plan_types(prof: MachineProfile) -> set[ShardingType]:
    result = plan_tables(
        _many_tables(),
        Topology.from_profile(prof, world_size=2),
        batch_size=64,
        fused_params={"optimizer": "exact_sgd"},
        dense_parameters=1000,
    )
    assert result.stats.prediction is not None
    return {t.sharding_type for t in result.stats.tables}


def test_the_choice_follows_the_profile():
    # slow collectives (100 ms each): replicas need only the all-reduce the dense part pays
    # anyway, every sharded layout adds its input and output distributions
    assert _plan_types(profile(latency=100.0)) == {ShardingType.DATA_PARALLEL.value}
    # fast collectives: replicas' dense update over every row costs more than sharding
    assert ShardingType.DATA_PARALLEL.value not in _plan_types(profile(latency=0.0, bandwidth=1e9))


def test_plan_with_a_profile_prints_the_prediction():
    result = plan_tables(
        _many_tables(), Topology.from_profile(profile(), world_size=2), batch_size=64,
        fused_params={"optimizer": "exact_sgd"},
    )  # fmt: skip
    text = str(result.plan)
    assert "predicted step" in text and "input dist" in text and "samples/s" in text
    again = plan_tables(
        _many_tables(), Topology.from_profile(profile(), world_size=2), batch_size=64,
        fused_params={"optimizer": "exact_sgd"},
    )  # fmt: skip
    assert again.plan == result.plan and again.stats == result.stats  # pure


def test_cluster_shape_sets_the_links():
    from shardkit.planner import ClusterShape

    cluster = ClusterShape(
        ranks_per_host=8, inter_host_bw=1e6, inter_host_latency_ms=0.01,
        intra_host_bw=1e8, intra_host_latency_ms=0.001,
    )  # fmt: skip
    prof = cluster.apply(profile())
    n = 4e6
    inside = collective_ms("all_reduce", n, world_size=8, local_world_size=8, profile=prof)
    assert inside == pytest.approx(2 * 3 * 0.001 + n * (2 * 7 / 8) / 1e8)
    across = collective_ms("all_reduce", n, world_size=16, local_world_size=8, profile=prof)
    assert across == pytest.approx(2 * 4 * 0.01 + n * (2 * 15 / 16) / 1e6)
    # an all-to-all sends 8 of its 15 shares to the other host: those cross the slow link
    a2a = collective_ms("all_to_all", n, world_size=16, local_world_size=8, profile=prof)
    assert a2a == pytest.approx(4 * 0.01 + n * (15 / 16) * (8 / 15) / 1e6)
    assert prof.cores == 8  # each rank computes on a core of its own
    with pytest.raises(ValueError, match="give intra_host_bw and intra_host_latency_ms together"):
        ClusterShape(ranks_per_host=8, inter_host_bw=1e6, inter_host_latency_ms=0.01,
                     intra_host_bw=1e8)  # fmt: skip
    with pytest.raises(ValueError, match="inter_host_bw must be > 0"):
        ClusterShape(ranks_per_host=8, inter_host_bw=0, inter_host_latency_ms=0.01)


def test_dmp_planner_predicts_with_a_profiled_topology():
    from shardkit.modules import EmbeddingBagCollection
    from shardkit.planner import EmbeddingShardingPlanner
    from shardkit.sharding import EmbeddingBagCollectionSharder

    ebc = EmbeddingBagCollection(tables=_many_tables(), device="meta")
    planner = EmbeddingShardingPlanner(
        topology=Topology.from_profile(profile(), world_size=2), batch_size=64
    )
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": "exact_sgd"})
    planner.plan(ebc, [sharder])
    assert planner.stats is not None and planner.stats.prediction is not None
    assert planner.stats.prediction.world_size == 2 and planner.stats.prediction.step_ms > 0


def test_dense_settings_are_checked():
    from shardkit.planner._core import PlannerSettings

    with pytest.raises(ValueError, match="dense_parameters must be a number >= 0, got -1"):
        PlannerSettings(dense_parameters=-1)


def test_miss_curve_interpolates_between_calibrated_sizes():
    # See [Note: calibrated kernel model]: m measured at 1e6 and 1e8 bytes, in log size between
    curve = ((1e6, 0.1, 0.2), (1e8, 0.5, 0.8))
    fit = KernelFit("exact_sgd", (0,) * 6, (0,) * 7, miss_curve=curve)
    forward, backward = fit.miss(np.array([1e6, 1e7, 1e8]), 1 << 20)
    assert forward == pytest.approx([0.1, 0.3, 0.5])
    assert backward == pytest.approx([0.2, 0.5, 0.8])
    # below the first size: scaled down with the working set; beyond the last: as the plain
    # miss fraction grows (a 1e7-byte cache: 0.9 at 1e8 bytes, 0.99 at 1e9)
    assert [float(m) for m in fit.miss(5e5, 1 << 20)] == pytest.approx([0.05, 0.1])
    assert [float(m) for m in fit.miss(1e9, 10**7)] == pytest.approx([0.55, 0.88])
    # without a curve both directions take the plain miss fraction
    plain = KernelFit("exact_sgd", (0,) * 6, (0,) * 6)
    assert plain.backward == (0.0,) * 7  # a profile from before b6: none
    assert [float(m) for m in plain.miss(4000, 1000)] == [miss_fraction(4000, 1000)] * 2
    with pytest.raises(ValueError, match="miss_curve must be"):
        KernelFit("exact_sgd", (0,) * 6, (0,) * 7, miss_curve=((1e8, 0, 0), (1e6, 0, 0)))


def test_a_curve_of_two_sizes_prices_a_cached_and_a_memory_sized_table_apart():
    from shardkit.planner import estimate_plan
    from shardkit.types import ShardingPlan

    # a missed id costs 1e-4 ms each way; calibrated: nothing missed at 1e5 bytes, all at 1e9
    fit = KernelFit(
        "exact_sgd", (0.1, 0, 1e-6, 0, 1e-4, 0), (0.2, 1e-5, 0, 0, 1e-4, 0),
        miss_curve=((1e5, 0.0, 0.0), (1e9, 1.0, 1.0)),
    )  # fmt: skip
    prof = replace(profile(), kernels=(fit,), cache_bytes=1 << 20)

    def embedding(rows: int) -> float:
        tables = one_table(rows)
        plan = construct_module_sharding_plan(
            EmbeddingBagCollection(tables=tables, device="meta"), {"t": table_wise(rank=0)},
            world_size=2, local_size=2, device_type="cpu",
        )  # fmt: skip
        stats = estimate_plan(
            ShardingPlan({"": plan}), tables, Topology.from_profile(prof, world_size=2),
            batch_size=100, constraints={"t": ParameterConstraints(pooling_factors=[10.0])},
            fused_params={"optimizer": "exact_sgd"}, dense_parameters=1000,
        )  # fmt: skip
        return dict(stats.prediction.phases)["embedding"]

    # rank 0 looks up 2 ranks x 100 bags x 10 ids; the kernel also writes 200 bags x 16 x 4 B
    ids, out = 2000, 200 * 16 * 4
    fixed = 0.1 + 1e-6 * ids * 16 + 0.2 + 1e-5 * ids
    cached = 1000 * 16 * 4 + out  # 76,800 bytes: below the first size, which missed none
    assert embedding(1000) == pytest.approx(fixed)
    big = 1_000_000 * 16 * 4 + out  # 64 MB: between, in log size
    m = math.log(big / 1e5) / math.log(1e9 / 1e5)
    unique = expected_unique(ids, 1_000_000)
    assert embedding(1_000_000) == pytest.approx(fixed + m * 1e-4 * (ids + unique))
    assert 0.65 < m < 0.75 and cached < 1e5
    # not the plain miss fraction, 0.984 at 64 MB with this 1 MiB cache
    assert miss_fraction(big, 1 << 20) > 0.98
