"""Step time of a plan on a calibrated machine: per rank, split into what it waits on, and for
the whole job (`predict_step`).

[Note: step-time model]
A training step of a sharded model is a sequence of phases, and every collective is a point
where all ranks wait for the slowest (bulk-synchronous). In order:

1. input distribution: the ids' all-to-all (a header, then lengths and ids; per-id weights when
   a table is weighted); a rank sends its batch's ids to every column block of every table and
   receives the ids of the shards it holds (with only data-parallel tables the header and an
   empty exchange still run: every batch is checked); the ids of row-split tables (row-,
   table-row-wise, grid) are first grouped by the shard holding their row, at the profile's
   ``bucket_ms_per_id`` (issue 29: 1.6-2.5 ms of CPU a step per rank for 113-164 K ids at 4
   ranks, which the model did not have);
2. embedding forward: per rank, one kernel call per shard group (same route, columns,
   optimizer; see [Note: kernel groups and output classes] in the sharded modules), timed by
   the profile's `KernelFit` (see [Note: calibrated kernel model]);
3. output distribution forward, one collective per output class (route, columns) that exists
   anywhere: all-to-all for table-, column- and table-column-wise, reduce-scatter for row-wise,
   reduce-scatter in the host then all-to-all across hosts for table-row-wise and grid;
4. the dense part, forward and backward: ``3 x flops`` (backward twice forward) at the
   profile's matmul throughput, and its optimizer step (``28`` bytes per parameter: Adam reads
   parameter, gradient and two moments and writes three) at its memory bandwidth;
5. output distribution backward: each class's adjoint (all-to-all back; all-gather for
   reduce-scatter); data-parallel tables with the FUSED kernel all-gather every rank's ids and
   output gradients instead, after an all-gather of the id counts in forward (see
   [Note: sparse data-parallel tables]);
6. embedding backward with the fused update, per group; data-parallel FUSED replicas run it
   over the global batch;
7. the dense all-reduce (DDP; DENSE data-parallel tables add their whole gradient to it, and a
   dense update of ``9.22`` passes over their bytes, TorchRec's factor).

The job's step is the sum over phases of the slowest rank in each (phases 2 and 6 per rank,
collectives at the slowest participant's size), plus the profile's ``step_overhead`` for the
batch's features, bags and pooled values (the modules' own Python, autograd and copies,
measured on one rank). One rank alone still calls its collectives (copies of its own bytes):
they take what calibration measured at world size 1.
A rank's own line adds its compute and the collectives it joins; the slowest rank is the one
whose compute is largest. CPU ranks that share cores compute slower and their collectives wait
(see [Note: oversubscribed cores]). With the train pipeline, the input distribution of
the next batch runs during this one: hidden entirely on GPUs, and on CPUs only as far as cores
are left over for the backend's threads.

Large step buffers on CPUs add their page faults (see [Note: fresh pages]).

Not modelled: the overlap of DDP's all-reduce with backward, stragglers and noise, the memory
bandwidth other ranks of the host take from a rank's dense layers (their kernels': see
[Note: ranks computing at once]), skewed ids (see
[Note: calibrated kernel model]), compressed (qcomm) collectives.

[Note: oversubscribed cores]
A CPU host whose ranks x threads exceed its cores (4 ranks of 1 thread on 2 cores) runs them
time-shared: ``s = ranks x threads / cores`` ranks take turns on each core. The profile records
the cores and threads per rank it was calibrated with, and the model charges two things for it:

1. compute runs in turns: every rank's dense layers, optimizer step and step overhead take
   ``s`` times what calibration measured for one rank alone; the kernels, whose work differs
   between ranks, take what the host's cores need for all of it: per host the most of its
   slowest rank's own kernels and all its ranks' kernels over its cores (``threads / cores``
   of the sum), per phase (forward, backward). That is ``s`` times the slowest rank when
   the ranks' work is even; when it is not, the ranks done early wait in the next
   collective and leave their cores to the others (issue 29, skewed tables table-wise at 4
   ranks on 2 cores: the busiest rank's kernels took 17.0 ms of CPU a step, the others
   11.9, 7.2 and 5.3: 20.7 ms over the 2 cores, not 2 x 17.0);
2. every collective of the step waits for scheduling: its ranks are not all running when it
   starts (the others are still computing, or another rank holds their core), so a message
   waits until its receiver gets a core: ``switch_wait_ms x (s - 1)`` per collective call,
   the profile's ``switch_wait_ms`` measured by calibration when it spawns more ranks than
   cores (a loop of compute bursts and small collectives, minus the bursts and the
   collectives timed apart; see ``shardkit.bench._links.scheduling_wait``).

The collectives' own bytes and latencies are the calibrated fits at that world size, which
calibration measured with the same ranks sharing the same cores (a size it did not measure
extrapolates from the nearest, as on any host). ``s`` is 1 on GPUs and where every rank has
cores of its own, so nothing here changes their predictions; the simulation gives every rank
cores of its own (see [Note: simulated scaling]).

[Note: ranks computing at once]
Ranks of one CPU host that each have cores of their own (ranks x threads within the cores)
compute in lockstep, between the same collectives, and their embedding kernels (random rows of
tables larger than the cache: bound by memory, not arithmetic) share the last-level cache and
the memory bandwidth that calibration measured with one rank alone. The profile's
``kernels_together`` is what calibrate measured for it: one memory-bound kernel call (a table
twice a 32 MiB cache) timed in as many ranks as the cores hold at the same moment, over alone
(the median of its samples); the prediction multiplies every rank's kernel time by it there.
Issue 29's quiet 2-rank rows on the 2-core EPYC VM (dmp and skewed, every type) were 17-36%
short without it, with each of the hour's calibrations and their median; the committed rows
re-predicted with a factor of 1.5-1.8 come within 20% (35-36 of 36 at 1-2 ranks), while the
dense part (cache-blocked matmuls) needed none. Where ranks outnumber the cores they take
turns ([Note: oversubscribed cores]) and their kernels seldom run at the same moment: the
factor is not charged (the 4-rank rows fit without it, 24 of 24; with it 17-21). Ranks on
hosts of their own (GPUs, or one rank per host) are charged nothing. The simulation gives
every rank cores of its own, so there a CPU profile's factor is charged to every host of 2 or
more ranks: measured with as many ranks as the calibrated machine has cores, a guess for hosts
of many more. Measured quietly on that VM afterwards (two calibrations, 2026-11-29): 1.00x
(1.00-1.24 over 5 samples), and the 2-rank rows checked afresh came within 20% in 21 of 24
without it (benchmarks/results/predict_ranks_1_2_samples.md): there the factor is 1 and the
earlier shortfall did not recur (most likely the calibrations' drift within the hour); the term
stays for hosts where calibrate measures more.

[Note: fresh pages]
A CPU step allocates some buffers afresh every time, and the first write to a freshly mapped
page faults: the kernel maps and zeroes it. glibc's allocator hands buffers of 32 MiB or more
(the largest threshold it adapts to) back to the system when they are freed and maps new ones
at the next allocation, so a step that allocates a 40 MiB buffer pays its page faults every
step: on the 2-core EPYC VM 0.6-0.9 ms per MiB of one rank's CPU time, 5-7 times what writing
an already-mapped MiB costs (issue 29's measurement: row-wise types of the small case at 4
ranks fault 180 MiB of fresh pages per rank per step, data-parallel 203 MiB, table-wise 10;
their steps took 35-48% longer than predicted without this term). The profile's
``fresh_buffer_bytes`` and ``fresh_page_ms_per_byte`` are calibrate's measurement of it (0:
none, as on GPUs, whose caching allocator keeps its memory), and the prediction charges
``fresh_page_ms_per_byte`` for every byte of each step buffer at least ``fresh_buffer_bytes``
large, as compute (times ``s`` when ranks share cores):

- the kernel's pooled output, one buffer per kernel call (in the embedding phase);
- per output class (`output_buffers`, in the output distribution): all-to-all, its output
  and its adjoint's; reduce-scatter (row-wise types, through an all-to-all on gloo), the
  all-to-all's receive buffer, then in backward the all-gather's output and the flat buffer
  gloo gathers into first; FUSED data-parallel replicas, the all-gather's output, gloo's flat
  buffer, the uneven ranks' chunks joined and the output gradients unpacked.

Smaller buffers come from the allocator's own memory: on CPUs `DistributedModelParallel` and
the train pipelines fix glibc's thresholds (`shardkit.kernels.steady_heap`, [Note: a steady
heap]), so a step's memory stays mapped for the next. Before they did, issue 29's traces
(`benchmarks/trace_collectives.py`, the faults of each collective call counted) found one buffer
of an output class's size faulting every step whatever its size (the backward collective's
output at 1 and 4 ranks: 2-10 MiB), because glibc handed the heap's top freed at the end of a
step back to the system and the next step mapped it again; with the steady heap that program
takes 1-2 faults a step on every rank (benchmarks/results/dmp_as_written_zen3_sgd_pipeline.md),
so nothing is charged for it (a process run with ``SHARDKIT_STEADY_HEAP=0`` pays it unpredicted).
Calibration times its collectives with the buffers they allocate, so the link fit subtracts
those buffers' faults from the sizes at or above the threshold before fitting (see
`shardkit.bench._links.fit_links`) and each fault is charged once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardkit.planner._constants import DENSE_UPDATE_PERF_FACTOR, OPTIMIZER_STATE_DTYPE_SIZE
from shardkit.planner._enumerate import Option
from shardkit.planner._estimate import optimizer_state_bytes
from shardkit.planner._inputs import Topology
from shardkit.planner._profile import MachineProfile, collective_ms, expected_unique
from shardkit.planner._tables import TableSpec
from shardkit.types import EmbeddingComputeKernel, ShardingType

__all__ = [
    "DENSE_UPDATE_BYTES_PER_PARAMETER",
    "PlacedTable",
    "RankStep",
    "StepPrediction",
    "placed_tables",
    "predict_step",
]

# Adam's step: reads parameter, gradient, exp_avg, exp_avg_sq; writes the three it updates.
DENSE_UPDATE_BYTES_PER_PARAMETER = 7 * OPTIMIZER_STATE_DTYPE_SIZE
_ROUTE = {
    ShardingType.TABLE_WISE: "placed",
    ShardingType.COLUMN_WISE: "placed",
    ShardingType.TABLE_COLUMN_WISE: "placed",
    ShardingType.ROW_WISE: "summed",
    ShardingType.TABLE_ROW_WISE: "host_summed",
    ShardingType.GRID_SHARD: "host_summed",
    ShardingType.DATA_PARALLEL: "local",
}
_ROW_SPLIT = ("summed", "host_summed")
COMPONENTS = ("embedding", "input_dist", "output_dist", "dense", "dense_all_reduce", "overhead")


@dataclass(frozen=True)
class PlacedTable:
    """One table as placed: its type and kernel, its shards as runs of ``(count, rows, cols)``
    in shard order, and each shard's rank (None: shard ``i`` on rank ``i``)."""

    table: TableSpec
    sharding_type: ShardingType
    kernel: EmbeddingComputeKernel
    runs: tuple[tuple[int, int, int], ...]
    ranks: tuple[int, ...] | None = None

    def arrays(self, world_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, cols, rank) of every shard, ``[num_shards]`` each."""
        counts = np.array([c for c, _, _ in self.runs], dtype=np.int64)
        rows = np.repeat(np.array([r for _, r, _ in self.runs], dtype=np.float64), counts)
        cols = np.repeat(np.array([c for _, _, c in self.runs], dtype=np.float64), counts)
        ranks = np.arange(rows.size) if self.ranks is None else np.array(self.ranks)
        assert ranks.size == rows.size and (world_size > ranks).all()
        return rows, cols, ranks


@dataclass(frozen=True)
class RankStep:
    """One rank's predicted ms per step: its kernels (forward and backward with the update),
    the collectives it takes part in (input and output distributions, the dense all-reduce),
    its dense layers and the fixed overhead. ``total`` is their sum; the job waits for more
    (see [Note: step-time model])."""

    rank: int
    embedding: float
    input_dist: float
    output_dist: float
    dense: float
    dense_all_reduce: float
    overhead: float

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in COMPONENTS)


@dataclass(frozen=True)
class StepPrediction:
    """A plan's predicted step: per rank, and for the job (``step_ms``: the plain loop;
    ``pipelined_ms``: with the train pipeline). ``phases`` are the job's components (each the
    slowest rank's), which add up to ``step_ms``. ``shared_cores``: how the host's ranks
    share its cores, when they do (see [Note: oversubscribed cores]), else empty."""

    ranks: tuple[RankStep, ...]
    phases: tuple[tuple[str, float], ...]
    step_ms: float
    pipelined_ms: float
    batch_size: int
    profile: str
    shared_cores: str = ""

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def slowest_rank(self) -> int:
        return max(self.ranks, key=lambda r: (r.embedding + r.dense, -r.rank)).rank

    @property
    def samples_per_s(self) -> float:
        return self.batch_size * self.world_size / self.step_ms * 1e3

    @property
    def dominant(self) -> str:
        """The job's largest component."""
        return max(self.phases, key=lambda p: p[1])[0]

    def summary(self) -> str:
        parts = ", ".join(f"{name} {ms:.3g}" for name, ms in self.phases)
        line = (
            f"predicted step {self.step_ms:.4g} ms ({parts}); {self.samples_per_s:,.0f} "
            f"samples/s; slowest rank {self.slowest_rank}"
        )
        if self.pipelined_ms < self.step_ms:
            line += f"; with the train pipeline {self.pipelined_ms:.4g} ms"
        if self.shared_cores:
            line += f"; {self.shared_cores}"
        return f"{line} [profile: {self.profile}]"


