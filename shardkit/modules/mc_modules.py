"""Managed collision: raw 64-bit ids remapped to table rows, TorchRec's ``mc_modules``.

A table of ``N`` rows cannot hold every user id or string hash; ``id % N`` makes unrelated ids
share rows (collide). `MCHManagedCollisionModule` instead keeps up to ``N - 1`` raw ids, each in
a row of its own, chosen by an eviction policy (most frequent, most recent, or both) from the ids
seen in training; every other id is looked up in one reserved row. Every ``eviction_interval``
training iterations the ids seen since the last eviction compete with the kept ids for the rows;
the rows whose id changed are reported by `evict` so their embeddings (and optimizer state) can
be reset. Evaluation (``module.eval()``) only remaps.

Example::

    mcc = ManagedCollisionCollection(
        {"users": MCHManagedCollisionModule(
            zch_size=1000, device="cpu", eviction_interval=100,
            eviction_policy=DistanceLFU_EvictionPolicy())},
        embedding_configs=[EmbeddingBagConfig(name="users", num_embeddings=1000,
                                              embedding_dim=16, feature_names=["user_id"])],
    )
    kjt = KeyedJaggedTensor(keys=["user_id"], values=torch.tensor([2**39 + 7, 123456789]),
                            lengths=torch.tensor([1, 1]))
    mcc(kjt).values()   # rows in [0, 1000): both 999 (the reserved row) until an eviction

The state (kept ids, their rows, the policy's metadata, the iteration) is in ``state_dict`` with
TorchRec's names, laid out so that it shards row-wise; see [Note: managed-collision slots].
"""

from __future__ import annotations

from shardkit.modules._mc_base import ManagedCollisionModule
from shardkit.modules._mc_collection import ManagedCollisionCollection
from shardkit.modules._mc_policies import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    MCHEvictionPolicy,
    MCHEvictionPolicyMetadataInfo,
    average_threshold_filter,
    dynamic_threshold_filter,
    probabilistic_threshold_filter,
)
from shardkit.modules._mch import MCHManagedCollisionModule
from shardkit.sparse import JaggedTensor

__all__ = [
    "DistanceLFU_EvictionPolicy",
    "LFU_EvictionPolicy",
    "LRU_EvictionPolicy",
    "MCHEvictionPolicy",
    "MCHEvictionPolicyMetadataInfo",
    "MCHManagedCollisionModule",
    "ManagedCollisionCollection",
    "ManagedCollisionModule",
    "apply_mc_method_to_jt_dict",
    "average_threshold_filter",
    "dynamic_threshold_filter",
    "probabilistic_threshold_filter",
]


def apply_mc_method_to_jt_dict(
    mc_module: ManagedCollisionModule, method: str, features_dict: dict[str, JaggedTensor]
) -> dict[str, JaggedTensor]:
    """TorchRec's helper: ``mc_module.<method>(features_dict)`` (e.g. ``"remap"``, ``"profile"``)."""
    return getattr(mc_module, method)(features_dict)
