"""Which KeyedJaggedTensors of a batch feed which sharded collections: the train pipelines'
prefetch (see [Note: pipelined input dist] in `_train`), and the collection whose
input dist carries the ranks' agreement on data ([Note: deferred agreement]).

[Note: prefetch mask]
An overlapping pipeline starts, at fetch, the input dist of every sharded collection a batch's
KJTs can feed, the lead's first. Were a rank's batch to feed another set of the other
collections than the other ranks' (rank 0's batch feeds A and B, rank 1's only A), rank 0
would start B's header exchange where rank 1 starts its next collective: a hang, or an abort
on mismatched sizes. So the lead's header carries, as its tag (see `_dist._header`), the mask
of the other collections this rank is about to start (bit ``i``: the pipeline's ``i``-th
collection, counting the lead as the 0th, whose bit stays 0; `prefetch_mask`), and every rank reads every rank's mask before any of them starts one: where
they differ, every rank raises an `InputError` naming the ranks and the collections, before
the mismatched collective. One bit counts one input dist: where two KJTs of a batch hold
one collection's features, only the first is prefetched for it (`_feeds`). A rank without
a batch sends 0, but the ranks' disagreement on
data is checked first. A synchronous pipeline starts only the lead's input dist (mask 0): the
others start in their forwards, as in a plain loop. Past 63 other collections the bits fold
(collection ``i`` sets bit ``i % 63``): a mismatch between only ``i`` and ``i + 63`` goes
unseen.

[Note: prefetches no forward uses]
A collection's forward uses a prefetched input only when it gets the very KJT object the
prefetch was started for. A model that builds its own KJT (feature processing in its
forward) leaves every prefetch unused: an input dist per step sent for nothing, beside the one
its forward runs. So after the first overlapped step the ranks agree, by one all-reduce, on
the collections that were prefetched for that batch but whose forward used none on some rank,
and from the next fetch on the pipeline prefetches none of them (and waits for and drops
those started for the next batch already); the uses count from the first batch's prefetch,
not since the collection was built (another pipeline may have used it before); if the lead is among them,
the ranks agree on data by flags (as a synchronous pipeline does after its first step,
[Note: deferred agreement]). It falls back rather than raises: such a model is correct and
trains as in a plain loop, only without the overlap for those collections (one INFO line
names them). Once, on every rank together: one rank alone would change its collectives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist
from torch import nn

from shardkit.sharding._collection._base import ShardedCollection
from shardkit.sharding._dist._input import InputError
from shardkit.sharding._pipeline._agreement import any_rank_each
from shardkit.sharding._pipeline._prefetches import Prefetches
from shardkit.sparse import KeyedJaggedTensor
from shardkit.types import ShardedModule

__all__ = [
    "batch_kjts",
    "collection_names",
    "drop_unused_on_any_rank",
    "fed_collections",
    "lead_collection",
    "mask_names",
    "mismatch_error",
    "prefetch_into",
    "prefetch_mask",
    "sharded_collections",
]

_MASK_BITS = 63  # an int64 header field, kept non-negative


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


def _feeds(
    collections: list[ShardedCollection], batch: Any
) -> list[tuple[ShardedCollection, KeyedJaggedTensor]]:
    """(collection, KJT) for each collection some KJT of the batch has the features of: the
    first such KJT, one per collection, as the prefetch mask has one bit per collection
    ([Note: prefetch mask])."""
    kjts = [(kjt, set(kjt.keys())) for kjt in batch_kjts(batch)]
    fed = []
    for module in collections:
        names = module.feature_names()
        kjt = next((kjt for kjt, keys in kjts if keys.issuperset(names)), None)
        if kjt is not None:
            fed.append((module, kjt))
    return fed


def fed_collections(collections: list[ShardedCollection], batch: Any) -> list[ShardedCollection]:
    """The collections `prefetch_into` would start for ``batch`` (starts nothing)."""
    return [module for module, _ in _feeds(collections, batch)]


def prefetch_into(
    prefetches: Prefetches, collections: list[ShardedCollection], batch: Any, *, tag: int = 0
) -> list[ShardedCollection]:
    """Start each collection's input dist on the batch's KJT that has its features, in order,
    with ``tag`` in its header, into its queue in ``prefetches``; the collections fed."""
    fed = _feeds(collections, batch)
    for module, kjt in fed:
        prefetches.of(module).prefetch(kjt, tag=tag)
    return [module for module, _ in fed]


def prefetch_mask(collections: list[ShardedCollection], fed: list[ShardedCollection]) -> int:
    """Bit ``i % 63`` set where ``collections[i]`` is in ``fed`` ([Note: prefetch mask])."""
    mask = 0
    for index, module in enumerate(collections):
        if any(module is other for other in fed):
            mask |= 1 << (index % _MASK_BITS)
    return mask


def mask_names(mask: int, names: list[str]) -> list[str]:
    """The names of ``names[i]`` whose bit ``mask`` sets ([Note: prefetch mask])."""
    return [name for index, name in enumerate(names) if mask >> (index % _MASK_BITS) & 1]


def mismatch_error(masks: list[int], names: list[str]) -> InputError:
    """The error every rank raises where the ranks' prefetch masks differ (``masks`` in rank
    order, ``names`` the pipeline's collections; see [Note: prefetch mask])."""
    per_rank = {rank: mask_names(mask, names) for rank, mask in enumerate(masks)}
    return InputError(
        f"the ranks' batches feed other sharded collections: {per_rank} (rank: the "
        "collections whose every feature one of its batch's KJTs holds, but the lead where its "
        "header carries this check, the ranks' first collective); an overlapping train pipeline starts their input dists one "
        "step ahead, so every rank's batches must hold "
        "KJTs with the same keys (give a feature a rank lacks empty bags), or run it with "
        "overlap=False, where each collection's forward starts its own"
    )


def collection_names(model: nn.Module, collections: list[ShardedCollection]) -> list[str]:
    """Each collection's module path in ``model`` (``"<model>"`` for the model itself)."""
    paths = {id(module): name for name, module in model.named_modules()}
    return [paths.get(id(module)) or "<model>" for module in collections]


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


def drop_unused_on_any_rank(
    prefetches: Prefetches,
    collections: list[ShardedCollection],
    fed: list[ShardedCollection],
    group,
    *,
    consumed_before: dict[int, int],
) -> list[ShardedCollection]:
    """Of ``collections``, those in ``fed`` (prefetched for a batch whose forward has run)
    whose forward used no prefetched input on some rank since ``consumed_before`` (``id`` of
    a collection -> its queue's `consumed_prefetches` when that batch's prefetch started); every rank
    gets the same list (one all-reduce; see [Note: prefetches no forward uses]), and waits
    for and drops their prefetches started already (the next batch's: no forward uses them)."""
    consumed = [prefetches.of(m).consumed_prefetches() for m in collections]
    unused = [
        any(m is f for f in fed) and used == consumed_before.get(id(m), 0)
        for m, used in zip(collections, consumed)
    ]
    agreed = any_rank_each(unused, group)
    dropped = [m for m, flag in zip(collections, agreed) if flag]
    for module in dropped:
        prefetches.of(module).drop_prefetches()
    return dropped
