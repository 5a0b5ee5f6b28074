"""`save` and `load`: training checkpoints through torch.distributed.checkpoint.

Every rank calls both, with the same arguments; every rank writes (and reads) only its shards.
See [Note: atomic checkpoints] in `_store`. torch.distributed.checkpoint is imported by the
functions that use it, not by ``import shardkit.checkpoint``: it imports DTensor (and sympy), 1-2
s of the start of every rank and of the CLI ([Note: DTensor on demand] in `shardkit.compat`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.checkpoint._state import (
    apply_dense_optimizer,
    apply_fused,
    dense_optimizer_state,
    fused_states,
    has_fsdp,
    revalidate,
    sharded_view,
)
from shardkit.checkpoint._store import (
    CheckpointError,
    commit,
    file_digests,
    latest,
    prepare,
    verify,
    write_manifest,
)
from shardkit.compat import is_dtensor
from shardkit.sharding import quiet_sharded_tensor

__all__ = ["load", "read_extra", "save"]

_DENSE_META = "__dense_optimizer__"

logger = logging.getLogger(__name__)

Group = dist.ProcessGroup | None


def save(
    root: str | os.PathLike,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
    group: Group = None,
) -> Path:
    """Write checkpoint ``<root>/step-<step>`` from every rank and point ``latest`` at it.

    Args:
        root: the directory of checkpoints (on a file system all ranks share).
        step: the training step, names the checkpoint.
        model: the model (sharded tables, DDP or FSDP parts: each shard is written once).
        optimizer: the dense parameters' optimizer (sharded tables' fused optimizers are
            saved with the model).
        extra: picklable values every rank agrees on (data position, epoch, ...).
        keep: how many checkpoints to keep (>= 1): this one and the ``keep - 1`` highest
            steps of the others.
    Returns:
        the checkpoint's directory.
    """
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(
            f"keep must be an int >= 1 (this checkpoint and keep - 1 others), got {keep!r}"
        )
    import torch.distributed.checkpoint as dcp  # (see the module's docstring)

    rank = dist.get_rank(group)
    temporary, final = _broadcast_paths(root, step, rank, group)
    with sharded_view(model):
        state = _state(model, optimizer, extra or {}, rank)
    with quiet_sharded_tensor():
        dcp.save(state, checkpoint_id=str(temporary), process_group=group)
    mine = sorted(n for n in os.listdir(temporary) if n.startswith(f"__{rank}_"))
    digests = comm.all_gather_object(file_digests(temporary, mine), group=group)
    if rank == 0:
        try:
            files = {k: v for d in digests for k, v in d.items()}
            files.update(file_digests(temporary, [".metadata"]))
            info = {"step": step, "world_size": dist.get_world_size(group)}
            write_manifest(temporary, files, info)
            commit(temporary, final, keep=keep)
            logger.info("checkpoint of step %d written to %s", step, final)
        except Exception as exc:  # every rank must hear of it: see [Note: one commit outcome]
            _raise_commit_failure(_commit_failure(exc, step, temporary, final), group, exc)
    _raise_commit_failure(comm.broadcast_object(None, src=_global(0, group), group=group), group)
    return final


# [Note: one commit outcome]
# Rank 0 alone writes the manifest and renames the checkpoint into place. If that fails (disk
# full, permissions), the other ranks must not wait in a barrier until the collective timeout:
# rank 0 broadcasts the outcome (None or the error) in place of the final barrier, and every
# rank raises the same `CheckpointError` at once, saying what is left where: before the rename
# the unfinished directory (``latest`` untouched), after it the complete checkpoint that
# ``latest`` does not name yet. A re-save of an existing step keeps the old one aside until the
# new one is in place (`_store.commit`).
def _commit_failure(exc: Exception, step: int, temporary: Path, final: Path) -> str:
    """What rank 0's failed commit left behind, said for every rank."""
    cause = f"rank 0 failed with {type(exc).__name__}: {exc}"
    if temporary.exists():
        where = (
            f"'latest' is unchanged; the unfinished files are in {temporary}. Fix the cause "
            "(e.g. free disk space) and save again."
        )
    elif _names(final):
        where = f"its files are complete in {final} and 'latest' names it; fix the cause."
    else:
        where = (
            f"its files are complete in {final}, but 'latest' was not pointed at it. Fix the "
            "cause (e.g. free disk space) and save again."
        )
    return f"checkpoint of step {step} was not committed: {cause}. {where}"


def _names(final: Path) -> bool:
    """Whether ``latest`` beside ``final`` names it."""
    with contextlib.suppress(OSError):
        return (final.parent / "latest").read_text().strip() == final.name
    return False


