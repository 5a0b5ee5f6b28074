"""Which KeyedJaggedTensors of a batch feed which sharded collections: the train pipelines'
prefetch (see [Note: pipelined input dist] in `_train_pipeline`), and the collection whose
input dist carries the ranks' agreement on data ([Note: deferred agreement])."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist
from torch import nn

from shardkit.sharding._collection import ShardedCollection
from shardkit.sparse import KeyedJaggedTensor
from shardkit.types import ShardedModule

__all__ = [
    "batch_kjts",
    "lead_collection",
    "prefetch_batch",
    "prefetch_into",
    "sharded_collections",
]


def batch_kjts(batch: Any) -> list[KeyedJaggedTensor]:
    """The KeyedJaggedTensors a batch holds (see [Note: pipelined input dist])."""
    if isinstance(batch, KeyedJaggedTensor):
        return [batch]
    if isinstance(batch, dict):
        values = list(batch.values())
    elif isinstance(batch, list | tuple):
        values = list(batch)
    elif dataclasses.is_dataclass(batch):
        values = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    else:
        values = list(getattr(batch, "__dict__", {}).values())
    return [v for v in values if isinstance(v, KeyedJaggedTensor)]


def prefetch_batch(model: nn.Module, batch: Any) -> int:
    """Start the input dist of ``batch``'s KJTs on the sharded collections of ``model`` that
    read them; returns how many were started."""
    return len(prefetch_into(sharded_collections(model, lead=None), batch))


def sharded_collections(model: nn.Module, *, lead: nn.Module | None) -> list[ShardedCollection]:
    """The sharded collections of ``model`` a batch's KJT can feed, ``lead`` first (see
    [Note: deferred agreement]), then in the model's order: those nested inside another
    sharded module (a managed-collision or feature-processed collection's own) see what that
    module made of the batch (remapped ids, weights), never the batch's KJT itself."""
    collections = [m for m in _outer_modules(model) if isinstance(m, ShardedCollection)]
    return sorted(collections, key=lambda m: m is not lead)  # stable


def _outer_modules(module: nn.Module) -> list[nn.Module]:
    """``module`` and its submodules, in order, but not those inside a sharded module."""
    found = [module]
    if isinstance(module, ShardedModule):
        return found
    for child in module.children():
        found += _outer_modules(child)
    return found


def prefetch_into(collections: list[ShardedCollection], batch: Any) -> list[ShardedCollection]:
    """Start each collection's input dist on the batch's KJT that has its features, in order;
    the collections fed."""
    kjts = [(kjt, set(kjt.keys())) for kjt in batch_kjts(batch)]
    fed = []
    for module in collections:
        for kjt, keys in kjts:
            if keys.issuperset(module.feature_names()):
                module.prefetch(kjt)
                fed.append(module)
    return fed


def lead_collection(model: nn.Module, group: dist.ProcessGroup | None) -> ShardedCollection | None:
    """The sharded collection whose input dist carries the agreement on data, if any (see
    [Note: deferred agreement]): the model's first the batch can feed, when the ranks agree
    through the world."""
    if group is not None or not dist.is_initialized():
        return None
    lead = next(iter(sharded_collections(model, lead=None)), None)
    if lead is None or lead.sharding_env.world_size != dist.get_world_size():
        return None  # its header reaches only its own ranks: agree through the world by flags
    return lead
