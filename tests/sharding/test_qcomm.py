"""Compressed output dists (`QCommsConfig`, `qcomm_codecs_registry=`): the pooled rows go over
the wire in the forward precision asked for and their gradients in the backward one, and the
results equal the unsharded module's within the codec's rounding (the bound is asserted per
element: see `_check`)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.distributed as dist

import shardkit.comm
from shardkit import EmbeddingBagCollection, EmbeddingCollection, EmbeddingConfig
from shardkit.distributed.fbgemm_qcomm_codec import (
    CommType,
    QCommsConfig,
    get_qcomm_codecs_registry,
)
from shardkit.optim import EmbOptimType
from shardkit.planner import ShardingEnv
from shardkit.sharding import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingCollection,
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from tests.sharding.common import configs, global_batch, local_part, make_plan

LOCAL_BATCH = 4
LR = 0.5
WIRE_OPS = ("all_to_all_single", "reduce_scatter_tensor", "all_gather_into_tensor")
FP16, BF16 = CommType.FP16, CommType.BF16


class _Wire:
    """Records the dtype of every floating-point tensor shardkit.comm sends, per phase."""

    def __init__(self) -> None:
        self.phase = "forward"
        self.seen: dict[str, set[torch.dtype]] = {"forward": set(), "backward": set()}
        self._saved = {name: getattr(shardkit.comm, name) for name in WIRE_OPS}

    def __enter__(self) -> _Wire:
        for name, fn in self._saved.items():
            setattr(shardkit.comm, name, self._recording(fn))
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._saved.items():
            setattr(shardkit.comm, name, fn)

    def _recording(self, fn):
        @functools.wraps(fn)
        def call(x, *args, **kwargs):
            if x.is_floating_point():
                self.seen[self.phase].add(x.dtype)
            return fn(x, *args, **kwargs)

        return call


def _with_abs_weights(module):
    """A copy whose tables hold |weight|: its lookups bound the magnitudes summed."""
    copied = copy.deepcopy(module)
    with torch.no_grad():
        for param in copied.parameters():
            param.abs_()
    return copied


def _ebc_step(rank, world_size, kind, fwd, bwd, local_size):
    torch.manual_seed(0)
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
    ebc = EmbeddingBagCollection(tables=configs(), fused_params=fused)
    reference, bound_module = copy.deepcopy(ebc), _with_abs_weights(ebc)
    before = {n: p.detach().clone() for n, p in reference.named_parameters()}
    registry = get_qcomm_codecs_registry(
        QCommsConfig(forward_precision=fwd, backward_precision=bwd)
    )
    sharder = EmbeddingBagCollectionSharder(fused_params=fused, qcomm_codecs_registry=registry)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    plan = make_plan(ebc, kind, world_size, local_size)
    sharded = sharder.shard(ebc, plan, env, torch.device("cpu"), local_world_size=local_size)
    kjt = global_batch(7, LOCAL_BATCH * world_size, False)
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    grad = torch.randn(kjt.stride(), sum(c.embedding_dim * len(c.feature_names) for c in configs()),
                       generator=torch.Generator().manual_seed(3))  # fmt: skip
    with _Wire() as wire:
        out = sharded(local_part(kjt, rank, world_size)).values()
        wire.phase = "backward"
        (out * grad[mine]).sum().backward()  # tables step in backward (fused SGD)
    expected = reference(kjt).values()
    (expected * grad).sum().div(world_size).backward()  # the sharded gradients are divided by W
    magnitude = bound_module(kjt).values()[mine]  # sums of |w|: bounds the forward rounding
    step_bound = {n: LR * _uses(reference, kjt, grad.abs(), world_size)[n] for n in before}
    weights = _weights(sharded, reference, before, step_bound)
    return wire.seen, (out.detach(), expected[mine].detach(), magnitude.detach()), weights


def _uses(reference, kjt, weight, world_size) -> dict[str, torch.Tensor]:
    """Per table element: sum over its uses of |output gradient| / W (what a step moves it by
    under |gradient|): the backward rounding is at most eps times this."""
    probe = EmbeddingBagCollection(tables=configs())
    probe.load_state_dict(reference.state_dict())
    (probe(kjt).values() * weight).sum().div(world_size).backward()
    return {n: p.grad.abs() for n, p in probe.named_parameters()}


def _weights(sharded, reference, before, step_bound) -> list:
    """(table, this rank's shard after the step, the reference's block, the bound's block)."""
    out = []
    for name, table in sharded.embedding_bags.items():
        key = f"embedding_bags.{name}.weight"
        full = reference.embedding_bags[name].weight.detach()
        for shard, param in zip(table.shard_slices, table.shards):
            rows = slice(shard.row_start, shard.row_start + shard.rows)
            cols = slice(shard.col_start, shard.col_start + shard.cols)
            out.append((name, param.detach().clone(), full[rows, cols].clone(),
                        step_bound[key][rows, cols].clone()))  # fmt: skip
    return out


def _eps(precision: CommType) -> float:
    return torch.finfo({FP16: torch.float16, BF16: torch.bfloat16}[precision]).eps


def _check(results, world_size, fwd, bwd) -> None:
    wanted = {FP16: torch.float16, BF16: torch.bfloat16}
    rounded = False
    for seen, (out, expected, magnitude), weights in results:
        assert seen == {"forward": {wanted[fwd]}, "backward": {wanted[bwd]}}, seen
        # each rank's partial sums are rounded once, and a reduce-scatter adds W of them in
        # the wire dtype: at most W * eps of the summed magnitudes (plus float32 noise)
        assert ((out - expected).abs() <= world_size * _eps(fwd) * magnitude + 1e-6).all()
        rounded |= not torch.equal(out, expected)
        for name, mine, theirs, bound in weights:
            error = (mine - theirs).abs()
            assert (error <= _eps(bwd) * bound + 1e-6).all(), (
                name,
                (error - _eps(bwd) * bound).max(),
            )
    assert rounded, "the outputs equal float32's exactly: nothing was compressed"


@pytest.mark.parametrize(
    ("world_size", "kind", "fwd", "bwd", "local_size"),
    [
        (2, "table_wise", FP16, FP16, 2),
        (2, "row_wise", BF16, BF16, 2),
        (3, "row_wise", FP16, BF16, 3),
        (3, "column_wise", BF16, FP16, 3),
        (2, "table_column_wise", FP16, FP16, 2),
        (4, "table_row_wise", FP16, BF16, 2),
        (4, "grid_shard", BF16, FP16, 2),
    ],
)
def test_pooled_dists_send_the_precision_asked_and_stay_within_its_rounding(
    run_ranks, world_size, kind, fwd, bwd, local_size
):
    results = run_ranks(_ebc_step, world_size, kind, fwd, bwd, local_size,
                        local_world_size=local_size)  # fmt: skip
    _check(results, world_size, fwd, bwd)


def _ec_configs() -> list[EmbeddingConfig]:
    return [
        EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=11, feature_names=["a", "b"]),
        EmbeddingConfig(name="t1", embedding_dim=6, num_embeddings=7, feature_names=["c"]),
        EmbeddingConfig(name="t2", embedding_dim=4, num_embeddings=5, feature_names=["d"]),
        EmbeddingConfig(name="t3", embedding_dim=4, num_embeddings=9, feature_names=["e"]),
    ]