def _raise_commit_failure(
    failure: str | None, group: Group, cause: BaseException | None = None
) -> None:
    if failure is None:
        return
    if cause is not None:  # rank 0 tells the others before raising itself
        comm.broadcast_object(failure, src=_global(0, group), group=group)
    raise CheckpointError(failure) from cause


def load(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
    group: Group = None,
) -> dict[str, Any]:
    """Load a checkpoint (a ``step-*`` directory, or a root with ``latest``) into ``model``
    and ``optimizer``, in whatever sharding and world size they have now.

    Returns the saved ``extra`` values; keys of the ``extra`` given here that the checkpoint
    lacks (one made by `import_checkpoint` has none) keep the values given.
    Raises `CheckpointError`, on every rank, for a missing, corrupted or mismatching checkpoint.
    """
    import torch.distributed.checkpoint as dcp  # (see the module's docstring)

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    directory = _resolve(Path(path))
    _verify_everywhere(directory, rank, world, group)
    metadata = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    # `save` always writes extras (with the dense optimizer's groups); `import_checkpoint` never
    with_optimizers = "extra" in metadata or any(k.startswith("optim.") for k in metadata)
    if not with_optimizers:  # made by import_checkpoint from a plain state dict
        logger.info("%s holds no optimizer state: optimizers start fresh", directory)
        optimizer = None
    with sharded_view(model):
        state = _state(model, optimizer, extra or {}, rank)
    if not with_optimizers:
        del state["optim"]
    with quiet_sharded_tensor():
        _check_fits(state, metadata, group)
    _drop_empty(state)  # torch.distributed.checkpoint reads an empty dict as a missing value
    template = _dense_template(metadata, state.get("model", {})) if optimizer else {}
    if template:  # an optimizer with no tensor state yet (SGD, Adam before a step) has none
        state.setdefault("optim", {})["dense"] = {"state": template}
    for key in [k for k in state["rng"] if f"rng.{k}" not in metadata]:
        del state["rng"][key]  # a checkpoint made without CUDA has no GPU generator's state
    if not state["rng"]:
        del state["rng"]
    if "extra" in metadata:
        state["extra"] = _empty_extra(metadata)
    else:
        del state["extra"]
    with quiet_sharded_tensor():
        dcp.load(state, checkpoint_id=str(directory), process_group=group)
    if has_fsdp(model):  # its DTensors are built for the state dict, not views of the shards
        with sharded_view(model):
            model.load_state_dict(state["model"])
    revalidate(model)
    if with_optimizers:
        apply_fused(model, state.get("optim", {}).get("fused", {}))
    defaults = dict(extra or {})
    extra = {**defaults, **(_unpack(state["extra"]) if "extra" in state else {})}
    meta = extra.pop(_DENSE_META, None)
    if optimizer is not None:
        if meta is None:
            raise CheckpointError(f"{directory} holds no dense optimizer state to load")
        dense = state.get("optim", {}).get("dense", {}).get("state", {})
        for name, entries in meta["state"].items():
            dense.setdefault(name, {}).update(entries)
        with sharded_view(model):
            apply_dense_optimizer(
                model, optimizer, {"state": dense, "param_groups": meta["param_groups"]}
            )
    _set_rng_state(state.get("rng", {}), rank)
    logger.info("loaded checkpoint %s", directory)
    return extra


def _empty_extra(metadata: dict[str, Any]) -> torch.Tensor:
    """A tensor to read ``extra`` into: `save` writes it as a ``[bytes]`` uint8 tensor."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entry = metadata["extra"]
    assert isinstance(entry, TensorStorageMetadata)  # a verified shardkit checkpoint's
    return torch.empty(entry.size, dtype=torch.uint8)


def read_extra(path: str | os.PathLike) -> dict[str, Any]:
    """The ``extra`` values a checkpoint was saved with (a ``step-*`` directory, or a root with
    ``latest``), read in this process alone (no process group, no model): what a job needs to
    know before it starts ranks (e.g. ``shardkit train`` a table's fitted schema), or after."""
    import torch.distributed.checkpoint as dcp  # (see the module's docstring)

    directory = _resolve(Path(path))
    verify(directory, names=[".metadata"])
    metadata = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    if "extra" not in metadata:
        return {}
    state = {"extra": _empty_extra(metadata)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(directory), no_dist=True)
    extra = _unpack(state["extra"])
    extra.pop(_DENSE_META, None)
    return extra


def _state(model, optimizer, extra, rank) -> dict[str, Any]:
    """The checkpoint's dict. Tensors go to torch.distributed.checkpoint as they are; the rest
    (extras, the dense optimizer's param groups and non-tensor state) in one pickled blob."""
    extra = dict(extra)
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "optim": {"fused": fused_states(model)},
        "rng": _rng_state(rank),
    }
    if optimizer is not None:
        dense = dense_optimizer_state(model, optimizer)
        tensors = {
            name: {k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}
            for name, entries in dense["state"].items()
        }
        others = {
            name: {k: v for k, v in entries.items() if not isinstance(v, torch.Tensor)}
            for name, entries in dense["state"].items()
        }
        state["optim"]["dense"] = {"state": tensors}
        extra[_DENSE_META] = {"param_groups": dense["param_groups"], "state": others}
    state["extra"] = _pack(extra)
    return state


