"""``shardkit export``: the checkpoint's model as a state dict (``--quantize``: its tables stored
for serving), or as programs that serve without shardkit (``--format pt2``: a `torch.export`
program, ``--aoti``: and an AOTInductor package; see [Note: serving programs] in
``shardkit.inference``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from shardkit.modules import DataType
from shardkit.quant import quantize_table_weights

__all__ = ["QUANTIZE_CHOICES", "export", "export_pt2"]

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


_QUANTIZED_DTYPES = {"int8": torch.qint8, "int4": torch.quint4x2, "fp16": torch.float16}


def export_pt2(
    checkpoint: Path, output: Path, quantize: str | None, *, aoti: bool, schema: dict | None
) -> str:
    """Write the checkpoint's model (``shardkit train``'s DLRM or DCN) as a `torch.export`
    program ``output`` (``.pt2``: inputs ``dense [B, N]``, ``values [n]``, ``lengths [F * B]``,
    output the logits ``[B, 1]``) and, with ``aoti``, an AOTInductor package next to it
    (``<stem>-aoti.pt2``); returns what was written, in words."""
    from shardkit.checkpoint import export_checkpoint
    from shardkit.inference import aoti_package, export_program, quantize_embeddings
    from shardkit.train import model_from_state_dict

    with tempfile.TemporaryDirectory(dir=Path(output).parent or ".") as scratch:
        state = export_checkpoint(checkpoint, Path(scratch) / "float.pt")
        model, keys = model_from_state_dict(state, schema)
        dlrm: torch.nn.Module = model.model
        if quantize is not None:
            dlrm = quantize_embeddings(dlrm, dtype=_QUANTIZED_DTYPES[quantize], inplace=True)
        num_dense = state["model.dense_arch.model._mlp.0._linear.weight"].shape[1]
        program = export_program(dlrm, keys, num_dense)
        partial = Path(scratch) / "program.pt2"
        torch.export.save(program, partial)
        os.replace(partial, output)
        written = [str(output)]
        if aoti:
            package = Path(output).with_name(f"{Path(output).stem}-aoti.pt2")
            aoti_package(program, Path(scratch) / "package.pt2")
            os.replace(Path(scratch) / "package.pt2", package)
            written.append(str(package))
    tables = f"tables {quantize}" if quantize else "tables float"
    return (
        f"wrote {' and '.join(written)}: inputs dense [B, {num_dense}], values [n], lengths "
        f"[{len(keys)} * B] (keys {keys}), output logits [B, 1]; {tables}"
    )
