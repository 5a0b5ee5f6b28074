"""Small instances of every unsharded module and model, and their inputs, for the PT2 tests
(`torch.compile` and `torch.export` against eager): one builder per case, seeded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shardkit import KeyedJaggedTensor
from shardkit.models import DLRM, DLRM_DCN, DLRM_Projection
from shardkit.models.deepfm import SimpleDeepFMNN
from shardkit.modules import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    PoolingType,
)
from shardkit.modules.feature_processor_ import (
    PositionWeightedModule,
    PositionWeightedModuleCollection,
)
from shardkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from shardkit.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from shardkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)

KEYS = ["c", "a", "x", "b"]  # "x" belongs to no table; "c" before "a": the plan permutes
DENSE_IN = 5
ADAGRAD = {"optimizer": "exact_adagrad", "learning_rate": 0.1}


def kjt(seed: int, *, batch: int = 3, rows: int = 6, weighted: bool = False,
        keys: list[str] | None = None, offset: int = 0) -> KeyedJaggedTensor:  # fmt: skip
    """A batch of ``len(keys)`` features, 0-3 ids per bag, ids in ``[offset, offset + rows)``."""
    keys = KEYS if keys is None else keys
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    num = int(lengths.sum())
    values = torch.randint(0, rows, (num,), generator=g) + offset
    weights = torch.rand(num, generator=g) + 0.5 if weighted else None
    return KeyedJaggedTensor(keys, values, weights, lengths=lengths)


def _fresh(weight: torch.Tensor) -> torch.Tensor:
    """A deterministic init: rows a managed-collision eviction resets come out the same in
    every module, however many random numbers were drawn before."""
    with torch.no_grad():
        return weight.copy_(torch.linspace(-0.5, 0.5, weight.numel()).view_as(weight))


def _bag_tables(pooling: PoolingType = PoolingType.SUM, dims: tuple[int, int] = (4, 8)):
    return [
        EmbeddingBagConfig(name="t0", embedding_dim=dims[0], num_embeddings=6,
                           feature_names=["a", "c"], pooling=pooling, init_fn=_fresh),
        EmbeddingBagConfig(name="t1", embedding_dim=dims[1], num_embeddings=7,
                           feature_names=["b"], init_fn=_fresh),
    ]  # fmt: skip


def ebc(*, weighted: bool = False, pooling: PoolingType = PoolingType.SUM,
        fused: dict | None = None, dims: tuple[int, int] = (4, 8)) -> EmbeddingBagCollection:  # fmt: skip
    return EmbeddingBagCollection(tables=_bag_tables(pooling, dims), is_weighted=weighted,
                                  fused_params=fused)  # fmt: skip


def ec(*, fused: dict | None = None) -> EmbeddingCollection:
    return EmbeddingCollection(
        tables=[
            EmbeddingConfig(
                name="t0",
                embedding_dim=4,
                num_embeddings=6,
                feature_names=["a", "c"],
                init_fn=_fresh,
            ),
            EmbeddingConfig(
                name="t1", embedding_dim=8, num_embeddings=7, feature_names=["b"], init_fn=_fresh
            ),
        ],
        fused_params=fused,
    )


def fp_ebc(
    *, collection: bool, fused: dict | None = None
) -> FeatureProcessedEmbeddingBagCollection:
    tables = ebc(weighted=True, fused=fused)
    if collection:
        processors: Any = PositionWeightedModuleCollection({"a": 3, "b": 4})
    else:
        processors = {f: PositionWeightedModule(3) for f in ["a", "c", "b"]}
    module = FeatureProcessedEmbeddingBagCollection(tables, processors)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "position" in name:
                param.copy_(torch.linspace(0.5, 1.5, param.numel()))
    return module


def _mcc(tables) -> ManagedCollisionCollection:
    return ManagedCollisionCollection(
        {c.name: MCHManagedCollisionModule(c.num_embeddings, "cpu", DistanceLFU_EvictionPolicy(),
                                           2, name=c.name) for c in tables},
        tables,
    )  # fmt: skip


def mc_ebc(
    *, fused: dict | None = None, remapped: bool = False
) -> ManagedCollisionEmbeddingBagCollection:
    tables = ebc(fused=fused, dims=(4, 4))
    configs = tables.embedding_bag_configs()
    return ManagedCollisionEmbeddingBagCollection(tables, _mcc(configs),
                                                  return_remapped_features=remapped)  # fmt: skip


def mc_ec(*, fused: dict | None = None) -> ManagedCollisionEmbeddingCollection:
    tables = ec(fused=fused)
    return ManagedCollisionEmbeddingCollection(tables, _mcc(tables.embedding_configs()))


def _dlrm_tables(fused: dict | None) -> EmbeddingBagCollection:
    return ebc(fused=fused, dims=(4, 4))


def dlrm(kind: str = "dlrm", *, fused: dict | None = None) -> torch.nn.Module:
    tables = _dlrm_tables(fused)
    torch.manual_seed(1)
    if kind == "deepfm":
        return SimpleDeepFMNN(DENSE_IN, tables, hidden_layer_size=8, deep_fm_dimension=3)
    cls = {"dlrm": DLRM, "dcn": DLRM_DCN, "projection": DLRM_Projection}[kind]
    extra: dict[str, Any] = {}
    if kind == "dcn":
        extra = {"dcn_num_layers": 2, "dcn_low_rank_dim": 2}
    if kind == "projection":
        extra = {"interaction_branch1_layer_sizes": [8, 4 * 3],
                 "interaction_branch2_layer_sizes": [8, 4 * 2]}  # fmt: skip
    return cls(embedding_bag_collection=tables, dense_in_features=DENSE_IN,
               dense_arch_layer_sizes=[8, 4], over_arch_layer_sizes=[8, 1], **extra)  # fmt: skip


def dense(seed: int, batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, DENSE_IN, generator=torch.Generator().manual_seed(seed))


# name -> (build(fused), inputs(seed), whether the output is per id (EC), raw MC ids)
Case = tuple[Callable[..., torch.nn.Module], Callable[[int], tuple]]
CASES: dict[str, Case] = {
    "ebc": (lambda fused=None: ebc(fused=fused), lambda s: (kjt(s),)),
    "ebc_weighted": (lambda fused=None: ebc(weighted=True, fused=fused),
                     lambda s: (kjt(s, weighted=True),)),
    "ebc_mean": (lambda fused=None: ebc(pooling=PoolingType.MEAN, fused=fused),
                 lambda s: (kjt(s),)),
    "ebc_weighted_mean": (
        lambda fused=None: ebc(weighted=True, pooling=PoolingType.MEAN, fused=fused),
        lambda s: (kjt(s, weighted=True),)),
    "ec": (lambda fused=None: ec(fused=fused), lambda s: (kjt(s),)),
    "fp_ebc_dict": (lambda fused=None: fp_ebc(collection=False, fused=fused),
                    lambda s: (kjt(s),)),
    "fp_ebc_collection": (lambda fused=None: fp_ebc(collection=True, fused=fused),
                          lambda s: (kjt(s),)),
    "mc_ebc": (lambda fused=None: mc_ebc(fused=fused), lambda s: (kjt(s, rows=40),)),
    "mc_ebc_remapped": (lambda fused=None: mc_ebc(fused=fused, remapped=True),
                        lambda s: (kjt(s, rows=40),)),
    "mc_ec": (lambda fused=None: mc_ec(fused=fused), lambda s: (kjt(s, rows=40),)),
    "dlrm": (lambda fused=None: dlrm("dlrm", fused=fused), lambda s: (dense(s), kjt(s))),
    "dlrm_dcn": (lambda fused=None: dlrm("dcn", fused=fused), lambda s: (dense(s), kjt(s))),
    "dlrm_projection": (lambda fused=None: dlrm("projection", fused=fused),
                        lambda s: (dense(s), kjt(s))),
    "deepfm": (lambda fused=None: dlrm("deepfm", fused=fused), lambda s: (dense(s), kjt(s))),
}  # fmt: skip
PER_ID = {
    "ec",
    "mc_ec",
    "mc_ebc_remapped",
}  # outputs with data-dependent sizes: unbacked, need fullgraph


def tensors_of(output: Any) -> list[torch.Tensor]:
    """Every tensor of a module's output, in a fixed order (KeyedTensor, dict of
    JaggedTensors, tuples with a remapped KJT, plain tensors)."""
    leaves = torch.utils._pytree.tree_leaves(output)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def loss_of(output: Any) -> torch.Tensor:
    """A loss that weighs every output entry differently (a wrong gradient row shows)."""
    total = torch.zeros(())
    for tensor in tensors_of(output):
        if tensor.dtype.is_floating_point:
            flat = tensor.reshape(-1)
            total = total + (flat * torch.linspace(-1, 1, flat.numel())).sum()
    return total


def trained(module: torch.nn.Module, offset: int = 0) -> torch.nn.Module:
    """``module`` after 6 training forwards of ids in ``[offset, offset + 40)`` (its remappers
    hold some of them), in eval mode."""
    for seed in range(6):
        module(kjt(seed, rows=40, offset=offset))
    return module.eval()
