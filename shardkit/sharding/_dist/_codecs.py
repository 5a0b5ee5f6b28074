"""Quantized communication codecs (TorchRec's ``QuantizedCommCodec`` family and
``torchrec.distributed.fbgemm_qcomm_codec``).

A codec encodes a tensor before a collective and decodes it after; a registry maps a `CommOp`
name (``"POOLED_EMBEDDINGS_ALL_TO_ALL"``...) to the `QuantizedCommCodecs` of its forward and
backward. The sharded collections run the codecs that `get_qcomm_codecs` builds on their output
dists (``shardkit.sharding``'s [Note: compressed collectives]): FP16 and BF16 casts, and INT8
and FP8 with a scale per row ([Note: row-wise wire rows]); MX4 (FBGEMM's kernel) is refused.
"""

from __future__ import annotations

import copy
import enum
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from shardkit.sharding._dist._codec_base import NoOpQuantizedCommCodec, QuantizedCommCodec
from shardkit.sharding._dist._codec_rowwise import Fp8RowwiseCodec, Int8RowwiseCodec
from shardkit.types import CommOp, SparseType

__all__ = [
    "CommType",
    "NoOpQuantizedCommCodec",
    "QCommsConfig",
    "QuantizedCommCodec",
    "QuantizedCommCodecs",
    "comm_type_to_sparse_type",
    "get_qcomm_codecs",
    "get_qcomm_codecs_registry",
    "nonempty_codecs",
]

logger = logging.getLogger(__name__)


class _CastCodec(QuantizedCommCodec[None]):
    """Sends float32 tensors as float16 or bfloat16, scaled by ``loss_scale``."""

    def __init__(self, precision: SparseType, loss_scale: float | None = None) -> None:
        self.precision = precision
        self.loss_scale = loss_scale

    def encode(self, input_tensor: torch.Tensor, ctx: None = None) -> torch.Tensor:
        scaled = input_tensor * self.loss_scale if self.loss_scale else input_tensor
        return scaled.to(self.quantized_dtype)

    def decode(self, input_grad: torch.Tensor, ctx: None = None) -> torch.Tensor:
        out = input_grad.to(torch.float32)
        return out / self.loss_scale if self.loss_scale else out

    @property
    def quantized_dtype(self) -> torch.dtype:
        return self.precision.as_dtype()

    def __repr__(self) -> str:
        return f"{self.precision.name} codec"


@dataclass
class QuantizedCommCodecs:
    """The codecs of one comm op's forward and backward."""

    forward: QuantizedCommCodec = field(default_factory=NoOpQuantizedCommCodec)
    backward: QuantizedCommCodec = field(default_factory=NoOpQuantizedCommCodec)


@enum.unique
class CommType(enum.Enum):
    """A precision of quantized communication."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    MX4 = "mx4"

    def __str__(self) -> str:
        return self.value


def comm_type_to_sparse_type(comm_type: CommType) -> SparseType:
    """The `SparseType` of the same precision."""
    return SparseType[CommType(comm_type).name]


@dataclass
class QCommsConfig:
    """Precisions of the forward and backward comms (TorchRec's fields)."""

    forward_precision: CommType = CommType.FP32
    backward_precision: CommType = CommType.FP32
    forward_loss_scale: float | None = None
    backward_loss_scale: float | None = None
    fp8_quantize_dim: int | None = None
    fp8_quantize_dim_bwd: int | None = None
    fp8_bwd_uses_143: bool | None = False
    fp8_output_dtype: SparseType | None = None
    mx4_quantize_dim: int | None = None
    mx4_quantize_dim_bwd: int | None = None
    mx4_rounding_mode: Any = None
    output_dtype: SparseType | None = None

    def __post_init__(self) -> None:
        self.forward_precision = CommType(self.forward_precision)
        self.backward_precision = CommType(self.backward_precision)
        if self.fp8_output_dtype is not None and self.output_dtype is None:
            self.output_dtype = self.fp8_output_dtype


_CASTS = (CommType.FP32, CommType.FP16, CommType.BF16)


def _codec(
    precision: CommType, loss_scale: float | None, which: str, fp8: Any = None
) -> QuantizedCommCodec:
    if precision == CommType.MX4:
        raise ValueError(
            f"{which}_precision=MX4: MX4 comms are an FBGEMM kernel (4-bit values sharing a "
            "scale per 32), not in shardkit; use CommType.INT8 or CommType.FP8 (a scale per "
            "row, about a quarter of FP32's bytes), or CommType.FP16 or CommType.BF16 (half)"
        )
    if precision in (CommType.INT8, CommType.FP8):
        if loss_scale:  # as FBGEMM: a scale per row makes a loss scale moot
            logger.warning("%s_loss_scale=%s ignored by %s comms", which, loss_scale, precision)
        return Int8RowwiseCodec() if precision == CommType.INT8 else Fp8RowwiseCodec(fp8)
    if precision == CommType.FP32 and not loss_scale:
        return NoOpQuantizedCommCodec()
    return _CastCodec(comm_type_to_sparse_type(precision), loss_scale)


def get_qcomm_codecs(qcomms_config: QCommsConfig | None) -> QuantizedCommCodecs:
    """The forward and backward codecs of ``qcomms_config`` (no-ops for None). FP8 sends 1-4-3
    (``float8_e4m3fn``) forward and 1-5-2 (``float8_e5m2``, more range for gradients) backward,
    1-4-3 there too with ``fp8_bwd_uses_143``, as FBGEMM; its scale is per row of the
    collective, so ``fp8_quantize_dim`` is not used."""
    if qcomms_config is None:
        return QuantizedCommCodecs()
    config = qcomms_config
    backward_fp8 = torch.float8_e4m3fn if config.fp8_bwd_uses_143 else torch.float8_e5m2
    forward_fp8 = torch.float8_e4m3fn
    return QuantizedCommCodecs(
        _codec(config.forward_precision, config.forward_loss_scale, "forward", forward_fp8),
        _codec(config.backward_precision, config.backward_loss_scale, "backward", backward_fp8),
    )


def get_qcomm_codecs_registry(
    qcomms_config: QCommsConfig,
    comm_ops: list[CommOp] | None = None,
    device: torch.device | None = None,
) -> dict[str, QuantizedCommCodecs] | None:
    """``{comm op name: codecs}`` for ``comm_ops`` (default: all three), or None when both
    precisions are FP32. ``device`` is TorchRec's argument: TorchRec turns BF16 into FP16 for
    the CPU (its gloo could not carry bfloat16); torch 2.13's gloo carries it, so shardkit sends
    what was asked for on every device."""
    if (qcomms_config.forward_precision, qcomms_config.backward_precision) == (
        CommType.FP32,
        CommType.FP32,
    ):
        return None
    registry = {}
    for comm_op in comm_ops if comm_ops is not None else list(CommOp):
        config = copy.deepcopy(qcomms_config)
        registry[CommOp(comm_op).name] = get_qcomm_codecs(config)
    return registry


def nonempty_codecs(registry: dict[str, QuantizedCommCodecs] | None) -> list[str]:
    """``"<comm op>: <direction> <codec>"`` for each codec of ``registry`` that is not a no-op."""
    found = []
    for name, codecs in (registry or {}).items():
        for direction in ("forward", "backward"):
            codec = getattr(codecs, direction)
            if not isinstance(codec, NoOpQuantizedCommCodec):
                found.append(f"{name}: {direction} {codec!r}")
    return found
