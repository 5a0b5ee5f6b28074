"""``shardkit export --quantize``: the exported model with its tables stored for serving."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from shardkit.modules import DataType
from shardkit.quant import quantize_table_weights

__all__ = ["QUANTIZE_CHOICES", "export"]

QUANTIZE_CHOICES = {"int8": DataType.INT8, "int4": DataType.INT4, "fp16": DataType.FP16}


def export(checkpoint: Path, output: Path, quantize: str | None) -> str:
    """Write the checkpoint's unsharded model to ``output`` (tables quantized if asked);
    returns what was written, in words."""
    from shardkit.checkpoint import export_checkpoint

    if quantize is None:
        state = export_checkpoint(checkpoint, output)
        return f"wrote {len(state)} tensors to {output}"
    with tempfile.TemporaryDirectory(dir=Path(output).parent or ".") as scratch:
        state = export_checkpoint(checkpoint, Path(scratch) / "float.pt")
        quantized = quantize_table_weights(state, QUANTIZE_CHOICES[quantize])  # refuses first
        partial = Path(scratch) / "quantized.pt"
        torch.save(quantized, partial)
        os.replace(partial, output)
    return (
        f"wrote {len(quantized)} tensors to {output}: tables {quantize} "
        f"{_megabytes(quantized):.2f} MB (float {_megabytes(state):.2f} MB), dense layers float"
    )


def _megabytes(state: dict[str, torch.Tensor]) -> float:
    tables = [v for k, v in state.items() if ".embedding_bags." in k or ".embeddings." in k]
    return sum(t.numel() * t.element_size() for t in tables) / 2**20
