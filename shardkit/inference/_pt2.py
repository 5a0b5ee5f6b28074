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

A module that takes the KJT alone (an embedding collection, a managed-collision collection in
eval mode) exports the same way with ``num_dense=None``: ``values`` and ``lengths`` in. An output
that is not one tensor (a `KeyedTensor`, a dict of `JaggedTensor`s, a managed-collision
collection's pair) leaves the program as the tuple of its tensors in pytree order (`plain`), so
that no shardkit type is in the program's output either: a `KeyedTensor` gives its values
``[B, sum(dims)]``, a ``JaggedTensor`` its values and lengths (and offsets when it holds them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shardkit.sparse import KeyedJaggedTensor

__all__ = ["FlatInputs", "FlatSparseInputs", "aoti_package", "export_program", "plain"]


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
        return plain(self.model(dense, KeyedJaggedTensor(self.keys, values, lengths=lengths)))


class FlatSparseInputs(nn.Module):
    """``model(KeyedJaggedTensor)`` as a module of plain tensors: `FlatInputs` without dense
    features (e.g. an embedding collection).

    Args:
        model: called as ``model(kjt)``.
        keys: the KJT's keys, in the order of ``lengths``.
    """

    def __init__(self, model: nn.Module, keys: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.keys = list(keys)

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> Any:
        """``values`` ``[n]``, ``lengths`` ``[F * B]`` -> the model's output, `plain`."""
        return plain(self.model(KeyedJaggedTensor(self.keys, values, lengths=lengths)))


def plain(output: Any) -> Any:
    """``output`` if it is a tensor, else the tuple of its tensors in pytree order (see [Note:
    serving programs])."""
    if isinstance(output, torch.Tensor):
        return output
    leaves = torch.utils._pytree.tree_leaves(output)
    return tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))


def example_inputs(
    keys: Sequence[str], num_dense: int, batch_size: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs to trace with: ``batch_size`` examples, bags of 0-2 ids of row 0 (a row every
    table has), as many ids as will not equal any other size (a `Dim` must stay free)."""
    lengths = torch.arange(len(keys) * batch_size, dtype=torch.int64) % 3  # [F * B]
    values = torch.zeros(int(lengths.sum()), dtype=torch.int64)
    return torch.zeros(batch_size, num_dense), values, lengths


def export_program(
    model: nn.Module, keys: Sequence[str], num_dense: int | None
) -> torch.export.ExportedProgram:
    """``model`` (called as ``model(dense, kjt)``, or ``model(kjt)`` when ``num_dense`` is None;
    put in eval mode) as a program of plain tensors with a dynamic batch size and number of ids
    (see [Note: serving programs])."""
    batch, ids = torch.export.Dim("batch", min=1), torch.export.Dim("ids", min=0)
    shapes: dict[str, Any] = {"values": {0: ids}, "lengths": {0: len(keys) * batch}}
    inputs: tuple[torch.Tensor, ...] = example_inputs(keys, num_dense or 0)
    flat: nn.Module
    if num_dense is None:
        flat, inputs = FlatSparseInputs(model, keys).eval(), inputs[1:]
    else:
        flat, shapes = FlatInputs(model, keys).eval(), {"dense": {0: batch}, **shapes}
    # a batch of one too: reason about sizes as if >= 2 without guarding on it (torch's
    # 0/1 specialization would otherwise trace the program for batches of 2 or more)
    oblivious = torch.fx.experimental._config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]
    with torch.no_grad(), oblivious:
        return torch.export.export(flat, inputs, dynamic_shapes=shapes)


def aoti_package(program: torch.export.ExportedProgram, path: str | os.PathLike) -> Path:
    """Compile ``program`` with AOTInductor for this CPU into the package ``path`` (``.pt2``);
    a process loads it with ``torch._inductor.aoti_load_package(path)``. Takes 20-60 s (a C++
    build)."""
    path = Path(path)
    return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(path)))
