"""Data-parallel tables of bag collections: replicas kept equal by exchanging each batch's ids
and output gradients instead of all-reducing a dense gradient of the whole table.

[Note: sparse data-parallel tables]
A data-parallel table is a full replica on every rank. With the DENSE kernel its gradient is a
dense ``[R, D]`` tensor that DDP all-reduces and the user's optimizer steps: every row crosses
memory and the wire each step, though a batch touches few of them. With the FUSED kernel
(``data_parallel(compute_kernel="fused")``) the table's optimizer runs in backward, and a fused
rule only ever updates the rows a batch touched (see [Note: fused row updates] in
`shardkit.optim`). Then no dense gradient is needed to keep the replicas equal:

1. forward: each rank looks up its own bags in its replica (no communication), and starts an
   all-gather of how many ids it has (async; waited in backward);
2. backward: ONE all-gather of every rank's bag lengths, ids, per-sample weights and output
   gradients ``[K * B, D]`` (scaled by ``1 / W``, DDP's average), packed in one int32 buffer;
   then every rank runs the fused backward over the global batch, ranks in order.

Every rank applies the same update in the same order to the same rows, so the replicas stay
bitwise equal, and the update is the unsharded module's backward on the global batch. Bytes on
the wire per rank: ``(K * B) * (D + 1) + N * (1 or 2)`` words instead of ``R * D``; work: the
touched rows only.

Which optimizers give the dense result: a dense step leaves a row with zero gradient unchanged
for SGD without momentum or weight decay, and for Adagrad and row-wise Adagrad without weight
decay, so for them the FUSED replica trains exactly as DENSE + DDP + that torch optimizer. Adam,
momentum and weight decay move untouched rows when stepped densely; the fused rules are lazy
(they touch the batch's rows only), as on every fused table. Plan such tables DENSE for dense
semantics.

[Note: dense data-parallel tables by exchange]
DENSE data-parallel tables of a bag collection (as TorchRec's planner plans them) keep the
DENSE contract: after backward each table's ``.grad`` is the dense gradient ``[R, D]`` of the
global batch averaged over ranks, as DDP's all-reduce would leave it, and the user's optimizer
steps it. They reach it by the same exchange as the FUSED replicas: ONE all-gather of every
rank's ids and output gradients (scaled by ``1 / W``), then every rank computes the dense
gradient of the global batch itself (the kernel's dense backward, ranks in order). So the wire
carries ``(K * B) * (D + 1) + N`` words per rank instead of DDP's ``R * D``, and no bucket copy:
at 8 tables x 100k x 64 on 2 ranks, 2.6 MB per rank instead of 205 MB. The gradients equal
DDP's up to the order of rounding (the same sum, added in another order). DDP is told to leave
these parameters alone; EmbeddingCollection's DENSE tables (sequence lookups) keep their local
replica under DDP. One INFO line says which tables run which way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import once_differentiable

from shardkit import comm
from shardkit.modules import BaseEmbeddingConfig, BatchedTables, kernel_input, lookup, stack_tables
from shardkit.optim import FusedOptimizerConfig
from shardkit.optim.fused import EmptyFusedOptimizer

__all__ = ["ReplicaGroup", "ReplicaTable", "build_replica_groups", "replica_lookup"]

logger = logging.getLogger(__name__)

_MAX_ROWS = torch.iinfo(torch.int32).max


class ReplicaTable(nn.Module):
    """One data-parallel table kept equal by exchange: ``weight`` ``[R, D]``, a view of its
    group's stack (the same state-dict key as a local replica's)."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight


@dataclass
class ReplicaGroup:
    """Data-parallel tables of one dim, dtype and fused optimizer (or none: DENSE), stacked in
    one buffer.

    ``features[k]`` is the collection's feature index of the group's k-th feature (the order
    of its bags), ``row_bases[k]`` the first row of that feature's table in the stack.
    """

    tables: BatchedTables
    names: list[str]
    params: list[nn.Parameter]
    features: list[int]
    row_bases: list[int]


