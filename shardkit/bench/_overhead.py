"""The sharded step's own overhead for calibrate: tiny-model DMP steps on one rank, and what they
take beyond the fitted kernel and the one-rank collectives fitted to ``per step + per feature +
per bag + per bag x column`` (the modules' Python, KJT handling, autograd)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardkit.bench._fit import fit_nonnegative, median_by
from shardkit.bench._timing import best_ms
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.optim import EmbOptimType
from shardkit.planner import KernelFit, LinkFit
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["fit_overhead", "overhead_rank"]


class _TinyModel(torch.nn.Module):
    """Pooled embeddings [B, T * D] -> a scalar: the least dense work a sharded step can do."""

    def __init__(self, ebc: torch.nn.Module, width: int) -> None:
        super().__init__()
        self.ebc = ebc
        self.head = torch.nn.Linear(width, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.head(self.ebc(kjt).values()).sum()


# (features, batch, dim) of the tiny models whose steps give the overhead
_OVERHEAD_POINTS = (
    (1, 128, 8),
    (1, 1024, 8),
    (16, 128, 8),
    (16, 1024, 8),
    (4, 1024, 64),
    (16, 512, 64),
)
_TINY_ROWS = 64


# The tiny models of the rank process, built at its first sample and kept for the next ones
# (calibrate keeps that rank up in a `RankPool` over its run)
_MODELS: dict[tuple[int, int, int], tuple[torch.nn.Module, KeyedJaggedTensor]] = {}


def overhead_rank(
    rank: int, world_size: int, threads: int, repeats: int, sample: int = 0
) -> list[dict]:
    """One sample of each tiny model's step (the fastest of a few), rows tagged ``sample``."""
    torch.set_num_threads(threads)
    rows = []
    for point in _OVERHEAD_POINTS:
        if point not in _MODELS:
            _MODELS[point] = _tiny_model(*point)
        features, batch, dim = point
        dmp, kjt = _MODELS[point]

        def step(dmp=dmp, kjt=kjt) -> None:
            dmp(kjt).backward()

        ms = best_ms(step, max(5, 2 * repeats), torch.device("cpu"))
        rows.append({"features": features, "batch": batch, "dim": dim, "ms": ms,
                     "sample": sample})  # fmt: skip
    return rows


def _tiny_model(features: int, batch: int, dim: int) -> tuple[torch.nn.Module, KeyedJaggedTensor]:
    from shardkit.sharding import (
        DistributedModelParallel,
        EmbeddingBagCollectionSharder,
        construct_module_sharding_plan,
        table_wise,
    )
    from shardkit.types import ShardingPlan

    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}
    configs = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=_TINY_ROWS,
                           feature_names=[f"f{i}"])
        for i in range(features)
    ]  # fmt: skip
    ebc = EmbeddingBagCollection(tables=configs, device="meta")
    model = _TinyModel(ebc, features * dim)
    plan = construct_module_sharding_plan(
        ebc, {c.name: table_wise(rank=0) for c in configs}, world_size=1, local_size=1,
        device_type="cpu",
    )  # fmt: skip
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    dmp = DistributedModelParallel(model, plan=ShardingPlan({"ebc": plan}), sharders=sharders)
    kjt = KeyedJaggedTensor(
        keys=[c.feature_names[0] for c in configs],
        values=torch.randint(0, _TINY_ROWS, (features * batch,)),
        lengths=torch.ones(features * batch, dtype=torch.long),
    )
    return dmp, kjt


def fit_overhead(
    rows: Sequence[dict], kernel: KernelFit, links: Sequence[LinkFit]
) -> tuple[float, float, float, float]:
    """(per step, per feature, per bag, per bag x column) ms a sharded step takes beyond its
    kernel and its one-rank collectives, from the tiny-model steps (bags: features x batch, one
    id each, one kernel call; a point sampled several times counts as its median)."""
    alone = {link.kind: link for link in links if link.world_size == 1}
    rows = median_by(rows, ("features", "batch", "dim"))  # a point's samples: their median
    extra = []
    for row in rows:
        bags, dim = row["features"] * row["batch"], row["dim"]
        known = kernel.forward_ms(bags, bags, dim) + kernel.backward_ms(
            bags, min(bags, row["features"] * _TINY_ROWS), dim, bags=bags
        )
        for kind, nbytes in (("all_to_all", 24 * bags), ("all_to_all", 4 * bags * dim)):
            if kind in alone:  # the ids' exchange, the pooled rows' there and back
                known += alone[kind].ms(nbytes)
        extra.append(max(row["ms"] - known, 1e-3))
    coef = fit_nonnegative(
        [[1.0, r["features"], r["features"] * r["batch"], r["features"] * r["batch"] * r["dim"]]
         for r in rows],
        extra,
    )  # fmt: skip
    return coef[0], coef[1], coef[2], coef[3]
