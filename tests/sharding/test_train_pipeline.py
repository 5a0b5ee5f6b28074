"""TrainPipelineSparseDist: the same training as a plain loop, with each batch's input dist
started one step ahead; ranks that run out of data at different times fail together."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

from shardkit.data import Batch
from shardkit.distributed import DistributedModelParallel
from shardkit.kernels._heap import _mallopt as _heap_mallopt
from shardkit.models import DLRMTrain
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.sharding import (
    DataExhaustedError,
    EvalPipelineSparseDist,
    InputError,
    ShardedEmbeddingBagCollection,
    SparseDataDistUtil,
    TrainPipelineBase,
    TrainPipelineSparseDist,
)
from shardkit.sharding._pipeline._schedule import choose_overlap
from shardkit.sparse import KeyedJaggedTensor
from shardkit.types import ShardingPlan
from tests.devices import ALL
from tests.sharding.common import dlrm, dlrm_batch, local_part, make_plan

B = 4


def _batches(rank: int, world_size: int, count: int):
    for step in range(count):
        dense, sparse, labels = dlrm_batch(step, B * world_size)
        mine = slice(rank * B, (rank + 1) * B)
        yield Batch(
            dense_features=dense[mine],
            sparse_features=local_part(sparse, rank, world_size),
            labels=labels[mine],
        )


def _steps_until_rank_1_runs_out(pipeline, batches) -> int:
    """The steps ``pipeline`` takes before every rank raises that rank 1's data ran out."""
    steps = 0
    with pytest.raises(DataExhaustedError, match=r"rank\(s\) \[1\] ran out of data after 3"):
        while True:
            pipeline.progress(batches)
            steps += 1
    return steps


def _pipelined_vs_plain(rank: int, world_size: int, overlap: bool | None, *, device=None):
    """The same DMP trained by a plain loop and by the pipeline, both on ``device`` (default
    CPU; batches come from the CPU, as from a data loader). Row-wise tables: their ids are
    bucketed in the input dist the pipeline runs ahead."""
    device = device or torch.device("cpu")
    torch.manual_seed(0)
    base = DLRMTrain(dlrm())
    ebc = base.model.sparse_arch.embedding_bag_collection
    plan = ShardingPlan(
        {"model.sparse_arch.embedding_bag_collection": make_plan(ebc, "row_wise", world_size, 2)}
    )
    runs = {}
    for mode in ("plain", "pipelined"):
        model = DistributedModelParallel(copy.deepcopy(base), device=device, plan=plan)
        optimizer = torch.optim.SGD(
            [p for n, p in model.named_parameters() if ".shards." not in n], lr=0.1
        )
        sharded = next(m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection))
        calls = []
        original = sharded.input_dist

        def record(features, original=original, calls=calls, **kwargs):
            import traceback

            calls.append(
                "prefetch"
                if any(f.name == "prefetch" for f in traceback.extract_stack())
                else "forward"
            )
            return original(features, **kwargs)

        sharded.input_dist = record
        step = optimizer.step

        def record_step(step=step, calls=calls):
            calls.append("step")
            return step()

        optimizer.step = record_step
        losses = []
        if mode == "plain":
            for batch in _batches(rank, world_size, 6):
                optimizer.zero_grad()
                loss, _ = model(batch.to(device))
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        else:
            pipeline = TrainPipelineSparseDist(model, optimizer, device, overlap=overlap)
            batches = _batches(rank, world_size, 6)
            while True:
                try:
                    loss, _, _ = pipeline.progress(batches)
                except StopIteration:
                    break
                losses.append(loss.item())
        state = {
            k: v.cpu()
            for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor) and not isinstance(v, ShardedTensor)
        }
        runs[mode] = (losses, state, calls)
    return runs


@pytest.mark.parametrize("device", ALL)
def test_pipeline_trains_like_a_plain_loop_with_input_dist_one_step_ahead(run_ranks, device):
    """Overlap forced on, on every device kind: every batch's ids are sent one step ahead."""
    for runs in run_ranks(_pipelined_vs_plain, 2, True, device=device):
        plain_losses, plain_state, plain_calls = runs["plain"]
        losses, state, calls = runs["pipelined"]
        assert losses == pytest.approx(plain_losses, abs=1e-6)
        for key in plain_state:
            torch.testing.assert_close(state[key], plain_state[key])
        assert plain_calls == ["forward", "step"] * 6
        # every batch's ids were sent ahead of its forward, during the previous batch's step
        assert calls == ["prefetch"] + ["prefetch", "step"] * 5 + ["step"]