def _log_replicas(fused: Sequence[str], exchanged: Sequence[str], dense: Sequence[str]) -> None:
    """One INFO line: which data-parallel tables run which way."""
    if fused or exchanged or dense:
        logger.info(
            "data-parallel tables: %s FUSED (only the rows a batch touched are exchanged and "
            "updated), %s DENSE with dense gradients from exchanged ids and output gradients, "
            "%s DENSE with dense gradients all-reduced by DDP",
            list(fused),
            list(exchanged),
            list(dense),
        )


def build_replica_groups(
    configs: Sequence[BaseEmbeddingConfig],
    keys: Sequence[tuple[torch.dtype, FusedOptimizerConfig | None]],
    replicated: Sequence[str],
    dense: Sequence[str],
    device: torch.device,
    weights: Mapping[str, torch.Tensor],
    process_group: dist.ProcessGroup | None,
) -> list[ReplicaGroup]:
    """One group per (dim, dtype, optimizer) of the ``replicated`` tables (FUSED, or DENSE kept
    equal by exchange: optimizer None in ``keys``), each table a copy of ``weights[name]``
    (initialised anew where that is on "meta", as TorchRec does), then the first rank's values
    broadcast to all (as DDP does for its replicas); one INFO line names them and the ``dense``
    data-parallel tables left to DDP."""
    fused = [c.name for c, (_, o) in zip(configs, keys) if c.name in replicated and o is not None]
    _log_replicas(fused, [name for name in replicated if name not in fused], dense)
    by_key: dict[tuple, list[int]] = {}
    for index, config in enumerate(configs):
        if config.name in replicated:
            dtype, optimizer = keys[index]
            by_key.setdefault((config.embedding_dim, dtype, optimizer), []).append(index)
    first_feature = [0]
    for config in configs:
        first_feature.append(first_feature[-1] + len(config.feature_names))
    groups = []
    for (dim, dtype, optimizer), indices in by_key.items():
        rows = [configs[i].num_embeddings for i in indices]
        if sum(rows) > _MAX_ROWS:  # ids travel as int32 words
            raise ValueError(
                f"data-parallel tables {[configs[i].name for i in indices]} have {sum(rows)} "
                f"rows together; a data-parallel group holds at most {_MAX_ROWS}: shard them "
                "(row_wise)"
            )
        tables = stack_tables(rows, dim, dtype=dtype, device=device, optimizer=optimizer)
        params: list[nn.Parameter] = []
        features: list[int] = []
        bases: list[int] = []
        for index, view, base in zip(indices, tables.table_views(), tables.row_starts):
            with torch.no_grad():
                _initial(configs[index], view, weights[configs[index].name])
            params.append(_table_parameter(view, fused=optimizer is not None))
            count = len(configs[index].feature_names)
            features += range(first_feature[index], first_feature[index] + count)
            bases += [base] * count
        names = [configs[i].name for i in indices]
        groups.append(ReplicaGroup(tables, names, params, features, bases))
        _note_lazy(names, optimizer)
        if dist.is_initialized() and dist.get_world_size(process_group) > 1:
            pg = process_group or dist.group.WORLD
            assert pg is not None, "dist is initialised (checked above)"
            first = dist.get_global_rank(pg, 0)
            comm.broadcast(tables.weight, src=first, group=process_group, inplace=True)
    return groups


def _initial(config: BaseEmbeddingConfig, view: torch.Tensor, full: torch.Tensor) -> None:
    if full.device.type == "meta":
        view.uniform_(config.get_weight_init_min(), config.get_weight_init_max())
    else:
        view.copy_(full.detach())


def _note_lazy(names: list[str], config: FusedOptimizerConfig | None) -> None:
    """Say where FUSED replicas train differently from DENSE ones (see [Note: sparse
    data-parallel tables])."""
    if config is not None and (config.optimizer.value == "adam" or config.weight_decay):
        logger.info(
            "data-parallel tables %s: fused %s with weight_decay=%s updates only the rows a "
            "batch touched, unlike a dense step of the same optimizer (which moves every row); "
            "plan them DENSE for the dense result",
            names,
            config.optimizer.value,
            config.weight_decay,
        )