def placed_tables(
    tables: Sequence[TableSpec],
    proposal: Sequence[Option],
    ranks: Sequence[Sequence[int] | None],
    world_size: int,
) -> list[PlacedTable]:
    """The planner's options where its partition put them (None: shard ``i`` on rank ``i``)."""
    return [
        PlacedTable(
            table,
            option.sharding_type,
            option.kernel,
            tuple((k.count, k.rows, k.cols) for k in option.kinds),
            None if where is None else tuple(where),
        )
        for table, option, where in zip(tables, proposal, ranks)
    ]


class _Sums:
    """Per-rank sums (``[W]`` arrays) while the tables are walked: kernel groups, the input
    exchange and the output classes."""

    def __init__(self, world: int) -> None:
        self.world = world
        # (route, cols, optimizer, kernel) -> [ids, bags, bytes, unique, backward ids] per rank
        self.groups: dict[tuple, np.ndarray] = {}
        self.in_send = 0.0  # every rank sends alike (ranks' batches have the same statistics)
        self.in_recv = np.zeros(world)
        # (route, cols) -> [bytes each rank sends, bytes each rank receives]
        self.classes: dict[tuple[str, int], np.ndarray] = {}
        self.dense_dp_bytes = 0.0
        self.dense_dp_update = 0.0
        self.bucketed_ids = 0.0  # ids of row-split tables every rank buckets by shard

    def group(self, key: tuple) -> np.ndarray:
        if key not in self.groups:
            self.groups[key] = np.zeros((5, self.world))
        return self.groups[key]

    def output_class(self, key: tuple[str, int]) -> np.ndarray:
        if key not in self.classes:
            self.classes[key] = np.zeros((2, self.world))
        return self.classes[key]