@pytest.mark.parametrize("overlap", [None, False], ids=["default", "synchronous"])
def test_pipeline_trains_like_a_plain_loop(run_ranks, overlap):
    """By default the test's ranks use every core of their share for compute (cores / ranks
    threads each), so overlap cannot help and the pipeline runs synchronously: each input dist
    starts in its own step, just before its forward (after the previous batch's optimizer
    step, not during it), carrying the ranks' agreement on data ([Note: deferred agreement]);
    overlap=False forces that anywhere."""
    for runs in run_ranks(_pipelined_vs_plain, 2, overlap):
        plain_losses, plain_state, plain_calls = runs["plain"]
        losses, state, calls = runs["pipelined"]
        assert losses == pytest.approx(plain_losses, abs=1e-6)
        for key in plain_state:
            torch.testing.assert_close(state[key], plain_state[key])
        assert plain_calls == ["forward", "step"] * 6
        assert calls == ["prefetch", "step"] * 6, "each batch's ids were sent after the last step"


def _plain_step(model, optimizer, batch) -> float:
    optimizer.zero_grad()
    loss, _ = model(batch)
    loss.backward()
    optimizer.step()
    return loss.item()


def _detach_evaluate_attach(rank: int, world_size: int, overlap: bool):
    """A TorchRec user's loop: train 3 steps through the pipeline, ``detach()``, evaluate the
    model directly and take its state dict, ``attach(model)``, train on; beside a plain loop
    that evaluates between the same steps."""
    torch.manual_seed(0)
    base = DLRMTrain(dlrm())
    ebc = base.model.sparse_arch.embedding_bag_collection
    plan = ShardingPlan(
        {"model.sparse_arch.embedding_bag_collection": make_plan(ebc, "row_wise", world_size, 2)}
    )
    evaluation = list(_batches(rank, world_size, 8))[6:]  # batches the training never sees
    runs = {}
    for mode in ("plain", "pipelined"):
        model = DistributedModelParallel(copy.deepcopy(base), plan=plan)
        optimizer = torch.optim.SGD(
            [p for n, p in model.named_parameters() if ".shards." not in n], lr=0.1
        )
        sharded = next(m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection))
        dists = []

        def counted(kjt, original=sharded.input_dist, dists=dists, **kw):
            dists.append(1)
            return original(kjt, **kw)

        sharded.input_dist = counted
        train = _batches(rank, world_size, 6)
        if mode == "plain":
            losses = [_plain_step(model, optimizer, next(train)) for _ in range(3)]
            evaluated, own_forward = model, True
        else:
            pipeline = TrainPipelineSparseDist(model, optimizer, overlap=overlap)
            losses = [pipeline.progress(train)[0].item() for _ in range(3)]
            evaluated = pipeline.detach()
            own_forward = "forward" not in vars(sharded)  # the class's, not the pipeline's
        evaluated.eval()
        with torch.no_grad():
            logits = [evaluated(batch)[1][1] for batch in evaluation]
        evaluated.train()
        saved = _weights(evaluated)
        if mode == "plain":
            losses += [_plain_step(model, optimizer, batch) for batch in train]
            losses += [_plain_step(model, optimizer, batch) for batch in evaluation]  # epoch 2
        else:
            with pytest.raises(ValueError, match=r"attach\(model\): a DLRMTrain other than the model this pipeline was built with"):  # fmt: skip
                pipeline.attach(base)
            pipeline.attach(evaluated)
            own_forward = own_forward and "forward" in vars(sharded)  # the pipeline's again
            with pytest.raises(StopIteration):
                while True:
                    losses.append(pipeline.progress(train)[0].item())
            with pytest.raises(StopIteration):  # the spent iterator stays spent ...
                pipeline.progress(train)
            second = iter(evaluation)  # ... and a new one is a new epoch, as in TorchRec
            with pytest.raises(StopIteration):
                while True:
                    losses.append(pipeline.progress(second)[0].item())
        runs[mode] = losses, logits, saved, _weights(model), len(dists), own_forward
    return runs