def _table_parameter(view: torch.Tensor, *, fused: bool) -> nn.Parameter:
    param = nn.Parameter(view, requires_grad=True)
    param._shardkit_embedding_table = True  # type: ignore[attr-defined]
    param._shardkit_replica = True  # type: ignore[attr-defined]  # DDP must leave it alone
    if fused:  # TorchRec's marker: in_backward_optimizer_filter leaves it to the fused optimizer
        param._in_backward_optimizers = [EmptyFusedOptimizer()]  # type: ignore[attr-defined]
    return param


def replica_lookup(
    group: ReplicaGroup,
    lengths: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor] | None,
    *,
    batch_size: int,
    process_group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """This rank's pooled rows ``[B, K * D]`` (example-major) of the group's ``K`` features;
    backward updates every replica with the global batch (see [Note: sparse data-parallel
    tables]), or for DENSE tables gives each the dense gradient of the global batch (see
    [Note: dense data-parallel tables by exchange]).

    Args:
        group: the replicated tables.
        lengths: per feature of the group, ``[B]`` ids per bag.
        values: per feature, ``[n_k]`` int64 ids of its table.
        weights: per feature, ``[n_k]`` float32 per-id weights (MEAN folded in), or None.
        batch_size: ``B``, the same on every rank.
        process_group: the ranks that hold the replicas.
    """
    counts = [v.numel() for v in values]
    ids, offsets = kernel_input(
        torch.cat(list(values)), torch.cat(list(lengths)), group.row_bases, counts
    )
    psw = None if weights is None else torch.cat(list(weights))
    training = torch.is_grad_enabled() and any(p.requires_grad for p in group.params)
    if not training:  # evaluation: this rank's bags only, nothing to exchange
        return lookup(group.tables, ids, offsets, psw, [], batch_size=batch_size)
    fused = group.tables.optimizer is not None
    if fused and psw is not None and psw.requires_grad:
        raise ValueError(
            f"data-parallel tables {group.names} have the FUSED kernel and per-sample weights "
            "that require grad (a feature processor): the replicas' exchange carries no "
            "gradient for the weights; plan these tables with the DENSE kernel"
        )
    step = _Step(group, ids, offsets, psw, batch_size, process_group)
    step.start()
    return _ReplicaLookup.apply(step, psw, *group.params)


class _Step:
    """One lookup's inputs, and the id counts of every rank on their way (training only)."""

    def __init__(self, group, ids, offsets, psw, batch_size, process_group) -> None:
        self.group, self.ids, self.offsets, self.psw = group, ids, offsets, psw
        self.batch_size, self.process_group = batch_size, process_group
        self.counts: comm.Handle | None = None

    def start(self) -> None:
        """Start gathering every rank's id count (see [Note: sparse data-parallel tables])."""
        count = torch.tensor([self.ids.numel()], dtype=torch.int64, device=self.ids.device)
        counts = comm.all_gather_into_tensor(count, group=self.process_group, async_op=True)
        assert isinstance(counts, comm.Handle)
        self.counts = counts


class _ReplicaLookup(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, step: _Step, psw: torch.Tensor | None, *params: torch.Tensor
    ) -> torch.Tensor:
        ctx.step = step
        tables = step.group.tables
        return lookup(tables, step.ids, step.offsets, psw, [], batch_size=step.batch_size)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        step: _Step = ctx.step
        ctx.step = None
        grad = grad.float()
        grad_psw = _grad_weights(step, grad) if ctx.needs_input_grad[1] else None
        ids, offsets, psw, grad_out = _exchange(step, grad)
        grads = step.group.tables.apply_gradient(ids, offsets, psw, grad_out)
        return (None, grad_psw, *grads)