def predict_step(
    placed: Sequence[PlacedTable],
    topology: Topology,
    *,
    batch_size: int,
    dense_parameters: int = 0,
    dense_flops_per_example: float | None = None,
) -> StepPrediction:
    """The step time of ``placed`` on ``topology`` (which must carry a profile). See
    [Note: step-time model].

    Args:
        placed: every table with its shards' shapes and ranks.
        topology: the ranks, and the `MachineProfile` they run on.
        batch_size: examples per rank per step.
        dense_parameters: parameters of the dense part of the model (float32).
        dense_flops_per_example: its forward flops per example (default ``2 x`` parameters,
            exact for MLPs).
    """
    profile = topology.profile
    assert profile is not None, "predict_step needs Topology(profile=...)"
    world, local = topology.world_size, topology.intra_group_size
    slow = profile.oversubscription(local)
    wait = profile.collective_wait_ms(local)  # per call: [Note: oversubscribed cores]
    sums = _Sums(world)
    for item in placed:
        if item.sharding_type == ShardingType.DATA_PARALLEL:
            _add_replicas(item, sums)
        else:
            _add_shards(item, sums)

    def coll(kind: str, nbytes: float, size: int = world, group_local: int = local) -> float:
        return collective_ms(
            kind, nbytes, world_size=size, local_world_size=group_local, profile=profile
        )

    # each rank's own kernel work, as calibrated for one rank alone; the phase takes what
    # ranks sharing cores take for all of it ([Note: oversubscribed cores])
    together = profile.kernel_slowdown(local)  # [Note: ranks computing at once]
    fwd = _kernels(sums, profile, forward=True) * together + _kernel_fresh_pages(sums, profile)
    bwd = (
        _kernels(sums, profile, forward=False) * together + sums.dense_dp_update / profile.memory_bw
    )
    fwd_ms, bwd_ms = _time_shared(fwd, topology, slow), _time_shared(bwd, topology, slow)
    # the headers' exchange and the ids' run whatever the tables (every batch is checked),
    # empty when all are data-parallel replicas
    exchange = max(sums.in_send, float(sums.in_recv.max()))
    header = 8 * 8 * world  # a few int64 per destination: latency, mostly
    in_calls = 3 if any(p.table.is_weighted for p in placed) else 2
    in_dist = coll("all_to_all", header) + coll("all_to_all", exchange) + in_calls * wait
    in_dist += profile.bucket_ms_per_id * sums.bucketed_ids * slow  # row-split tables' ids
    if in_calls == 3:
        in_dist += coll("all_to_all", exchange / 2)
    out_fwd, out_bwd, out_calls = _output_dists(sums.classes, topology, coll)
    out_fwd += wait * out_calls[0]
    out_bwd += wait * out_calls[1] + _output_fresh_pages(sums.classes, topology) * slow
    flops = 2.0 * dense_parameters if dense_flops_per_example is None else dense_flops_per_example
    dense = (
        3 * flops * batch_size / profile.matmul_flops
        + DENSE_UPDATE_BYTES_PER_PARAMETER * dense_parameters / profile.memory_bw
    ) * slow
    reduce_bytes = 4 * dense_parameters + sums.dense_dp_bytes
    all_reduce = coll("all_reduce", reduce_bytes) + wait if reduce_bytes > 0 else 0.0
    collectives = in_calls + sum(out_calls) + (1 if reduce_bytes > 0 else 0)
    features = sum(len(p.table.inputs) for p in placed)
    bags = sum(f.num_poolings * f.batch_size for p in placed for f in p.table.inputs)
    values = sum(
        f.num_poolings * f.batch_size * p.table.embedding_dim
        for p in placed
        for f in p.table.inputs
    )
    overhead = profile.overhead_ms(features, bags, values) * slow
    phases = (
        ("embedding", fwd_ms + bwd_ms),
        ("input_dist", in_dist),
        ("output_dist", out_fwd + out_bwd),
        ("dense", dense),
        ("dense_all_reduce", all_reduce),
        ("overhead", overhead),
    )
    step = sum(ms for _, ms in phases)
    # a rank's own kernels, time-shared with its host's other ranks: never more than the phase
    embedding = np.minimum(fwd * slow, fwd_ms) + np.minimum(bwd * slow, bwd_ms)
    per_rank = tuple(
        RankStep(rank, float(embedding[rank]), in_dist, out_fwd + out_bwd, dense, all_reduce,
                 overhead)
        for rank in range(world)
    )  # fmt: skip
    return StepPrediction(
        ranks=per_rank,
        phases=phases,
        step_ms=step,
        pipelined_ms=step - min(in_dist, step - in_dist) * _overlap(profile, local),
        batch_size=batch_size,
        profile=profile.name,
        shared_cores=_shared_cores(profile, local, slow, wait, collectives),
    )