def _ec_step(rank, world_size, fwd, bwd):
    """Sequence lookups: each id's row comes back alone (no sums), so the forward error is at
    most eps/2 of the row; the tables' step error at most eps/2 of the step under |gradient|."""
    torch.manual_seed(0)
    ec = EmbeddingCollection(tables=_ec_configs())
    reference = copy.deepcopy(ec)
    registry = get_qcomm_codecs_registry(
        QCommsConfig(forward_precision=fwd, backward_precision=bwd)
    )
    gens = [row_wise(), table_wise(rank=1), row_wise(), table_wise(rank=0)]
    plan = construct_module_sharding_plan(
        ec, {f"t{i}": g for i, g in enumerate(gens)}, world_size=world_size, device_type="cpu"
    )
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedEmbeddingCollection(ec, plan, env, qcomm_codecs_registry=registry)
    kjt = local_part(global_batch(5, LOCAL_BATCH * world_size, False), rank, world_size)
    with _Wire() as wire:
        out = torch.cat([jt.values().flatten() for jt in sharded(kjt).values()])
        wire.phase = "backward"
        out.square().sum().backward()
    expected = torch.cat([jt.values().flatten() for jt in reference(kjt).values()])
    return wire.seen, (out.detach(), expected.detach())


@pytest.mark.parametrize(("fwd", "bwd"), [(FP16, BF16), (BF16, FP16)])
def test_sequence_dist_sends_the_precision_asked(run_ranks, fwd, bwd):
    wanted = {FP16: torch.float16, BF16: torch.bfloat16}
    for seen, (out, expected) in run_ranks(_ec_step, 2, fwd, bwd):
        assert seen == {"forward": {wanted[fwd]}, "backward": {wanted[bwd]}}, seen
        assert ((out - expected).abs() <= _eps(fwd) / 2 * expected.abs()).all()
        assert not torch.equal(out, expected)


class _ScaleCodec:
    """Not an elementwise cast shardkit runs (e.g. a user's own codec)."""

    quantized_dtype = torch.int8

    def __repr__(self) -> str:
        return "my int8 codec"


def _refused(rank, world_size, registry):
    ebc = EmbeddingBagCollection(tables=configs())
    plan = make_plan(ebc, "row_wise", world_size, world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    try:
        ShardedEmbeddingBagCollection(ebc, plan, env, qcomm_codecs_registry=registry)
    except ValueError as error:
        return str(error)
    return None


def test_codecs_shardkit_cannot_run_are_refused_naming_the_tables(run_ranks):
    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=FP16))
    custom = copy.copy(registry["POOLED_EMBEDDINGS_REDUCE_SCATTER"])
    custom.backward = _ScaleCodec()
    messages = run_ranks(_refused, 1, {**registry, "POOLED_EMBEDDINGS_REDUCE_SCATTER": custom})
    with pytest.raises(ValueError, match=r"qcomm_codecs_registry\['POOLED_EMBEDDINGS_REDUCE_"
                       r"SCATTER'\].backward of tables \['t0', 't1', 't2', 't3'\] is my int8 "
                       r"codec: shardkit's collectives run elementwise casts only.*use "
                       r"get_qcomm_codecs_registry"):  # fmt: skip
        raise ValueError(messages[0])
    messages = run_ranks(_refused, 1, {"ALL_TO_ALL": registry["POOLED_EMBEDDINGS_ALL_TO_ALL"]})
    with pytest.raises(ValueError, match=r"registry of tables \['t0', 't1', 't2', 't3'\] has "
                       r"key 'ALL_TO_ALL': the keys are CommOp names"):  # fmt: skip
        raise ValueError(messages[0])