def _weights(model) -> dict[str, torch.Tensor]:
    """The model's weights, this rank's shards of each sharded table as one tensor."""
    out = {}
    for key, value in model.state_dict().items():
        if isinstance(value, ShardedTensor):
            value = torch.cat([shard.tensor.flatten() for shard in value.local_shards()])
        if key.endswith(".weight"):
            out[key] = value.detach().clone()
    return out


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "synchronous"])
def test_detach_evaluate_attach_trains_like_a_plain_loop(run_ranks, overlap):
    """TorchRec 1.8's ``detach()``/``attach()``: the detached model runs its collections' own
    forwards (its evaluation, state dict and later training match the plain loop's), and the
    batch in flight at ``detach`` resumes: one input dist per batch, trained or evaluated; after
    StopIteration a new iterator trains a second epoch."""
    for runs in run_ranks(_detach_evaluate_attach, 2, overlap):
        plain, pipelined = runs["plain"], runs["pipelined"]
        assert pipelined[0] == pytest.approx(plain[0], abs=1e-6) and len(plain[0]) == 8
        torch.testing.assert_close(pipelined[1], plain[1])
        torch.testing.assert_close(pipelined[2], plain[2])
        torch.testing.assert_close(pipelined[3], plain[3])
        assert pipelined[4:] == (10, True) and plain[4] == 10


def test_overlap_is_chosen_where_a_core_is_free_for_the_transfer():
    cpu = torch.device("cpu")
    on_two_cores = choose_overlap(cpu, cores=2, local_ranks=2, threads=1)
    assert on_two_cores == (
        False,
        "2 core(s) for 2 rank(s) of 1 thread(s): 0 spare core(s) per rank for the transfer",
    )
    assert choose_overlap(cpu, cores=16, local_ranks=2, threads=4)[0]
    assert not choose_overlap(cpu, cores=16, local_ranks=2, threads=8)[0]
    assert not choose_overlap(cpu, cores=1, local_ranks=2, threads=1)[0]
    assert choose_overlap(torch.device("cuda"), cores=2, local_ranks=2, threads=1) == (
        True,
        "cuda: collectives run beside the computation",
    )


def _uneven_data(rank: int, world_size: int, overlap: bool | None, base: bool = False):
    torch.manual_seed(0)
    model = DistributedModelParallel(DLRMTrain(dlrm()))
    optimizer = torch.optim.SGD(
        [p for n, p in model.named_parameters() if ".shards." not in n], lr=0.1
    )
    if base:
        pipeline = TrainPipelineBase(model, optimizer)
    else:
        pipeline = TrainPipelineSparseDist(model, optimizer, overlap=overlap)
    batches = _batches(rank, world_size, 3 if rank == 1 else 5)
    steps = 0
    with pytest.raises(DataExhaustedError) as info:
        while True:
            pipeline.progress(batches)
            steps += 1
    return steps, str(info.value)


@pytest.mark.parametrize(
    ("overlap", "base", "expected_steps"),
    [
        (True, False, 2),  # the fourth batch's input dist would start with the third's step
        (False, False, 3),  # agreed beside the third step: it runs, then every rank stops
        (None, True, 3),
    ],
)
def test_a_rank_that_runs_out_of_data_first_stops_every_rank(
    run_ranks, overlap, base, expected_steps
):
    for steps, message in run_ranks(_uneven_data, 2, overlap, base):
        assert steps == expected_steps
        assert "rank(s) [1] ran out of data after 3 batch(es) while the others have more" in message


def _even_data(rank: int, world_size: int, overlap: bool):
    """Every rank runs out at once: StopIteration on all, after every batch, and again after."""
    model = DistributedModelParallel(DLRMTrain(dlrm()))
    pipeline = TrainPipelineSparseDist(
        model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=overlap
    )
    batches = _batches(rank, world_size, 3)
    steps = 0
    with pytest.raises(StopIteration):
        while True:
            pipeline.progress(batches)
            steps += 1
    with pytest.raises(StopIteration):
        pipeline.progress(batches)
    return steps