def _time_shared(work: np.ndarray, topology: Topology, slow: float) -> float:
    """ms of a compute phase whose ranks do ``work`` (ms each, one rank alone) before the
    next collective: each host's ranks share its cores, so a host takes the most of its
    slowest rank's own work and all its ranks' work over its cores (``threads / cores`` of
    the sum); the job waits for the slowest host. ``slow x`` the slowest rank when the ranks'
    work is even (``slow``: the profile's oversubscription of a host), the slowest rank's
    alone where each rank has cores of its own. See [Note: oversubscribed cores]."""
    profile = topology.profile
    assert profile is not None
    local = topology.intra_group_size
    if slow <= 1.0:
        return float(work.max())
    hosts = work.reshape(-1, local)  # rank r on host r // local
    shared = hosts.sum(axis=1) * profile.threads_per_rank / profile.cores
    return float(np.maximum(hosts.max(axis=1), shared).max())


def _shared_cores(
    profile: MachineProfile, local: int, share: float, wait: float, collectives: int
) -> str:
    """The oversubscription assumption (``share``) in words, or "" when each rank has cores of
    its own."""
    if share <= 1.0:
        return ""
    return (
        f"{local} ranks x {profile.threads_per_rank} thread(s) share {profile.cores} cores: "
        f"compute x{share:.3g} (time-shared), each of the step's {collectives} collectives "
        f"+{wait:.3g} ms waiting for its ranks to be scheduled [Note: oversubscribed cores]"
    )


