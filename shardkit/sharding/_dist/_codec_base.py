"""The interface of TorchRec's quantized comm codecs and its no-op (float32) codec."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import torch

__all__ = ["NoOpQuantizedCommCodec", "QuantizedCommCodec"]

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