@pytest.mark.parametrize("overlap", [True, False])
def test_ranks_that_run_out_together_stop_together(run_ranks, overlap):
    assert run_ranks(_even_data, 2, overlap) == [3, 3]


def _heap_kept_by(rank: int, world_size: int) -> tuple[bool | None, ...]:
    """Whether building a DMP on the CPU, then each pipeline over it, fixed glibc's heap
    thresholds (each asked afresh; [Note: a steady heap] in `shardkit.kernels._heap`)."""
    from shardkit.kernels import _heap

    _heap._state = None
    model = DistributedModelParallel(DLRMTrain(dlrm()))
    by_dmp, _heap._state = _heap._state, None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    TrainPipelineBase(model, optimizer)
    by_base, _heap._state = _heap._state, None
    TrainPipelineSparseDist(model, optimizer, overlap=False)
    return by_dmp, by_base, _heap._state


@pytest.mark.skipif(_heap_mallopt() is None, reason="the C library is not glibc")
def test_a_cpu_model_and_its_pipelines_keep_a_steps_memory_mapped(run_ranks):
    """Without it, glibc trimmed 8-12 MiB a step on some ranks: the pipeline's steps faulted
    that memory in again and ran slower than a plain loop (issue 25)."""
    assert run_ranks(_heap_kept_by, 2) == [(True, True, True)] * 2


class _Dense(torch.nn.Module):
    """A model without sharded collections: the ranks agree on data by flags."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, batch: torch.Tensor):
        losses = self.linear(batch).sum(0)
        return losses, losses.detach()


def _uneven_dense(rank: int, world_size: int, carried: bool, overlap: bool = False):
    torch.manual_seed(0)
    if carried:  # a sharded model fed KJTs it builds itself: falls back to the flags
        model = DistributedModelParallel(DLRMTrain(dlrm()))
        batches = (_rebuilt(b) for b in _batches(rank, world_size, 3 if rank == 1 else 5))
    else:
        model = _Dense()
        batches = iter([torch.ones(3, 2)] * (3 if rank == 1 else 5))
    pipeline = TrainPipelineSparseDist(
        model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=overlap
    )
    prefetches, lead = [], pipeline._lead
    if pipeline._lead is not None:
        queue = pipeline._prefetches.of(pipeline._lead)
        original = queue.prefetch
        queue.prefetch = lambda kjt, **kw: (prefetches.append(kjt), original(kjt, **kw))
    steps = _steps_until_rank_1_runs_out(pipeline, batches)
    left = 0 if lead is None else pipeline._prefetches.of(lead).unused_prefetches()  # dropped
    return steps, pipeline._lead is None, len(prefetches), left


def _rebuilt(batch: Batch) -> Batch:
    """``batch`` whose KJT the model's forward gets as a copy (a new object each time)."""

    class Copying(Batch):
        def __getattribute__(self, name):
            value = object.__getattribute__(self, name)
            return copy.copy(value) if name == "sparse_features" else value

    return Copying(batch.dense_features, batch.sparse_features, batch.labels)


@pytest.mark.parametrize(
    ("carried", "overlap", "expected"),
    [
        (False, False, (3, True, 0, 0)),
        (True, False, (3, True, 1, 0)),  # the second, fetched before the check: a header
        (True, True, (2, True, 2, 0)),  # prefetched for the first two batches, then no more
    ],
    ids=["dense", "rebuilt_kjt", "rebuilt_kjt_overlap"],
)
def test_ranks_agree_by_flags_without_a_collection_fed_the_batch(
    run_ranks, carried, overlap, expected
):
    """Pure dense models, and models whose collections are fed another KJT than the batch's,
    agree by an all-gather (see [Note: deferred agreement]): the step after the data ends
    on rank 1 raises on every rank. Overlapping, the prefetches no forward used stop after
    the first step ([Note: prefetches no forward uses])."""
    assert run_ranks(_uneven_dense, 2, carried, overlap) == [expected, expected]