def _overlap(profile: MachineProfile, local: int) -> float:
    """The share of the input distribution the train pipeline hides."""
    if profile.compute_device == "cuda":
        return 1.0
    spare = profile.cores - local * profile.threads_per_rank
    return min(1.0, max(0.0, spare / local))


def _add_shards(item: PlacedTable, sums: _Sums) -> None:
    """A sharded table: its shards join their ranks' kernel groups, its ids the input exchange
    and its outputs their output class."""
    table, world = item.table, sums.world
    route = _ROUTE[item.sharding_type]
    ids, outputs = table.ids_per_rank, table.outputs_per_rank
    bags = sum(f.num_poolings * f.batch_size for f in table.inputs)
    rows, cols, ranks = item.arrays(world)
    blocks = float(rows.sum()) / table.num_embeddings  # column blocks: each gets every id
    # every rank sends its ids to each column block, and its bags' lengths to every shard
    sums.in_send += ids * blocks * table.id_bytes + rows.size * bags * 8
    share = rows / table.num_embeddings if route in _ROW_SPLIT else np.ones_like(rows)
    if route in _ROW_SPLIT:  # each rank groups its batch's ids by shard before sending
        sums.bucketed_ids += ids
    shard_ids = ids * world * share
    shard_outputs = outputs * world if table.pooled else shard_ids
    shard_outputs = np.broadcast_to(shard_outputs, rows.shape)
    np.add.at(sums.in_recv, ranks, shard_ids * table.id_bytes + world * bags * 8)
    unique = rows * -np.expm1(-shard_ids / rows)
    for width in np.unique(cols).astype(int).tolist():
        mask = cols == width
        group = sums.group((route, width, table.optimizer.value, item.kernel))
        on = ranks[mask]
        np.add.at(group[0], on, shard_ids[mask])
        np.add.at(group[1], on, shard_outputs[mask])
        row_bytes = width * table.element_size + optimizer_state_bytes(table.optimizer, 1, width)
        nbytes = rows[mask] * row_bytes
        np.add.at(group[2], on, nbytes)
        np.add.at(group[3], on, unique[mask])
        np.add.at(group[4], on, shard_ids[mask])
        out = sums.output_class((route, width))
        np.add.at(out[0], on, shard_outputs[mask] * width * 4)
        if route == "placed":  # every rank receives its own bags' rows of each shard
            out[1] += outputs * width * 4 * int(mask.sum())


