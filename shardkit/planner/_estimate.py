"""What one shard costs: memory on its rank and milliseconds per training step.

[Note: memory model]
A shard of ``r`` rows and ``c`` columns (element size ``e`` bytes) holds on its rank:

- weights: ``r * c * e``;
- optimizer state (float32): row-wise Adagrad ``4 * r``, Adagrad ``4 * r * c``, Adam
  ``8 * r * c``, SGD nothing. The fused kernel keeps it next to the weights; the DENSE kernel
  also holds a full gradient (``r * c * e``) and its optimizer's state (counted as the same
  optimizer);
- buffers of one batch: the ids it receives (8 bytes each, 12 when weighted) and the output
  rows it produces (``c * e`` each). See [Note: lookup volume] for how many.

Each rank also gives up a margin, the dense part of the model and the input KJTs (see
`HeuristicalStorageReservation`).

[Note: lookup volume]
With ``W`` ranks, ``L`` per host, and per rank per step ``I`` ids and ``O`` output rows (bags;
ids for unpooled tables) for the table, a shard holding the fraction ``f = r / R`` of the rows:

- table-wise, column-wise, table-column-wise: every id of the global batch, ``I * W``; it
  produces ``O * W`` output rows;
- row-wise, table-row-wise, grid: the ids in its row range, ``I * W * f`` (ids spread evenly over
  rows); pooled, it produces partial sums for every bag, ``O * W`` rows;
- data-parallel: only the rank's own batch, ``I`` ids and ``O`` rows.

[Note: cost model]
Milliseconds per step, bandwidths in bytes/ms (`Topology`):

- lookup (forward): bytes read and written, ``ids * id_bytes + ids * c * e + outputs * c * e``,
  over the memory bandwidth (HBM on GPUs, DDR on CPUs; half of it for the DENSE kernel);
  backward costs ``bwd_compute_multiplier`` (2) times that;
- input distribution: the ids a shard receives, all-to-all over the world;
- output distribution, forward and backward, ``outputs * c * e`` bytes: an all-to-all for
  table-wise and column-wise, a reduce-scatter forward and all-gather backward for row-wise,
  plus a copy of the gathered gradient (2.455 x its bytes over memory bandwidth);
  table-row-wise and grid reduce-scatter inside the host, then exchange ``1 / L`` of it with the
  other hosts;
- data-parallel: no forward communication; backward all-reduces the table's gradient
  (``2 (W - 1) / W`` of its bytes) and runs element-wise kernels over it (9.22 passes).

A collective among ranks of one host runs at ``intra_host_bw``, one spanning hosts at
``inter_host_bw``. One rank alone communicates nothing. The costs of all a rank's shards add
up: the model has no overlap of communication and computation (TorchRec's neither), so it ranks
plans rather than predicting step times.

[Note: calibrated shard costs]
With a `MachineProfile` in the topology, a shard's cost is what it adds to its rank's step
under [Note: step-time model]: its kernel time, forward and backward with the update, from the
profile's `KernelFit` without the per-call cost (a shard group's, counted once per rank by
`predict_step`), and the bytes it adds to each collective it takes part in at the measured
bandwidth of that collective over the world (again without the latency, paid once per
collective). The search balances these; `predict_step` adds the fixed costs and times the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardkit.optim import EmbOptimType
from shardkit.planner._constants import (
    BATCHED_COPY_PERF_FACTOR,
    DENSE_KERNEL_BW_FACTOR,
    DENSE_UPDATE_PERF_FACTOR,
    OPTIMIZER_STATE_DTYPE_SIZE,
)
from shardkit.planner._inputs import Topology
from shardkit.planner._profile import collective_ms, expected_unique
from shardkit.planner._tables import TableSpec
from shardkit.types import EmbeddingComputeKernel, ShardingType

__all__ = ["ShardCost", "estimate_shard", "optimizer_state_bytes"]

_ROW_SPLIT = frozenset(
    {ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD}
)
_WHOLE_ROWS = frozenset(
    {ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE}
)


@dataclass(frozen=True, slots=True)
class ShardCost:
    """One shard's estimate: bytes on its rank; ms of lookups (compute) and communication."""

    memory: int
    io_memory: int
    compute: float
    comms: float

    @property
    def total(self) -> float:
        return self.compute + self.comms


def optimizer_state_bytes(optimizer: EmbOptimType, rows: int, cols: int) -> int:
    """Float32 state of ``optimizer`` for a ``[rows, cols]`` shard. See [Note: memory model]."""
    per_row = {
        EmbOptimType.EXACT_SGD: 0,
        EmbOptimType.EXACT_ROWWISE_ADAGRAD: 1,
        EmbOptimType.EXACT_ADAGRAD: cols,
        EmbOptimType.ADAM: 2 * cols,
        EmbOptimType.LAMB: 2 * cols,
        EmbOptimType.LARS_SGD: cols,
        EmbOptimType.PARTIAL_ROWWISE_ADAM: cols + 1,
        EmbOptimType.PARTIAL_ROWWISE_LAMB: cols + 1,
    }[optimizer]
    return rows * per_row * OPTIMIZER_STATE_DTYPE_SIZE