def _uneven_subgroups(rank: int, world_size: int):
    """Each rank's DMP is sharded over a group of its own, so its input dist's header reaches
    no other rank: the pipeline must agree by flags through the world."""
    import torch.distributed as dist

    from shardkit.types import ShardingEnv

    groups = [dist.new_group([r]) for r in range(world_size)]
    torch.manual_seed(0)
    env = ShardingEnv.from_process_group(groups[rank])
    model = DistributedModelParallel(DLRMTrain(dlrm()), env=env, local_world_size=1)
    pipeline = TrainPipelineSparseDist(
        model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=False
    )
    batches = _batches(rank, world_size, 3 if rank == 1 else 5)
    return _steps_until_rank_1_runs_out(pipeline, batches), pipeline._lead is None


def test_ranks_agree_by_flags_when_the_collection_spans_a_subgroup(run_ranks):
    assert run_ranks(_uneven_subgroups, 2) == [(3, True), (3, True)]


class _TwoCollections(torch.nn.Module):
    """The first collection (the lead) fed a KJT the forward builds, the second the batch's;
    or (``builds_lead=False``) the lead fed the batch's KJT, the second a copy of it."""

    def __init__(self, builds_lead: bool = True) -> None:
        super().__init__()
        self.builds_lead = builds_lead
        self.first = EmbeddingBagCollection(tables=[_table("t0", ["a"])])
        # another header size than the lead's: a mismatched first collective aborts on gloo
        self.second = EmbeddingBagCollection(tables=[_table("t1", ["b", "c"]), _table("t2", ["d"])])

    def forward(self, batch: KeyedJaggedTensor):
        if self.builds_lead:
            own = KeyedJaggedTensor(
                keys=["a"], values=batch.values()[:2] % 10, lengths=torch.tensor([1, 1])
            )
            loss = self.first(own).values().sum() + self.second(batch).values().sum()
        else:
            loss = self.first(batch).values().sum() + self.second(copy.copy(batch)).values().sum()
        return loss.reshape(1), loss.detach()


def _table(name: str, features: list[str]) -> EmbeddingBagConfig:
    return EmbeddingBagConfig(name=name, embedding_dim=2, num_embeddings=10, feature_names=features)


class _TwoInputs(torch.nn.Module):
    """The lead read from ``batch["x"]``, the second collection from ``batch["y"]``."""

    def __init__(self) -> None:
        super().__init__()
        self.first = EmbeddingBagCollection(tables=[_table("t0", ["a"])])
        self.second = EmbeddingBagCollection(tables=[_table("t1", ["b"])])
        self.copy_second = False  # feed the second a copy: its prefetches go unused

    def forward(self, batch: dict[str, KeyedJaggedTensor]):
        second = copy.copy(batch["y"]) if self.copy_second else batch["y"]
        loss = self.first(batch["x"]).values().sum() + self.second(second).values().sum()
        return loss.reshape(1), loss.detach()


def _fed_differently(rank: int, world_size: int, overlap: bool):
    """Rank 1 has no batch at all: its first collective, the lead's header exchange, must be
    every rank's first collective too, before the second collection's input dist. Then rank
    1's batches do not feed the second collection: overlapping, rank 0 alone would start its
    input dist ([Note: prefetch mask]); synchronous, the second's forward refuses rank 1's."""
    torch.manual_seed(0)
    model = DistributedModelParallel(_TwoCollections())
    pipeline = TrainPipelineSparseDist(
        model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=overlap
    )
    kjt = KeyedJaggedTensor(
        keys=["b", "c", "d"], values=torch.arange(6), lengths=torch.ones(6, dtype=torch.int64)
    )
    batches = iter([kjt] * (0 if rank == 1 else 3))
    with pytest.raises(DataExhaustedError, match=r"rank\(s\) \[1\] ran out of data after 0"):
        pipeline.progress(batches)
    model = DistributedModelParallel(_TwoInputs())
    pipeline = TrainPipelineSparseDist(
        model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=overlap
    )
    ones = torch.ones(2, dtype=torch.int64)
    x = KeyedJaggedTensor(keys=["a"], values=torch.arange(2), lengths=ones)
    y = KeyedJaggedTensor(keys=["b"] if rank == 0 else ["c"], values=torch.arange(2), lengths=ones)
    if not overlap:
        with pytest.raises(InputError, match=r"rank\(s\) \[1\] refused|lacks the module's"):
            pipeline.progress(iter([{"x": x, "y": y}] * 3))
        return
    first, second = "_dmp_wrapped_module.first", "_dmp_wrapped_module.second"
    per_rank = re.escape(str({0: [second], 1: []}))
    with pytest.raises(InputError, match=rf"other sharded collections: {per_rank} \(rank"):
        pipeline.progress(iter([{"x": x, "y": y}] * 3))
    # no lead (the ranks agree through a group given): the mask rides the flags instead
    pipeline = TrainPipelineSparseDist(
        model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=True, group=dist.group.WORLD
    )
    per_rank = re.escape(str({0: [first, second], 1: [first]}))
    with pytest.raises(InputError, match=rf"{per_rank} .* or run it with overlap=False"):
        pipeline.progress(iter([{"x": x, "y": y}] * 3))
    _used_before_and_fed_twice(rank, x)
    _both_used_then_one_rank_unused(rank, x)


