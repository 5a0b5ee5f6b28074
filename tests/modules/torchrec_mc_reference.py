"""Runs TorchRec's managed-collision modules on the cases of `test_mc_torchrec_parity` (in the
TorchRec venv, ``~/.cache/shardkit-peers/venv``): ``python torchrec_mc_reference.py IN OUT``."""

import sys

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
    average_threshold_filter,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def policy(case):
    filters = {"average": average_threshold_filter, None: None}
    kinds = {
        "lfu": LFU_EvictionPolicy,
        "lru": LRU_EvictionPolicy,
        "dlfu": DistanceLFU_EvictionPolicy,
    }
    kwargs = {} if case["policy"] == "lfu" else {"decay_exponent": case["decay"]}
    return kinds[case["policy"]](threshold_filtering_func=filters[case["filter"]], **kwargs)


def run(case):
    tables = [
        EmbeddingBagConfig(
            name="t", embedding_dim=4, num_embeddings=case["zch"], feature_names=["f0", "f1"]
        )
    ]
    module = MCHManagedCollisionModule(
        zch_size=case["zch"],
        device=torch.device("cpu"),
        eviction_policy=policy(case),
        eviction_interval=case["interval"],
        input_hash_size=2**40,
    )
    mcc = ManagedCollisionCollection({"t": module}, tables)
    rows, evicted = [], []
    for values, lengths in case["batches"]:
        kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=values, lengths=lengths)
        rows.append(mcc(kjt).values().clone())
        evicted.append(module.evict())
    return {"rows": rows, "evicted": evicted, "state": dict(module.state_dict())}


if __name__ == "__main__":
    cases = torch.load(sys.argv[1])
    torch.save({case["name"]: run(case) for case in cases}, sys.argv[2])
