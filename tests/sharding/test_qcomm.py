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
    get_qcomm_codecs,
    get_qcomm_codecs_registry,
)
from shardkit.optim import EmbOptimType
from shardkit.sharding import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingCollection,
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from shardkit.types import ShardingEnv
from tests.sharding.common import configs, global_batch, local_part, make_plan

LOCAL_BATCH = 4
LR = 0.5
WIRE_OPS = ("all_to_all_single", "reduce_scatter_tensor", "all_gather_into_tensor")
FP16, BF16, FP8, INT8 = CommType.FP16, CommType.BF16, CommType.FP8, CommType.INT8
# what each precision puts on the wire, forward and backward (FP8: 1-4-3 and 1-5-2 row-wise)
WIRE = {FP16: torch.float16, BF16: torch.bfloat16, FP8: torch.uint8, INT8: torch.uint8}


class _Wire:
    """Records the dtype of every floating-point or byte tensor shardkit.comm sends, per phase,
    and the width of the byte rows."""

    def __init__(self) -> None:
        self.phase = "forward"
        self.seen: dict[str, set[torch.dtype]] = {"forward": set(), "backward": set()}
        self.byte_widths: set[int] = set()
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
            if x.is_floating_point() or x.dtype == torch.uint8:
                self.seen[self.phase].add(x.dtype)
            if x.dtype == torch.uint8:
                self.byte_widths.add(x.shape[1])
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
    magnitude = bound_module(kjt)  # sums of |w|: bound the partial sums that are rounded
    widths = magnitude.length_per_key()
    magnitude = magnitude.values()[mine]
    uses = functools.partial(_uses, reference, kjt, world_size=world_size)
    step_bound = {  # under |gradient|, and under each row's largest |gradient| (row-wise codecs)
        n: (LR * g, LR * g_row)
        for (n, g), g_row in zip(uses(grad.abs()).items(), uses(_row_max(grad, widths)).values())
    }
    forward = (out.detach(), expected[mine].detach(), magnitude.detach(), widths)
    shard_widths = {md.shard_sizes[1] for ps in plan.values() for md in ps.sharding_spec.shards}
    return (
        (wire.seen, wire.byte_widths, shard_widths),
        forward,
        _weights(sharded, reference, before, step_bound),
    )


def _row_max(x: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """Each feature's block of ``x`` ``[B, sum(widths)]`` filled with its row's largest |x|:
    every row a collective sends is part of one feature's block (a column shard, or all of it)."""
    blocks = torch.split(x.abs(), widths, dim=1)
    return torch.cat([b.amax(1, keepdim=True).expand_as(b) for b in blocks], dim=1)


def _uses(reference, kjt, weight, *, world_size) -> dict[str, torch.Tensor]:
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
            bounds = tuple(b[rows, cols].clone() for b in step_bound[key])
            out.append((name, param.detach().clone(), full[rows, cols].clone(), bounds))
    return out


def _rounding(precision: CommType, direction: str) -> tuple[float, float]:
    """``(relative, of the row's largest magnitude)``: what one pass through the wire may move
    a value ``x`` of a row whose largest |value| is ``m`` by is ``relative * |x| + of_row * m``.

    FP16/BF16 round each value to nearest: half an ulp.
    INT8 splits the row's range (at most ``2m``) into 255 steps and rounds to the nearest: half
    a step, ``m / 255``. FP8 scales the row so ``m`` is the format's largest value ``F`` and
    rounds to nearest: half an ulp for normal numbers, half the subnormal spacing (``eps *
    smallest normal``) below them, in units of ``m / F``. 1-4-3 forward, 1-5-2 backward.
    """
    if precision in (FP16, BF16):
        return torch.finfo(WIRE[precision]).eps / 2, 0.0
    if precision == INT8:
        return 0.0, 1 / 255
    info = torch.finfo(torch.float8_e4m3fn if direction == "forward" else torch.float8_e5m2)
    return info.eps / 2, info.eps / 2 * info.smallest_normal / info.max


SUMMED = ("row_wise", "table_row_wise", "grid_shard")


def _check(results, world_size, kind, fwd, bwd) -> None:
    rel, of_row = _rounding(fwd, "forward")
    bwd_rel, bwd_of_row = _rounding(bwd, "backward")
    bwd_rel *= 2 if bwd in (FP16, BF16) else 1  # the casts keep a whole eps, as they did
    # each rank's partial sums are rounded once and W of them are summed (a cast's reduce-
    # scatter adds them in the wire dtype: one more rounding each, so W * eps in all)
    parts = 2 * world_size if fwd in (FP16, BF16) else world_size if kind in SUMMED else 1
    rounded = False
    row_bytes = {INT8: 8, FP8: 4}  # the row's scale (and bias) as float32 bytes
    for (seen, byte_widths, shard_widths), (out, expected, magnitude, widths), weights in results:
        assert seen == {"forward": {WIRE[fwd]}, "backward": {WIRE[bwd]}}, seen
        # a byte row is a shard's row of values, one byte each, and its float32 parameters
        wanted = {w + row_bytes[p] for p in (fwd, bwd) if p in row_bytes for w in shard_widths}
        assert byte_widths <= wanted and bool(byte_widths) == bool(wanted), (byte_widths, wanted)
        bound = parts * (rel * magnitude + of_row * _row_max(magnitude, widths)) + 1e-6
        assert ((out - expected).abs() <= bound).all(), ((out - expected).abs() - bound).max()
        rounded |= not torch.equal(out, expected)
        for name, mine, theirs, (by_value, by_row) in weights:
            error = (mine - theirs).abs()
            step = bwd_rel * by_value + bwd_of_row * by_row + 1e-6
            assert (error <= step).all(), (name, (error - step).max())
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
        (2, "table_wise", FP8, INT8, 2),
        (2, "row_wise", INT8, FP8, 2),
        (3, "column_wise", INT8, INT8, 3),
        (3, "table_row_wise", FP8, FP8, 1),
    ],
)
def test_pooled_dists_send_the_precision_asked_and_stay_within_its_rounding(
    run_ranks, world_size, kind, fwd, bwd, local_size
):
    results = run_ranks(_ebc_step, world_size, kind, fwd, bwd, local_size,
                        local_world_size=local_size)  # fmt: skip
    _check(results, world_size, kind, fwd, bwd)


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
        out = [jt.values() for jt in sharded(kjt).values()]  # [N_f, D_f] per feature
        wire.phase = "backward"
        sum(o.square().sum() for o in out).backward()
    expected = [jt.values().detach() for jt in reference(kjt).values()]
    return wire.seen, ([o.detach() for o in out], expected)


