"""The ``torch.ops.shardkit`` operators, called with a `RowOptimizer`'s rule, state and hyperparameters.

See [Note: compiled kernel]. Callers ask `unsupported` first: the operators take CPU tables of
fp32, fp16 or bf16 with fp32 optimizer state (and CUDA tables where the CUDA build exists).
"""

from __future__ import annotations

import torch

from shardkit.optim import EmbOptimType, RowOptimizer

__all__ = [
    "bucket_rows",
    "dense_backward",
    "fused_backward",
    "pooled_forward",
    "shift_ids",
    "unsupported",
]

# The rule numbers of kernels.h's `Rule`, and the order of each rule's state tensors.
_RULES: dict[EmbOptimType, tuple[int, tuple[str, ...]]] = {
    EmbOptimType.EXACT_SGD: (1, ()),
    EmbOptimType.EXACT_ADAGRAD: (2, ("momentum1",)),
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: (3, ("momentum1",)),
    EmbOptimType.ADAM: (4, ("exp_avg", "exp_avg_sq")),
}
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_ROWS = 2**31 - 1  # rows and ids are 32-bit inside the kernel
_MAX_CUDA_DIM = 1024  # a warp per row, at most 32 values per lane (ops_cuda.cu)


def unsupported(
    weight: torch.Tensor, ids: torch.Tensor, optimizer: RowOptimizer | None
) -> str | None:
    """Why the compiled operators cannot serve this lookup, or None when they can."""
    if weight.device.type != "cpu" and not _has_device_build(weight.device):
        return f"no compiled kernel for {weight.device.type} tensors"
    if weight.device.type == "cuda" and weight.shape[1] > _MAX_CUDA_DIM:
        return f"dim > {_MAX_CUDA_DIM} on CUDA"
    if weight.dtype not in _DTYPES:
        return f"no compiled kernel for {weight.dtype} tables"
    if ids.dtype not in (torch.int32, torch.int64):
        return f"no compiled kernel for {ids.dtype} ids"
    if weight.shape[0] > _MAX_ROWS or ids.numel() > _MAX_ROWS:
        return f"more than {_MAX_ROWS} rows or ids in one lookup"
    if optimizer is not None and optimizer.kind not in _RULES:
        return f"no compiled rule for {optimizer.kind.value}"
    if optimizer is not None and any(s.dtype != torch.float32 for s in optimizer.state.values()):
        return "optimizer state that is not fp32"
    return None


def _has_device_build(device: torch.device) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        "shardkit::pooled_forward", device.type.upper()
    )


def pooled_forward(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    *,
    batch_size: int = 0,
) -> torch.Tensor:
    """``[num_bags, D]`` in the weight's dtype: each bag's (weighted) sum of rows, fp32 math.

    Args:
        weight: ``[R, D]`` contiguous.
        ids: ``[N]`` int32 or int64 rows.
        offsets: ``[num_bags + 1]`` int64.
        per_sample_weights: ``[N]`` (MEAN folded in), or None.
        batch_size: > 0 when the bags are ``K`` keys x ``batch_size`` examples, key-major: then
            bag ``(k, b)`` is written to row ``b * K + k``, so that the result viewed as
            ``[batch_size, K * D]`` is a KeyedTensor's values.
    """
    return torch.ops.shardkit.pooled_forward(
        weight, ids.contiguous(), offsets.long().contiguous(), _fp32(per_sample_weights),
        batch_size,
    )  # fmt: skip


def fused_backward(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None,
    grad_out: torch.Tensor,
    optimizer: RowOptimizer,
    *,
    grad_per_sample_weights: bool,
    batch_size: int = 0,
) -> torch.Tensor | None:
    """Apply ``optimizer``'s rule in place to the rows ``ids`` touched (its step already counted).

    Args:
        grad_out: ``[num_bags, D]`` (pooled, rows ordered as `pooled_forward` wrote them) or
            ``[N, D]`` (per id, ``offsets`` None), fp32 contiguous.
        grad_per_sample_weights: also return d loss / d per_sample_weights ``[N]`` (fp32).
        batch_size: as `pooled_forward`'s.
    """
    rule, names = _RULES[optimizer.kind]
    group = optimizer.param_group
    beta1, beta2 = group["betas"]
    return torch.ops.shardkit.fused_backward(
        weight,
        ids.contiguous(),
        None if offsets is None else offsets.long().contiguous(),
        _fp32(per_sample_weights),
        grad_out,
        [optimizer.state[name] for name in names],
        rule,
        float(group["lr"]),
        float(group["eps"]),
        float(group["weight_decay"]),
        float(beta1),
        float(beta2),
        optimizer.step,
        grad_per_sample_weights,
        batch_size,
    )


def dense_backward(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None,
    grad_out: torch.Tensor,
    *,
    grad_per_sample_weights: bool,
    batch_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gradient of the whole buffer ``[R, D]`` (weight's dtype; rows not looked up are zero),
    and d loss / d per_sample_weights ``[N]`` when asked. Arguments as `fused_backward`."""
    return torch.ops.shardkit.dense_backward(
        weight,
        ids.contiguous(),
        None if offsets is None else offsets.long().contiguous(),
        _fp32(per_sample_weights),
        grad_out,
        grad_per_sample_weights,
        batch_size,
    )


def bucket_rows(
    values: torch.Tensor, lengths: torch.Tensor, row_starts: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The compiled form of `shardkit.sharding.bucket_rows` (see [Note: compiled row
    bucketing] in ``csrc/buckets.cpp``): CPU tensors only, with the compiled kernel loaded.

    Args:
        values: ``[n]`` int64 global row ids.
        lengths: ``[B]`` int64 or int32 bag lengths, summing to ``n``.
        row_starts: the shards' first rows, ascending from 0.

    Returns:
        ``shard_lengths`` ``[S, B]`` int64, ``rebased`` ``[n]`` shard-local rows grouped by shard
        (bag by bag within a shard), ``order`` ``[n]`` the permutation of ``values`` that groups
        them.
    """
    return torch.ops.shardkit.bucket_rows(values, lengths, row_starts)


def shift_ids(ids: torch.Tensor, bases: list[int], counts: list[int]) -> torch.Tensor:
    """The compiled form of `shardkit.modules.kernel_input`'s shift (see [Note: the ids' shift
    in one pass] in ``csrc/buckets.cpp``): CPU tensors only, with the compiled kernel loaded.

    Args:
        ids: ``[N]`` int64 or int32 ids, in segments of ``counts`` ids.
        bases: per segment, the number added to its ids.
        counts: per segment, its ids; they add up to at most ``N`` (ids past them are copied).

    Returns:
        ``[N]`` int64, a new tensor.
    """
    return torch.ops.shardkit.shift_ids(ids, bases, counts)


def _fp32(weights: torch.Tensor | None) -> torch.Tensor | None:
    return None if weights is None else weights.float().contiguous()