def _used_before_and_fed_twice(rank: int, x: KeyedJaggedTensor) -> None:
    """The second collection used a prefetch before this pipeline (`SparseDataDistUtil`), then is
    fed copies: the pipeline still finds its prefetches unused and drops them, on both ranks.
    Rank 1's batches hold its features twice: one input dist per collection all the same."""
    model = DistributedModelParallel(_TwoInputs())
    y = KeyedJaggedTensor(keys=["b"], values=torch.arange(2), lengths=torch.ones(2).long())
    staged = SparseDataDistUtil(model)
    staged.start_sparse_data_dist({"x": x, "y": y})
    model({"x": x, "y": y})
    assert [staged._prefetches.of(m).consumed_prefetches() for m in staged._collections] == [1, 1]
    model.module.copy_second = True
    pipeline = TrainPipelineSparseDist(
        model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=True
    )
    batch = {"x": x, "y": y, **({"z": copy.copy(y)} if rank == 1 else {})}
    batches = iter([batch] * 3)
    with pytest.raises(StopIteration):
        for _ in range(4):
            pipeline.progress(batches)
    assert [pipeline._names[pipeline._collections.index(m)] for m in pipeline._kept] == []
    assert pipeline._prefetches.of(model.module.second).unused_prefetches() == 0
    evaluation = EvalPipelineSparseDist(model, torch.optim.SGD(model.parameters(), lr=0.1))
    evaluation._overlap = True  # as where a core is free (see [Note: when the pipeline overlaps])
    batches = iter([batch] * 3)
    with pytest.raises(StopIteration):
        for _ in range(4):
            evaluation.progress(batches)
    second = evaluation._prefetches.of(model.module.second)
    assert evaluation._kept == [] and second.unused_prefetches() == 0


@pytest.mark.parametrize("overlap", [False, True], ids=["synchronous", "overlap"])
def test_ranks_whose_batches_feed_other_collections_stop_together(run_ranks, overlap):
    run_ranks(_fed_differently, 2, overlap)


def _second_fed_a_copy(rank: int, world_size: int):
    """Synchronous: only the lead's input dist starts before the forward; the second
    collection, fed another KJT than the batch's, runs its own in its forward."""
    model = DistributedModelParallel(_TwoCollections(builds_lead=False))
    pipeline = TrainPipelineSparseDist(
        model, torch.optim.SGD(model.parameters(), lr=0.1), overlap=False
    )
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c", "d"], values=torch.arange(8), lengths=torch.ones(8, dtype=torch.int64)
    )
    batches = iter([kjt] * 3)
    with pytest.raises(StopIteration):
        while True:
            pipeline.progress(batches)
    return pipeline._prefetches.of(
        model.module.second
    ).unused_prefetches(), pipeline._lead is not None


def test_a_synchronous_pipeline_starts_no_input_dist_a_forward_does_not_use(run_ranks):
    assert run_ranks(_second_fed_a_copy, 2) == [(0, True), (0, True)]