def _grad_weights(step: _Step, grad: torch.Tensor) -> torch.Tensor:
    """d loss / d per_sample_weights ``[N]`` of this rank's ids (DENSE tables, whose rows the
    backward does not change): each id's row dotted with its bag's output gradient, as a local
    replica's. ``grad`` ``[B, K * D]`` arrives divided by the world size (DDP's average, for the
    tables), so the dot is multiplied back."""
    tables = step.group.tables
    bags = grad.reshape(step.batch_size, -1, tables.dim).transpose(0, 1).reshape(-1, tables.dim)
    bag_of = torch.repeat_interleave(
        torch.arange(bags.shape[0], device=grad.device),
        step.offsets.diff(),
        output_size=step.ids.numel(),
    )
    rows = tables.weight.index_select(0, step.ids.long()).float()
    assert step.psw is not None, "asked for the weights' gradient: there are weights"
    world_size = dist.get_world_size(step.process_group)
    return ((bags.index_select(0, bag_of) * rows).sum(1) * world_size).to(step.psw.dtype)


def _exchange(
    step: _Step, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Every rank's (ids, bag offsets, weights, output gradients ``[W * K * B, D]``), ranks in
    order, from one all-gather of packed int32 words."""
    assert step.counts is not None
    counts = step.counts.wait().tolist()  # [W] ids per rank
    num_bags = step.offsets.numel() - 1  # K * B, the same on every rank
    dim = step.group.tables.dim
    weighted = step.psw is not None
    sizes = [num_bags * (1 + dim) + n * (2 if weighted else 1) for n in counts]
    packed = _pack(step, grad, num_bags, dim)
    gathered = comm.all_gather_into_tensor(
        packed, output_split_sizes=sizes, group=step.process_group
    )
    assert isinstance(gathered, torch.Tensor)
    parts = zip(*(_unpack(p, n, num_bags, dim, weighted) for p, n in zip(
        torch.split(gathered, sizes), counts)))  # fmt: skip
    lengths, ids, psw, grads = (list(p) for p in parts)
    all_lengths = torch.cat(lengths).long()
    offsets = torch.zeros(all_lengths.numel() + 1, dtype=torch.int64, device=grad.device)
    torch.cumsum(all_lengths, 0, out=offsets[1:])
    weights = torch.cat(psw) if weighted else None
    return torch.cat(ids), offsets, weights, torch.cat(grads)


def _pack(step: _Step, grad: torch.Tensor, num_bags: int, dim: int) -> torch.Tensor:
    """``[lengths (K * B) | ids (N) | weights (N, fp32 bits) | gradients (K * B * D, fp32
    bits, key-major)]`` as int32 words."""
    n = step.ids.numel()
    weighted = step.psw is not None
    packed = torch.empty(
        num_bags * (1 + dim) + n * (2 if weighted else 1), dtype=torch.int32, device=grad.device
    )
    packed[:num_bags] = step.offsets.diff()
    packed[num_bags : num_bags + n] = step.ids
    start = num_bags + n
    if weighted:
        packed[start : start + n].view(torch.float32).copy_(step.psw)
        start += n
    keys = num_bags // step.batch_size if step.batch_size else 0
    rows = packed[start:].view(torch.float32).view(keys, step.batch_size, dim)
    # [B, K * D] example-major (the forward's layout) -> key-major bags, as the offsets run
    rows.copy_(grad.reshape(step.batch_size, keys, dim).transpose(0, 1))
    return packed


def _unpack(packed: torch.Tensor, n: int, num_bags: int, dim: int, weighted: bool) -> tuple:
    """One rank's (lengths, ids, weights or None, gradients ``[K * B, D]``) from its words."""
    lengths = packed[:num_bags]
    ids = packed[num_bags : num_bags + n]
    start = num_bags + n
    weights = None
    if weighted:
        weights = packed[start : start + n].view(torch.float32)
        start += n
    grads = packed[start:].view(torch.float32).view(num_bags, dim)
    return lengths, ids, weights, grads
