"""Quantized rows in TorchRec's ``state_dict`` layout, read and written.

[Note: TorchRec's quantized rows]
shardkit stores rows as torch's quantized operators want them ([Note: quantized rows]); TorchRec
stores the same quantization as FBGEMM's inference kernel wants it. Per row of ``D`` values,
with ``A`` the row alignment (16 bytes unless ``quant_prep_customize_row_alignment`` said
otherwise) and every TorchRec row uint8, padded with zeros to a multiple of ``A`` bytes:

    type   shardkit                                  TorchRec
    FP32   float32 [D]                               the D floats' bytes
    FP16   float16 [D]                               the D halves' bytes
    INT8   D codes, float32 scale, float32 bias      float16 scale, float16 bias, D codes
    INT4   D/2 bytes, float16 scale, float16 bias    float16 scale, float16 bias, D/2 bytes
    INT2   D/4 bytes, float16 scale, float16 bias    float16 scale, float16 bias, D/4 bytes

TorchRec's INT4/INT2 buffers are ``UInt4Tensor``/``UInt2Tensor`` (uint8 data whose last size
counts values, not bytes); their bytes are ``t.view(torch.uint8)``. With
``quant_state_dict_split_scale_bias`` TorchRec's ``weight`` holds only the codes (unpadded) and
``weight_qscale``/``weight_qbias`` are float16 ``[rows, 1]``. Scales and biases are float16 in
both (shardkit's INT8 keeps float16 values in float32: `pack`), so conversions are exact both
ways.

Telling the layouts apart when loading: a float table is stored as floats by shardkit and as
bytes by TorchRec; a ``UInt4Tensor``/``UInt2Tensor`` is TorchRec's; otherwise the width decides.
Where both widths agree, an INT8 row's trailing bytes say: TorchRec pads them with zeros, shardkit
keeps the float32 bias there. INT4 rows of ``D % 32 == 24`` (INT2: ``D % 64 == 48``) given as
plain bytes have one width and no padding in both: they are read as shardkit's.
"""

from __future__ import annotations

import torch

from shardkit.modules import DataType
from shardkit.quant._pack import code_columns
from shardkit.tensor_types import UInt2Tensor, UInt4Tensor

__all__ = ["from_torchrec", "is_torchrec_rows", "raw_bytes", "to_torchrec", "torchrec_width"]

_FLOATS = {DataType.FP32: torch.float32, DataType.FP16: torch.float16}


def _align(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


def torchrec_width(dim: int, data_type: DataType, alignment: int = 16) -> int:
    """Bytes of one TorchRec row (unsplit)."""
    if data_type in _FLOATS:
        return _align(dim * _FLOATS[data_type].itemsize, alignment)
    return _align(4 + code_columns(dim, data_type), alignment)


def raw_bytes(value: torch.Tensor) -> torch.Tensor:
    """The uint8 data of ``value``; a ``UInt4Tensor``/``UInt2Tensor`` gives its bytes."""
    elem = getattr(value, "elem", None)
    if isinstance(elem, torch.Tensor) and type(value).__name__.startswith("UInt"):
        return elem
    return value


def is_torchrec_rows(value: torch.Tensor, dim: int, data_type: DataType, alignment: int) -> bool:
    """Whether a stored table ``value`` is in TorchRec's layout (see the Note's last part)."""
    if data_type in _FLOATS:
        return value.dtype == torch.uint8
    if raw_bytes(value) is not value:
        return True
    width = value.shape[-1] if value.dim() == 2 else -1
    ours = code_columns(dim, data_type) + (8 if data_type == DataType.INT8 else 4)
    theirs = torchrec_width(dim, data_type, alignment)
    if width != theirs:
        return False
    if width != ours:
        return True
    padding = theirs - 4 - code_columns(dim, data_type)
    return data_type == DataType.INT8 and padding > 0 and not value[:, -padding:].any()


def from_torchrec(
    weight: torch.Tensor,
    dim: int,
    data_type: DataType,
    *,
    qscale: torch.Tensor | None = None,
    qbias: torch.Tensor | None = None,
) -> torch.Tensor:
    """TorchRec's rows (with its split ``qscale``/``qbias`` if given) -> shardkit's."""
    data = raw_bytes(weight).contiguous()
    if data_type in _FLOATS:
        size = dim * _FLOATS[data_type].itemsize
        return data[:, :size].contiguous().view(_FLOATS[data_type])
    codes = code_columns(dim, data_type)
    if qscale is not None and qbias is not None:
        scale, bias = qscale.reshape(-1, 1).half(), qbias.reshape(-1, 1).half()
        code_bytes = data[:, :codes]
    else:
        halves = data[:, :4].contiguous().view(torch.float16)  # [rows, 2]
        scale, bias = halves[:, :1], halves[:, 1:]
        code_bytes = data[:, 4 : 4 + codes]
    if data_type == DataType.INT8:
        scale_bias = torch.cat([scale.float(), bias.float()], dim=1).view(torch.uint8)
    else:
        scale_bias = torch.cat([scale, bias], dim=1).view(torch.uint8)
    return torch.cat([code_bytes, scale_bias], dim=1)


def to_torchrec(
    packed: torch.Tensor, dim: int, data_type: DataType, *, alignment: int = 16, split: bool
) -> dict[str, torch.Tensor]:
    """shardkit's rows -> TorchRec's ``{"weight": ...}`` (uint8; INT4/INT2 as TorchRec's
    ``UInt4Tensor``/``UInt2Tensor``), with ``weight_qscale`` and ``weight_qbias`` for the n-bit
    types when ``split``."""
    rows = packed.shape[0]
    if data_type in _FLOATS:
        data = packed.contiguous().view(torch.uint8)
        pad = torchrec_width(dim, data_type, alignment) - data.shape[1]
        return {"weight": torch.cat([data, data.new_zeros(rows, pad)], dim=1)}
    codes = code_columns(dim, data_type)
    code_bytes, tail = packed[:, :codes], packed[:, codes:].contiguous()
    if data_type == DataType.INT8:
        scale, bias = tail.view(torch.float32).half().unbind(1)
    else:
        scale, bias = tail.view(torch.float16).unbind(1)
    if split:
        return {"weight": _typed(code_bytes.contiguous(), data_type),
                "weight_qscale": scale.reshape(-1, 1), "weight_qbias": bias.reshape(-1, 1)}  # fmt: skip
    head = torch.stack([scale, bias], dim=1).view(torch.uint8)  # [rows, 4]
    pad = torchrec_width(dim, data_type, alignment) - 4 - codes
    weight = torch.cat([head, code_bytes, packed.new_zeros(rows, pad)], dim=1)
    return {"weight": _typed(weight, data_type)}


def _typed(data: torch.Tensor, data_type: DataType) -> torch.Tensor:
    """INT4/INT2 bytes in TorchRec's buffer types."""
    if data_type == DataType.INT4:
        return UInt4Tensor(data)
    if data_type == DataType.INT2:
        return UInt2Tensor(data)
    return data
