"""A model as a `torch.export` program and an AOTInductor package that serve without shardkit.

[Note: serving programs]
A serving process should need torch and nothing else. So the program `export_program` writes
takes plain tensors, ``dense [B, N]`` float, ``values [n]`` int64 ids and ``lengths [F * B]``
int64 ids per bag (key-major, as a KeyedJaggedTensor's: the KJT is built inside, its keys
fixed at export), and returns the model's output tensor: no shardkit type appears in its
signature, and no ``shardkit`` operator in its graph (the collections export to aten operators,
see [Note: exported lookups] in ``shardkit.modules``; quantized tables to torch's
``quantized::`` operators). The batch size ``B`` and the number of ids ``n`` are `Dim`s, so one
program serves every batch, a batch of one included (traced with ``backed_size_oblivious``: a
size is not specialized for being 1). `torch.export.save` writes it (``.pt2``), `torch.export.load`
reads it back; `aoti_package` compiles it with AOTInductor into a package of C++ for this
CPU that `torch._inductor.aoti_load_package` runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from shardkit.sparse import KeyedJaggedTensor

__all__ = ["FlatInputs", "aoti_package", "export_program"]


class FlatInputs(nn.Module):
    """``model(dense, KeyedJaggedTensor)`` as a module of plain tensors (see [Note: serving
    programs]).

    Args:
        model: called as ``model(dense, kjt)``; returns a tensor (e.g. DLRM's logits ``[B, 1]``).
        keys: the KJT's keys, in the order of ``lengths``.
    """

    def __init__(self, model: nn.Module, keys: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.keys = list(keys)

    def forward(
        self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """``dense`` ``[B, N]``, ``values`` ``[n]``, ``lengths`` ``[F * B]`` -> the model's output."""
        return self.model(dense, KeyedJaggedTensor(self.keys, values, lengths=lengths))


def example_inputs(
    keys: Sequence[str], num_dense: int, batch_size: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs to trace with: ``batch_size`` examples, bags of 0-2 ids of row 0 (a row every
    table has), as many ids as will not equal any other size (a `Dim` must stay free)."""
    lengths = torch.arange(len(keys) * batch_size, dtype=torch.int64) % 3  # [F * B]
    values = torch.zeros(int(lengths.sum()), dtype=torch.int64)
    return torch.zeros(batch_size, num_dense), values, lengths


def export_program(
    model: nn.Module, keys: Sequence[str], num_dense: int
) -> torch.export.ExportedProgram:
    """``model`` (called as ``model(dense, kjt)``, in eval mode) as a program of plain tensors
    with a dynamic batch size and number of ids (see [Note: serving programs])."""
    flat = FlatInputs(model, keys).eval()
    batch, ids = torch.export.Dim("batch", min=1), torch.export.Dim("ids", min=0)
    shapes = {"dense": {0: batch}, "values": {0: ids}, "lengths": {0: len(keys) * batch}}
    # a batch of one too: reason about sizes as if >= 2 without guarding on it (torch's
    # 0/1 specialization would otherwise trace the program for batches of 2 or more)
    oblivious = torch.fx.experimental._config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]
    with torch.no_grad(), oblivious:
        return torch.export.export(flat, example_inputs(keys, num_dense), dynamic_shapes=shapes)


def aoti_package(program: torch.export.ExportedProgram, path: str | os.PathLike) -> Path:
    """Compile ``program`` with AOTInductor for this CPU into the package ``path`` (``.pt2``);
    a process loads it with ``torch._inductor.aoti_load_package(path)``. Takes 20-60 s (a C++
    build)."""
    path = Path(path)
    return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(path)))