def _add_replicas(item: PlacedTable, sums: _Sums) -> None:
    """Data-parallel: each rank looks up its own batch in its replica. FUSED replicas all-gather
    every rank's ids and output gradients and update over the global batch; DENSE ones
    all-reduce the whole gradient and step it densely."""
    table, world = item.table, sums.world
    rows, cols = table.num_embeddings, table.embedding_dim
    ids, outputs = table.ids_per_rank, table.outputs_per_rank
    weights = rows * cols * table.element_size
    fused = item.kernel == EmbeddingComputeKernel.FUSED
    group = sums.group(("local", cols, table.optimizer.value, item.kernel))
    global_ids = ids * world if fused else ids
    group += np.array(
        [ids, outputs, weights + optimizer_state_bytes(table.optimizer, rows, cols),
         expected_unique(global_ids, rows), global_ids]
    )[:, None]  # fmt: skip
    if not fused:
        sums.dense_dp_bytes += weights
        sums.dense_dp_update += DENSE_UPDATE_PERF_FACTOR * weights
    else:
        words = outputs * (cols + 1) + ids * (2 if table.is_weighted else 1)
        sums.output_class(("local", cols))[0] += words * 4 * world  # the all-gather's output


def _kernels(sums: _Sums, profile: MachineProfile, *, forward: bool) -> np.ndarray:
    """Per rank, ms of its kernel calls (one per group it holds a shard of)."""
    total = np.zeros(sums.world)
    for (_, cols, optimizer, kernel), (ids, bags, nbytes, unique, bwd_ids) in sums.groups.items():
        fit = profile.kernel(optimizer)
        calls = (ids > 0) | (nbytes > 0)
        touched = nbytes + bags * cols * 4  # see [Note: calibrated kernel model]
        miss_fwd, miss_bwd = fit.miss(touched, profile.cache_bytes)
        if forward:
            f0, f1, f2, f3, f4, f5 = fit.forward
            time = f1 * ids + f2 * ids * cols + f3 * bags * cols + miss_fwd * ids * (f4 + f5 * cols)
            total += np.where(calls, f0 + time, 0.0)
        else:
            b0, b1, b2, b3, b4, b5, b6 = fit.backward
            # FUSED replicas update over the global batch: every rank's bags' gradients
            bwd_bags = bags * np.divide(bwd_ids, ids, out=np.ones_like(ids), where=ids > 0)
            touched = b3 * unique * cols + miss_bwd * unique * (b4 + b5 * cols)
            time = b1 * bwd_ids + b2 * bwd_ids * cols + touched + b6 * bwd_bags * cols
            if kernel == EmbeddingComputeKernel.DENSE:
                time = time + 2 * ids * cols * 4 / profile.memory_bw  # the dense gradient
            total += np.where(calls, b0 + time, 0.0)
    return total