def _lead_unused_on_one_rank(rank: int, world_size: int):
    """Rank 1 alone finds the lead's prefetched input unused after the first step: every rank
    falls back to the flags at once (one rank alone would leave the others in the lead's
    header exchange), and the data ending early on rank 1 still stops every rank."""
    torch.manual_seed(0)
    model = DistributedModelParallel(DLRMTrain(dlrm()))
    pipeline = TrainPipelineBase(model, torch.optim.SGD(model.parameters(), lr=0.1))
    if rank == 1:
        pipeline._prefetches.of(pipeline._lead).unused_prefetches = lambda: 1
    batches = _batches(rank, world_size, 3 if rank == 1 else 5)
    return _steps_until_rank_1_runs_out(pipeline, batches), pipeline._lead is None


def test_the_ranks_agree_on_falling_back_to_flags(run_ranks):
    assert run_ranks(_lead_unused_on_one_rank, 2) == [(3, True), (3, True)]


def test_headers_without_input_decide_the_same_on_every_rank():
    """What every rank concludes from the statuses in the headers ([Note: input exchange])."""
    from shardkit.sharding._dist._header import (
        EXHAUSTED,
        NO_INPUT,
        OK,
        InputError,
        RanksExhaustedError,
        TagMismatchError,
        check_headers,
    )

    with pytest.raises(RanksExhaustedError, match=r"rank\(s\) \[1\] have no batch left") as info:
        check_headers([[4, OK, 1], [0, EXHAUSTED, 0], [4, NO_INPUT, 1]], error=None)
    assert info.value.ranks == [1]
    check_headers([[0, EXHAUSTED, 0], [0, EXHAUSTED, 0]], error=None)  # all ran out: stop quietly
    check_headers([[0, NO_INPUT, 3], [0, NO_INPUT, 3]], error=None)  # no input anywhere: agreed
    with pytest.raises(InputError, match=r"rank\(s\) \[0\] fed no input to this sharded"):
        check_headers([[0, NO_INPUT, 0], [4, OK, 0]], error=None)
    with pytest.raises(
        TagMismatchError,
        match=r"other tags in their input-dist headers: \[2, 0\] .* same tag= to input_dist",
    ) as tags:
        check_headers([[0, NO_INPUT, 2], [0, NO_INPUT, 0]], error=None)  # header alone too
    assert tags.value.tags == [2, 0]


def _both_used_then_one_rank_unused(rank: int, x: KeyedJaggedTensor) -> None:
    """Both collections prefetched (the same non-zero mask on every rank): trains as a plain
    loop. Then rank 1 alone finds the second's prefetch unused: both ranks drop it at once."""
    y = KeyedJaggedTensor(keys=["b"], values=torch.arange(2) + rank, lengths=torch.ones(2).long())
    losses, tags = {}, []
    for mode in ("plain", "pipelined"):
        torch.manual_seed(0)
        model = DistributedModelParallel(_TwoInputs())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if mode == "plain":
            for _ in range(3):
                optimizer.zero_grad()
                loss, _ = model({"x": x, "y": y})
                loss.sum().backward()
                optimizer.step()
            losses[mode] = [model({"x": x, "y": y})[1]]
            continue
        pipeline = TrainPipelineSparseDist(model, optimizer, overlap=True)
        first = pipeline._prefetches.of(model.module.first)
        first.prefetch = lambda kjt, tag, prefetch=first.prefetch: (
            tags.append(tag),
            prefetch(kjt, tag=tag),
        )
        batches = iter([{"x": x, "y": y}] * 4)
        losses[mode] = [pipeline.progress(batches) for _ in range(4)][-1:]
        second = pipeline._prefetches.of(model.module.second)
        assert len(pipeline._kept) == 1 and second.unused_prefetches() == 0
    torch.testing.assert_close(losses["pipelined"], losses["plain"])
    assert tags == [2] * 4  # bit 1: the second collection, the lead being the 0th
    pipeline = TrainPipelineSparseDist(model, optimizer, overlap=True)
    second = pipeline._prefetches.of(model.module.second)
    if rank == 1:
        second.consumed_prefetches = lambda: 7  # no use counted on rank 1
    batches = iter([{"x": x, "y": y}] * 3)
    with pytest.raises(StopIteration):
        for _ in range(4):
            pipeline.progress(batches)
    assert pipeline._kept == [] and second.unused_prefetches() == 0