@pytest.mark.parametrize(("fwd", "bwd"), [(FP16, BF16), (BF16, FP16), (FP8, INT8)])
def test_sequence_dist_sends_the_precision_asked(run_ranks, fwd, bwd):
    rel, of_row = _rounding(fwd, "forward")
    for seen, (out, expected) in run_ranks(_ec_step, 2, fwd, bwd):
        assert seen == {"forward": {WIRE[fwd]}, "backward": {WIRE[bwd]}}, seen
        for got, rows in zip(out, expected):  # each id's row comes back alone: rounded once
            bound = rel * rows.abs() + of_row * rows.abs().amax(1, keepdim=True) + 1e-7
            assert ((got - rows).abs() <= bound).all(), ((got - rows).abs() - bound).max()
        assert not all(torch.equal(a, b) for a, b in zip(out, expected))


@pytest.mark.parametrize(
    ("precision", "direction", "wire_dtype", "row_bytes"),
    [(INT8, "forward", None, 8), (FP8, "forward", torch.float8_e4m3fn, 4),
     (FP8, "backward", torch.float8_e5m2, 4)],
)  # fmt: skip
def test_row_wise_codecs_pack_each_rows_scale_into_its_bytes(
    precision, direction, wire_dtype, row_bytes
):
    codecs = get_qcomm_codecs(QCommsConfig(forward_precision=precision,
                                           backward_precision=precision))  # fmt: skip
    codec = getattr(codecs, direction)
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 5, generator=gen) * torch.tensor([[1e-3], [1.0], [1e3], [1], [1], [1]])
    rows[3] = 0.0  # a row of zeros: a scale of 1, not a division by zero
    rows[4, 2] = 1e-9  # far below the row's largest: the format's subnormals
    rows[5] = torch.tensor([-7.0, 7.0, 7.0, 3.5, -7.0])  # the largest values land on F itself
    wire = codec.encode(rows)
    assert wire.dtype == torch.uint8 and wire.shape == (6, 5 + row_bytes)
    assert codec.calc_quantized_size(5) == 5 + row_bytes
    if wire_dtype is not None:  # the values are the format's bytes
        scale = wire[:, 5:].clone().view(torch.float32)
        torch.testing.assert_close(wire[:, :5].clone().view(wire_dtype).float() * scale,
                                   codec.decode(wire), rtol=0, atol=0)  # fmt: skip
    back = codec.decode(wire)
    rel, of_row = _rounding(precision, direction)
    bound = rel * rows.abs() + of_row * rows.abs().amax(1, keepdim=True) * (1 + 1e-6)
    assert ((back - rows).abs() <= bound).all(), ((back - rows).abs() - bound).max()
    assert torch.isfinite(back).all() and torch.equal(back[3], rows[3])
    rows[1, 2], rows[2, 0] = float("nan"), float("inf")  # never back as finite numbers
    assert not torch.isfinite(codec.decode(codec.encode(rows))[1:3]).any()
    with pytest.raises(ValueError, match=r"encode \[rows, width\] tensors; got shape \(30,\)"):
        codec.encode(rows.flatten())


def test_mx4_is_refused_by_name():
    with pytest.raises(ValueError, match=r"backward_precision=MX4: MX4 comms are an FBGEMM "
                       r"kernel.*use CommType.INT8 or CommType.FP8"):  # fmt: skip
        get_qcomm_codecs(QCommsConfig(backward_precision=CommType.MX4))


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
                       r"codec: shardkit's collectives run elementwise casts .* and its INT8/FP8 row-wise "
                       r"codecs only; use "
                       r"get_qcomm_codecs_registry"):  # fmt: skip
        raise ValueError(messages[0])
    messages = run_ranks(_refused, 1, {"ALL_TO_ALL": registry["POOLED_EMBEDDINGS_ALL_TO_ALL"]})
    with pytest.raises(ValueError, match=r"registry of tables \['t0', 't1', 't2', 't3'\] has "
                       r"key 'ALL_TO_ALL': the keys are CommOp names"):  # fmt: skip
        raise ValueError(messages[0])