def _kernel_fresh_pages(sums: _Sums, profile: MachineProfile) -> np.ndarray:
    """Per rank, ms of the page faults of its kernels' outputs (one buffer per group call, its
    pooled rows). See [Note: fresh pages]."""
    total = np.zeros(sums.world)
    for (_, cols, _, _), (_, bags, _, _, _) in sums.groups.items():
        for rank, rows in enumerate(bags.tolist()):
            total[rank] += profile.fresh_page_ms([rows * cols * 4])
    return total


def output_buffers(
    route: str, send: float, recv: float, cols: int, hosts: int, local: int
) -> list[float]:
    """The buffers one output class allocates on a rank per step, bytes each (beyond the
    kernel's output), as the sharded modules run on a backend without a reduce-scatter that
    beats an all-to-all (gloo); see [Note: fresh pages]. ``send``: the rank's pooled rows of
    the class; ``recv``: what it receives (all-to-all), or for FUSED replicas the all-gather's
    output."""
    if route == "placed":  # the all-to-all's output, and its adjoint's (the rows' gradients)
        return [recv, send]
    if route in _ROW_SPLIT:
        # forward: the reduce-scatter's all-to-all receives as much as it sends; backward: the
        # all-gather's output and the backend's flat buffer it gathers into first
        buffers = [send, send, send]
        if route == "host_summed" and hosts > 1:  # the sums' exchange across hosts, and back
            buffers += [send / local, send / local]
        return buffers
    # FUSED replicas: the all-gather's output, the backend's flat buffer, the uneven ranks'
    # chunks joined, and the output gradients unpacked from it (all but the ids' words)
    return [recv, recv, recv, recv * cols / (cols + 1)]