def estimate_shard(
    table: TableSpec,
    sharding_type: ShardingType,
    kernel: EmbeddingComputeKernel,
    rows: int,
    cols: int,
    topology: Topology,
) -> ShardCost:
    """Memory and cost of one ``[rows, cols]`` shard. See [Note: cost model] and, with a
    profile, [Note: calibrated shard costs]."""
    ids, outputs = _volume(table, sharding_type, rows, topology.world_size)
    e = table.element_size
    io = math.ceil(ids * table.id_bytes) + math.ceil(outputs * cols * e)
    weights = rows * cols * e
    state = optimizer_state_bytes(table.optimizer, rows, cols)
    gradient = weights if kernel == EmbeddingComputeKernel.DENSE else 0
    memory = weights + state + gradient + io
    if topology.profile is not None:
        compute, comms = _calibrated(
            table, sharding_type, kernel, rows, cols, ids, outputs, topology
        )
        return ShardCost(memory, io, compute, comms)
    bandwidth = topology.memory_bw
    if kernel == EmbeddingComputeKernel.DENSE:
        bandwidth *= DENSE_KERNEL_BW_FACTOR
    forward = (ids * table.id_bytes + ids * cols * e + outputs * cols * e) / bandwidth
    backward = forward * topology.bwd_compute_multiplier
    if table.is_weighted:
        backward *= topology.weighted_feature_bwd_compute_multiplier
    if sharding_type == ShardingType.DATA_PARALLEL:
        backward += DENSE_UPDATE_PERF_FACTOR * weights / topology.memory_bw
    comms = _comms(table, sharding_type, ids, outputs * cols * e, weights, topology)
    return ShardCost(memory, io, forward + backward, comms)


def _calibrated(
    table: TableSpec,
    sharding_type: ShardingType,
    kernel: EmbeddingComputeKernel,
    rows: int,
    cols: int,
    ids: float,
    outputs: float,
    topology: Topology,
) -> tuple[float, float]:
    """(compute, comms) ms of one shard from the topology's profile. See
    [Note: calibrated shard costs]."""
    profile = topology.profile
    assert profile is not None
    world, local = topology.world_size, topology.intra_group_size
    fit = profile.kernel(table.optimizer.value)
    weights = rows * cols * table.element_size
    touched = weights + optimizer_state_bytes(table.optimizer, rows, cols) + outputs * cols * 4
    miss_fwd, miss_bwd = (float(m) for m in fit.miss(touched, profile.cache_bytes))
    replica = sharding_type == ShardingType.DATA_PARALLEL
    fused = kernel == EmbeddingComputeKernel.FUSED
    bwd_ids, bwd_outputs = (ids * world, outputs * world) if replica and fused else (ids, outputs)
    compute = fit.forward_ms(ids, outputs, cols, miss=miss_fwd, calls=0) + fit.backward_ms(
        bwd_ids, expected_unique(bwd_ids, rows), cols, miss=miss_bwd, calls=0, bags=bwd_outputs
    )
    if replica and not fused:
        compute += DENSE_UPDATE_PERF_FACTOR * weights / profile.memory_bw
    compute *= profile.oversubscription(local)

    def wire(kind: str, nbytes: float, size: int = world, group_local: int = local) -> float:
        """What ``nbytes`` add to one collective (its latency is paid once per step)."""

        def ms(n: float) -> float:
            return collective_ms(
                kind, n, world_size=size, local_world_size=group_local, profile=profile
            )

        return ms(nbytes) - ms(0)

    out_bytes = outputs * cols * 4
    if replica:
        if not fused:
            return compute, wire("all_reduce", weights)
        words = table.outputs_per_rank * (cols + 1) + table.ids_per_rank * (
            2 if table.is_weighted else 1
        )
        return compute, wire("all_gather", 4 * words * world)
    comms = wire("all_to_all", ids * table.id_bytes)
    if sharding_type in _WHOLE_ROWS:
        return compute, comms + 2 * wire("all_to_all", out_bytes)
    if sharding_type == ShardingType.ROW_WISE:
        return compute, comms + wire("reduce_scatter", out_bytes) + wire("all_gather", out_bytes)
    comms += wire("reduce_scatter", out_bytes, local, local) + wire(
        "all_gather", out_bytes, local, local
    )
    if topology.num_hosts > 1:
        comms += 2 * wire("all_to_all", out_bytes / local, topology.num_hosts, 1)
    return compute, comms


def _volume(
    table: TableSpec, sharding_type: ShardingType, rows: int, world_size: int
) -> tuple[float, float]:
    """(ids received, output rows produced) per step. See [Note: lookup volume]."""
    ids, outputs = table.ids_per_rank, table.outputs_per_rank
    if sharding_type == ShardingType.DATA_PARALLEL:
        return ids, outputs
    if sharding_type in _WHOLE_ROWS:
        return ids * world_size, outputs * world_size
    assert sharding_type in _ROW_SPLIT
    ids = ids * world_size * rows / table.num_embeddings
    return ids, (outputs * world_size if table.pooled else ids)


def _comms(
    table: TableSpec,
    sharding_type: ShardingType,
    ids: float,
    output_bytes: float,
    weight_bytes: int,
    topology: Topology,
) -> float:
    """Input and output distribution, forward and backward, in ms."""
    world = topology.world_size
    if world == 1:
        return 0.0
    world_bw = topology.comm_bw(world)
    if sharding_type == ShardingType.DATA_PARALLEL:
        return weight_bytes * 2 * (world - 1) / world / world_bw
    input_dist = ids * table.id_bytes / world_bw
    if sharding_type in _WHOLE_ROWS:
        return input_dist + 2 * output_bytes / world_bw
    copy = BATCHED_COPY_PERF_FACTOR * output_bytes / topology.memory_bw
    if sharding_type == ShardingType.ROW_WISE:
        return input_dist + 2 * output_bytes / world_bw + copy
    # table-row-wise and grid: reduce-scatter in the host, then 1/L of it across hosts
    local = topology.intra_group_size
    across = output_bytes / local / topology.inter_host_bw if topology.num_hosts > 1 else 0.0
    return input_dist + 2 * (output_bytes / topology.intra_host_bw + across) + copy
