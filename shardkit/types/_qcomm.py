"""Quantized communication codecs (TorchRec's ``QuantizedCommCodec`` family and
``torchrec.distributed.fbgemm_qcomm_codec``).

A codec encodes a tensor before a collective and decodes it after; a registry maps a `CommOp`
name (``"POOLED_EMBEDDINGS_ALL_TO_ALL"``...) to the `QuantizedCommCodecs` of its forward and
backward. The sharded collections run the FP16 and BF16 casts that `get_qcomm_codecs` builds on
their output dists (``shardkit.sharding``'s [Note: compressed collectives]); FP8, INT8 and MX4
are FBGEMM kernels and are refused.
"""

from __future__ import annotations

import copy
import enum
import logging
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from shardkit.types._fbgemm import SparseType
from shardkit.types._params import CommOp

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

Ctx = TypeVar("Ctx")


class QuantizedCommCodec(Generic[Ctx]):
    """The interface of a codec: ``decode(collective(encode(x)))`` is about ``x``."""

    def encode(self, input_tensor: torch.Tensor, ctx: Ctx | None = None) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, input_grad: torch.Tensor, ctx: Ctx | None = None) -> torch.Tensor:
        raise NotImplementedError

    @property
    def quantized_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def calc_quantized_size(self, input_len: int, ctx: Ctx | None = None) -> int:
        return input_len

    def create_context(self) -> Ctx | None:
        return None

    def padded_size(
        self, input_tensor: torch.Tensor, dim_per_rank: list[int], my_rank: int, qcomm_ctx: Any
    ) -> tuple[int, int]:
        """``(padded dim sum, padding)`` of ``input_tensor``; no padding here."""
        return input_tensor.shape[0 if input_tensor.dim() == 1 else 1], 0


class NoOpQuantizedCommCodec(QuantizedCommCodec[Ctx]):
    """Sends tensors as they are (float32)."""

    def encode(self, input_tensor: torch.Tensor, ctx: Ctx | None = None) -> torch.Tensor:
        return input_tensor

    def decode(self, input_grad: torch.Tensor, ctx: Ctx | None = None) -> torch.Tensor:
        return input_grad

    @property
    def quantized_dtype(self) -> torch.dtype:
        return torch.float


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


def _codec(precision: CommType, loss_scale: float | None, which: str) -> QuantizedCommCodec:
    if precision not in _CASTS:
        raise ValueError(
            f"{which}_precision={precision.name}: FP8, INT8 and MX4 comms are FBGEMM kernels (a "
            "row-wise scale per row, no sums in a reduce-scatter), not in shardkit; use "
            "CommType.FP16 or CommType.BF16 (half the bytes of FP32), or FP32"
        )
    if precision == CommType.FP32 and not loss_scale:
        return NoOpQuantizedCommCodec()
    return _CastCodec(comm_type_to_sparse_type(precision), loss_scale)


def get_qcomm_codecs(qcomms_config: QCommsConfig | None) -> QuantizedCommCodecs:
    """The forward and backward codecs of ``qcomms_config`` (no-ops for None)."""
    if qcomms_config is None:
        return QuantizedCommCodecs()
    return QuantizedCommCodecs(
        _codec(qcomms_config.forward_precision, qcomms_config.forward_loss_scale, "forward"),
        _codec(qcomms_config.backward_precision, qcomms_config.backward_loss_scale, "backward"),
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