def _output_fresh_pages(classes: dict, topology: Topology) -> float:
    """The page faults of the output distributions' buffers, on the rank with the most."""
    profile = topology.profile
    assert profile is not None
    hosts, local = topology.num_hosts, topology.intra_group_size
    per_rank = np.zeros(topology.world_size)
    for (route, cols), (send, recv) in classes.items():
        # FUSED replicas' class holds the all-gather's output where the others hold what they send
        received = send if route == "local" else recv
        for rank in range(per_rank.size):
            buffers = output_buffers(
                route, float(send[rank]), float(received[rank]), cols, hosts, local
            )
            per_rank[rank] += profile.fresh_page_ms(buffers)
    return float(per_rank.max())


def _output_dists(classes: dict, topology: Topology, coll) -> tuple[float, float, tuple[int, int]]:
    """(forward, backward) ms of every output class's collectives, in the job, and how many
    collective calls each direction makes."""
    local, hosts = topology.intra_group_size, topology.num_hosts
    forward = backward = 0.0
    calls = [0, 0]
    for (route, _), (send, recv) in sorted(classes.items()):
        if route == "placed":
            size = float(max(send.max(), recv.max()))
            forward += coll("all_to_all", size)
            backward += coll("all_to_all", size)
            calls = [calls[0] + 1, calls[1] + 1]
        elif route == "summed":
            size = float(send.max())
            forward += coll("reduce_scatter", size)
            backward += coll("all_gather", size)
            calls = [calls[0] + 1, calls[1] + 1]
        elif route == "host_summed":
            size = float(send.max())
            forward += coll("reduce_scatter", size, local, local)
            backward += coll("all_gather", size, local, local)
            calls = [calls[0] + 1, calls[1] + 1]
            if hosts > 1:
                forward += coll("all_to_all", size / local, hosts, 1)
                backward += coll("all_to_all", size / local, hosts, 1)
                calls = [calls[0] + 1, calls[1] + 1]
        else:  # FUSED data-parallel: the id counts' all-gather, then the batch's in backward
            forward += coll("all_gather", 8.0 * topology.world_size)
            backward += coll("all_gather", float(send.max()))
            calls = [calls[0] + 1, calls[1] + 1]
    return forward, backward, (calls[0], calls[1])