def _rng_state(rank: int) -> dict[str, torch.Tensor]:
    """This rank's random generators: the CPU's, and the current GPU's once CUDA is in use
    (dropout on a GPU draws from it). Both are CPU byte tensors."""
    state = {f"rank{rank}": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state[f"cuda_rank{rank}"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(saved: dict[str, torch.Tensor], rank: int) -> None:
    if f"rank{rank}" in saved:
        torch.set_rng_state(saved[f"rank{rank}"])
    if f"cuda_rank{rank}" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state(saved[f"cuda_rank{rank}"])


def _pack(extra: dict[str, Any]) -> torch.Tensor:
    """Extras travel as one pickled byte tensor, the same on every rank (saved once)."""
    return torch.frombuffer(bytearray(pickle.dumps(dict(extra))), dtype=torch.uint8).clone()


def _unpack(data: torch.Tensor) -> dict[str, Any]:
    return pickle.loads(ctypes.string_at(data.data_ptr(), data.numel()))


def _broadcast_paths(root, step, rank, group) -> tuple[Path, Path]:
    paths = prepare(root, step) if rank == 0 else None
    return comm.broadcast_object(paths, src=_global(0, group), group=group)


def _global(group_rank: int, group: Group) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _resolve(path: Path) -> Path:
    if (path / "latest").exists():
        found = latest(path)
        assert found is not None
        return found
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint at {path}")
    return path


def _verify_everywhere(directory: Path, rank: int, world: int, group: Group) -> None:
    """Each rank checks a share of the files; all raise the first problem found."""
    try:
        manifest = verify(directory, names=[])
        names = sorted(manifest["files"])
        verify(directory, names[rank::world])
        problem = None
    except CheckpointError as exc:
        problem = str(exc)
    problems = [p for p in comm.all_gather_object(problem, group=group) if p]
    if problems:
        raise CheckpointError(problems[0])


def _drop_empty(state: dict[str, Any]) -> None:
    """Remove the dicts holding nothing, at any depth (a stateless optimizer's, SGD's)."""
    for key, value in list(state.items()):
        if isinstance(value, dict):
            _drop_empty(value)
            if not value:
                del state[key]


def _flatten(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _check_fits(state: dict[str, Any], metadata: dict[str, Any], group: Group) -> None:
    """Refuse a checkpoint of another model, naming the first key that differs (the same on
    every rank: a rank holds only its shards' optimizer state, so keys are pooled first)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    wanted = {k: v for k, v in _flatten({"model": state["model"]}).items()}
    if "optim" in state:
        wanted.update(_flatten({"optim": {"fused": state["optim"]["fused"]}}))
    everyone = set().union(*comm.all_gather_object(sorted(wanted), group=group))
    saved_model = sorted(k for k in metadata if k.startswith(("model.", "optim.fused.")))
    for key in sorted(wanted):
        if key not in metadata:
            raise CheckpointError(f"the checkpoint has no {key!r}: it is from another model")
        value, saved = wanted[key], metadata[key]
        shapes_differ = hasattr(value, "size") and list(saved.size) != list(value.size())
        if isinstance(saved, TensorStorageMetadata) and shapes_differ:
            raise CheckpointError(
                f"{key!r} has shape {list(saved.size)} in the checkpoint but "
                f"{list(value.size())} in the model: the checkpoint is from another model"
            )
    extra = [k for k in saved_model if k not in everyone]
    if extra:
        raise CheckpointError(
            f"the checkpoint has {extra[0]!r}, which the model lacks: it is from another model"
        )


def _dense_template(metadata: dict[str, Any], model_state: dict[str, Any]) -> dict[str, Any]:
    """Empty tensors shaped like the checkpoint's dense optimizer state, for DCP to fill: full
    tensors, or for a parameter the model holds as a DTensor shard (FSDP), a shard like it."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    state: dict[str, Any] = {}
    for key, value in metadata.items():
        if key.startswith("optim.dense.state.") and isinstance(value, TensorStorageMetadata):
            *path, entry = key[len("optim.dense.state.") :].split(".")
            name, dtype = ".".join(path), value.properties.dtype
            like = model_state.get(name)
            if is_dtensor(like) and list(like.size()) == list(value.size):
                tensor = torch.empty_like(like, dtype=dtype)
            else:
                tensor = torch.empty(value.size, dtype=dtype)
            state.setdefault(name, {})[entry] = tensor
    return state
