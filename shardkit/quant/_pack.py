"""Row-wise quantized table storage on torch's own quantized embedding-bag operators.

[Note: quantized rows]
A table of ``[rows, D]`` floats is stored as torch's CPU operators
(``torch.ops.quantized.embedding_bag_*``) lay rows out:

    FP32   float32 [rows, D]
    FP16   float16 [rows, D]
    INT8   uint8 [rows, D + 8]       D codes, then float32 scale and bias
    INT4   uint8 [rows, D / 2 + 4]   two codes a byte, then float16 scale and bias (D even)
    INT2   uint8 [rows, D / 4 + 4]   four codes a byte, then float16 scale and bias (D % 4 == 0)

An n-bit row is ``value = code * scale + bias``, quantized as FBGEMM (TorchRec) does for every
n: ``bias = min(row)`` rounded to float16, ``scale = (max(row) - bias) / (2**n - 1)`` rounded to
float16, ``code = round((x - bias) / scale)``; so every value is within about ``scale / 2`` of the
float it came from, and the codes, scales and biases are TorchRec's bit for bit (INT8's float32
scale and bias hold float16 values). Pooling sums dequantized rows in float32 (FP16 too, as
FBGEMM does: torch's float16 embedding bag would round the pooled vector). TorchRec's ``state_dict`` lays the same rows out FBGEMM's way (float16 scale and bias
first, rows padded to 16 bytes): ``shardkit.quant`` reads and writes that layout too (see
[Note: TorchRec's quantized rows]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardkit.modules import DataType

__all__ = [
    "QUANTIZED",
    "check_data_type",
    "code_columns",
    "lookup",
    "pack",
    "packed_shape",
    "unpack",
]

_OPS = torch.ops.quantized
QUANTIZED = (DataType.INT8, DataType.INT4, DataType.INT2)
_CODES_PER_BYTE = {DataType.INT8: 1, DataType.INT4: 2, DataType.INT2: 4}
_SCALE_BIAS_BYTES = {DataType.INT8: 8, DataType.INT4: 4, DataType.INT2: 4}
_SERVED = (DataType.FP32, DataType.FP16, *QUANTIZED)


def check_data_type(table: str, data_type: DataType, dim: int) -> None:
    """Refuse a data type the table cannot be served in, naming the table and what works."""
    if data_type not in _SERVED:
        raise ValueError(
            f"table '{table}': data type {data_type} cannot be served quantized; use one of "
            f"{', '.join(t.value for t in _SERVED)}"
        )
    per_byte = _CODES_PER_BYTE.get(data_type, 1)
    if dim % per_byte:
        raise ValueError(
            f"table '{table}': {data_type} packs {per_byte} values a byte, so embedding_dim must "
            f"be a multiple of {per_byte} (got {dim}); use INT8 or FP16 for this table"
        )


def packed_shape(rows: int, dim: int, data_type: DataType) -> tuple[tuple[int, int], torch.dtype]:
    """The shape and dtype of a stored table (see [Note: quantized rows])."""
    if data_type == DataType.FP32:
        return (rows, dim), torch.float32
    if data_type == DataType.FP16:
        return (rows, dim), torch.float16
    width = dim // _CODES_PER_BYTE[data_type] + _SCALE_BIAS_BYTES[data_type]
    return (rows, width), torch.uint8


def code_columns(dim: int, data_type: DataType) -> int:
    """Columns of a stored row that hold the values (the rest: scale and bias)."""
    return dim // _CODES_PER_BYTE.get(data_type, 1)


def pack(weight: torch.Tensor, data_type: DataType) -> torch.Tensor:
    """``[rows, D]`` float -> the stored table (meta in, meta out)."""
    weight = weight.detach()
    if data_type == DataType.FP32:
        return weight.float().contiguous()
    if data_type == DataType.FP16:
        return weight.half().contiguous()
    if weight.device.type == "meta":
        rows, dim = weight.shape
        shape, dtype = packed_shape(rows, dim, data_type)
        return torch.empty(shape, dtype=dtype, device="meta")
    weight = weight.float().contiguous().cpu()
    if data_type == DataType.INT8:
        return _pack_int8(weight)
    if data_type == DataType.INT4:
        return _OPS.embedding_bag_4bit_prepack(weight)
    return _OPS.embedding_bag_2bit_prepack(weight)


def _pack_int8(weight: torch.Tensor) -> torch.Tensor:
    """FBGEMM's 8-bit rule (torch's ``embedding_bag_byte_prepack`` keeps float32 scales and
    biases; TorchRec rounds them to float16 first): codes, then float32 scale and bias."""
    bias = weight.min(dim=1, keepdim=True).values.half().float()  # [rows, 1]
    top = weight.max(dim=1, keepdim=True).values
    scale = ((top - bias) / 255).half().float()
    degenerate = (scale == 0) | torch.isinf(1.0 / scale)  # a constant row: any scale works
    scale = torch.where(degenerate, torch.ones_like(scale), scale)
    codes = torch.round((weight - bias) * (1.0 / scale)).clamp_(0, 255).to(torch.uint8)
    scale_bias = torch.cat([scale, bias], dim=1).view(torch.uint8)  # [rows, 8]
    return torch.cat([codes, scale_bias], dim=1)


def unpack(packed: torch.Tensor, data_type: DataType) -> torch.Tensor:
    """The stored table -> ``[rows, D]`` float32, the values its lookups use."""
    if data_type in (DataType.FP32, DataType.FP16):
        return packed.float()
    if data_type == DataType.INT8:
        return _OPS.embedding_bag_byte_unpack(packed)
    if data_type == DataType.INT4:
        return _OPS.embedding_bag_4bit_unpack(packed)
    return _OPS.embedding_bag_2bit_unpack(packed)


def lookup(
    packed: torch.Tensor,
    data_type: DataType,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Sum-pooled rows ``[bags, D]`` float32: bag ``b`` is ``ids[offsets[b]:offsets[b + 1]]``
    (``offsets`` ``[bags + 1]``), each row times its ``per_sample_weights`` entry if given."""
    if data_type == DataType.FP16:
        # summed in float16, the pooled vector would be rounded (and each weighted product):
        # sum float32 copies of the rows, as FBGEMM (TorchRec) does
        rows = packed.index_select(0, ids).float()  # [N, D]
        each = torch.arange(ids.numel(), device=ids.device)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.float()
        return F.embedding_bag(each, rows, offsets, mode="sum", include_last_offset=True,
                               per_sample_weights=per_sample_weights)  # fmt: skip
    if data_type in (DataType.FP32, DataType.FP16):
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.float()
        pooled = F.embedding_bag(
            ids, packed, offsets, mode="sum", per_sample_weights=per_sample_weights,
            include_last_offset=True,
        )  # fmt: skip
        return pooled.float()
    op = {
        DataType.INT8: _OPS.embedding_bag_byte_rowwise_offsets,
        DataType.INT4: _OPS.embedding_bag_4bit_rowwise_offsets,
        DataType.INT2: _OPS.embedding_bag_2bit_rowwise_offsets,
    }[data_type]
    if per_sample_weights is not None:
        per_sample_weights = per_sample_weights.float()
    return op(packed, ids, offsets, mode=0, per_sample_weights=per_sample_weights,
              include_last_offset=True)  # fmt: skip
