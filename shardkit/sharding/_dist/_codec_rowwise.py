"""Row-wise quantized communication codecs: INT8 (a float32 scale and bias per row, FBGEMM's
fused 8-bit row-wise layout) and FP8 (a float32 scale per row, ``float8_e4m3fn`` forward and
``float8_e5m2`` backward, as FBGEMM's FP8 row-wise comms).

[Note: row-wise wire rows]
A collective's rows ``[N, D]`` (one pooled bag, or one looked-up id, per row) go on the wire as
``uint8`` rows ``[N, D + k]``: the ``D`` quantized values, then the row's float32 parameters as
bytes (``k = 8`` for INT8's scale and bias, ``k = 4`` for FP8's scale). The parameters travel
inside their row, so an all-to-all's split sizes (rows per rank) stay those of the float32 rows
and only the row width changes; ``uint8`` is carried by gloo and NCCL alike, which float8 is not.
A row holding a NaN or an infinity has a non-finite scale, so it comes back non-finite (never
as finite numbers).
Encoded rows cannot be summed, so a reduce-scatter of them is an all-to-all followed by decoding
and a float32 sum (``shardkit.sharding``'s [Note: compressed collectives]).

Rounding, per element ``x`` of a row whose largest magnitude is ``m``:
- INT8: ``|error| <= (max - min) / 510 <= m / 255`` (half a step of 255 steps over the row's
  range).
- FP8 (a row scaled so ``m`` lands on the format's largest value ``F``): ``|error| <=
  2^-(mantissa bits + 1) * |x| + 2^-(mantissa bits + 1) * 2^(1 - bias) * m / F``: a relative
  half unit in the last place for normal numbers, half the subnormal spacing below them.
"""

from __future__ import annotations

import torch

from shardkit.sharding._dist._codec_base import QuantizedCommCodec

__all__ = ["Fp8RowwiseCodec", "Int8RowwiseCodec"]


class Int8RowwiseCodec(QuantizedCommCodec[None]):
    """Sends float32 rows ``[N, D]`` as ``uint8`` rows ``[N, D + 8]``: each value as
    ``round((x - min) / scale)`` with ``scale = (max - min) / 255``, then the row's scale and min
    as float32 bytes. See [Note: row-wise wire rows]."""

    def encode(self, input_tensor: torch.Tensor, ctx: None = None) -> torch.Tensor:
        x = _rows(input_tensor)  # [N, D]
        low = x.amin(1, keepdim=True)
        scale = (x.amax(1, keepdim=True) - low) / 255
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # NaN stays: see decode
        values = ((x - low) / scale).round_().clamp_(0, 255).to(torch.uint8)
        params = torch.cat([scale, low], dim=1).contiguous().view(torch.uint8)  # [N, 8]
        return torch.cat([values, params], dim=1)  # [N, D + 8]

    def decode(self, input_grad: torch.Tensor, ctx: None = None) -> torch.Tensor:
        width = input_grad.shape[1] - 8
        params = (
            input_grad[:, width:].clone(memory_format=torch.contiguous_format).view(torch.float32)
        )  # [N, 2]
        return input_grad[:, :width].to(torch.float32) * params[:, :1] + params[:, 1:]

    @property
    def quantized_dtype(self) -> torch.dtype:
        return torch.uint8

    def calc_quantized_size(self, input_len: int, ctx: None = None) -> int:
        """Bytes of one encoded row of ``input_len`` values."""
        return input_len + 8

    def __repr__(self) -> str:
        return "INT8 row-wise codec"


class Fp8RowwiseCodec(QuantizedCommCodec[None]):
    """Sends float32 rows ``[N, D]`` as ``uint8`` rows ``[N, D + 4]``: each value as ``x /
    scale`` in ``dtype`` (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``) with ``scale =
    max |x| / F`` (``F`` the format's largest value), then the scale as float32 bytes. See
    [Note: row-wise wire rows]."""

    def __init__(self, dtype: torch.dtype) -> None:
        if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise ValueError(
                f"Fp8RowwiseCodec(dtype={dtype}): FP8 comms use torch.float8_e4m3fn (1-4-3) or "
                "torch.float8_e5m2 (1-5-2)"
            )
        self.dtype = dtype
        self.largest = torch.finfo(dtype).max

    def encode(self, input_tensor: torch.Tensor, ctx: None = None) -> torch.Tensor:
        x = _rows(input_tensor)  # [N, D]
        scale = x.abs().amax(1, keepdim=True) / self.largest
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # NaN stays: see decode
        # float8_e4m3fn has no infinity: past F is NaN. x / scale is at most a float32 ulp past
        # F, which the cast rounds back to F; the clamp makes that not rest on rounding
        values = (x / scale).clamp_(-self.largest, self.largest).to(self.dtype)
        return torch.cat([values.view(torch.uint8), scale.view(torch.uint8)], dim=1)

    def decode(self, input_grad: torch.Tensor, ctx: None = None) -> torch.Tensor:
        width = input_grad.shape[1] - 4
        scale = (
            input_grad[:, width:].clone(memory_format=torch.contiguous_format).view(torch.float32)
        )  # [N, 1]
        return _fp8_to_float(input_grad[:, :width], self.dtype) * scale

    @property
    def quantized_dtype(self) -> torch.dtype:
        return torch.uint8

    def calc_quantized_size(self, input_len: int, ctx: None = None) -> int:
        """Bytes of one encoded row of ``input_len`` values."""
        return input_len + 4

    def __repr__(self) -> str:
        name = "1-4-3" if self.dtype == torch.float8_e4m3fn else "1-5-2"
        return f"FP8 ({name}) row-wise codec"


def _fp8_to_float(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 values of the float8 ``codes`` (uint8), through float16, whose bits hold them:
    1-5-2 is float16's top byte; 1-4-3 sits in float16's bits at 2^-8 of its value (float16's
    exponent bias is 8 more), subnormals too. 3x to 9x faster than torch's float8 -> float32
    on CPU. The NaN codes are not kept: a row with a NaN or an infinity has a non-finite scale,
    so its values come back non-finite all the same."""
    wide = codes.to(torch.int16)
    if dtype == torch.float8_e5m2:
        return (wide << 8).view(torch.float16).to(torch.float32)
    bits = ((wide & 0x7F) << 7) | ((wide & 0x80) << 8)
    return bits.view(torch.float16).to(torch.float32) * 256.0


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(
            f"row-wise comm codecs encode [rows, width] tensors; got shape {tuple(x.shape)}: "
            "flatten the leading dimensions first"
        )
    return x.to(torch.float32)
