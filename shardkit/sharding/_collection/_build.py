"""How a sharded collection builds its parts from the unsharded module: each table's kernel
key, the initial values of its shards and the replica of its data-parallel DENSE tables (the
fused optimizer over its FUSED shards and replicas: `_fused_optimizer`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules import BaseEmbeddingConfig, data_type_to_dtype
from shardkit.optim import EmbOptimType, FusedOptimizerConfig, fused_config_of
from shardkit.sharding._layout import ShardSlice
from shardkit.types import EmbeddingComputeKernel, ParameterSharding

__all__ = [
    "DEFAULT_FUSED",
    "check_row_norm_rules",
    "local_replica",
    "mark_column_split_dense",
    "shard_initialiser",
    "table_keys",
]

# The fused optimizer of a FUSED table nobody chose one for (FBGEMM's and TorchRec's default).
DEFAULT_FUSED = FusedOptimizerConfig(EmbOptimType.EXACT_SGD, learning_rate=0.01)


def table_keys(
    configs: Sequence[BaseEmbeddingConfig],
    weights: Sequence[torch.Tensor],
    *,
    plan: Mapping[str, ParameterSharding],
    fused_params: Mapping[str, Any] | None,
    module_default: FusedOptimizerConfig | None,
) -> list[tuple]:
    """Each table's (dtype, fused optimizer config or None for DENSE), in table order.

    A FUSED table's optimizer: its weight's own (`apply_optimizer_in_backward`), else
    ``fused_params``, else the module's, else `DEFAULT_FUSED`.
    """
    default = None
    if fused_params is not None:
        default = FusedOptimizerConfig.from_fused_params(fused_params)
    keys: list[tuple[torch.dtype, FusedOptimizerConfig | None]] = []
    for config, param in zip(configs, weights):
        dtype = data_type_to_dtype(config.data_type)
        if plan[config.name].compute_kernel != EmbeddingComputeKernel.FUSED:
            keys.append((dtype, None))
            continue
        chosen = fused_config_of(param) or default or module_default or DEFAULT_FUSED
        keys.append((dtype, chosen))
    return keys


def check_row_norm_rules(
    configs: Sequence[BaseEmbeddingConfig],
    keys: Sequence[tuple],
    *,
    plan: Mapping[str, ParameterSharding],
    shards_of: Callable[[str], list[ShardSlice]],
) -> None:
    """Refuse a fused rule that scales each row's step by norms over the whole row (LAMB,
    LARS_SGD, PARTIAL_ROWWISE_LAMB) on a table whose shards split its columns: each shard would
    take the norms of its own columns and step differently from the unsharded table.

    The plan and the fused configs are the same on every rank, so every rank raises alike,
    before any collective.
    """
    for config, (_, fused) in zip(configs, keys):
        if fused is None or not fused.optimizer.scales_by_row_norms:
            continue
        widths = sorted({(s.col_start, s.cols) for s in shards_of(config.name)})
        if len(widths) < 2:
            continue
        raise ValueError(
            f"table {config.name!r} has the fused optimizer {fused.optimizer.name}, which scales "
            f"each row's step by norms over the whole row, but its "
            f"{plan[config.name].sharding_type.value} plan splits its {config.embedding_dim} columns "
            f"into shards of {[cols for _, cols in widths]} (each would take the norms of its "
            "own columns, unlike the unsharded module); plan it table_wise, row_wise or "
            "table_row_wise, or use a rule without row norms (e.g. EXACT_ROWWISE_ADAGRAD)"
        )


def mark_column_split_dense(
    module: nn.Module,
    configs: Sequence[BaseEmbeddingConfig],
    keys: Sequence[tuple],
    *,
    shards_of: Callable[[str], list[ShardSlice]],
) -> None:
    """Mark every parameter of ``module`` that a dense optimizer steps (no in-backward
    optimizer: DENSE shards and replicas) with the names of its DENSE tables whose shards split
    the columns, so that a dense rule taking norms over whole rows (`shardkit.optim.LAMB`,
    `LarsSGD`, `PartialRowWiseLAMB`) refuses them ([Note: layer-wise rules per row]).

    Every such parameter carries the whole collection's list (from the plan, the same on every
    rank), not only its own table's, so that every rank whose optimizer holds a dense
    parameter of this collection refuses alike.
    """
    split = []
    for config, (_, fused) in zip(configs, keys):
        widths = {(s.col_start, s.cols) for s in shards_of(config.name)}
        if fused is None and len(widths) > 1:
            split.append(config.name)
    if not split:
        return
    for param in module.parameters():
        if not hasattr(param, "_in_backward_optimizers"):
            param._shardkit_column_split_tables = tuple(split)  # type: ignore[attr-defined]


def shard_initialiser(
    configs: Sequence[BaseEmbeddingConfig], weights: Sequence[torch.Tensor]
) -> Callable[[ShardSlice, torch.Tensor], None]:
    """``initial(shard, view)``: copies the shard's block of the module's weight into ``view``,
    or initialises it uniformly where the weight is on "meta"."""
    by_name = {c.name: (c, w) for c, w in zip(configs, weights)}

    def initial(shard: ShardSlice, view: torch.Tensor) -> None:
        config, full = by_name[shard.table]
        if full.device.type == "meta":  # initialised where it lives, as TorchRec does
            view.uniform_(config.get_weight_init_min(), config.get_weight_init_max())
            return
        rows = slice(shard.row_start, shard.row_start + shard.rows)
        cols = slice(shard.col_start, shard.col_start + shard.cols)
        view.copy_(full.detach()[rows, cols])  # from the module's device, once

    return initial


def local_replica(
    module: Any,
    configs: Sequence[BaseEmbeddingConfig],
    weights: Sequence[torch.Tensor],
    *,
    names: Sequence[str],
    device: torch.device,
    tables_attr: str,
) -> nn.Module | None:
    """A collection of type ``type(module)`` holding the tables ``names`` (data-parallel, DENSE),
    their weights copied from ``weights`` unless on "meta"; None when ``names`` is empty."""
    unique = [c for c in configs if c.name in set(names)]
    if not unique:
        return None
    kwargs = {"is_weighted": module.is_weighted()} if hasattr(module, "is_weighted") else {}
    local = type(module)(tables=unique, device=device, validate_ids=module.validate_ids, **kwargs)
    source = dict(zip((c.name for c in configs), weights))
    with torch.no_grad():
        for config in unique:
            if source[config.name].device.type != "meta":
                getattr(local, tables_attr)[config.name].weight.copy_(source[config.name])
    return local
