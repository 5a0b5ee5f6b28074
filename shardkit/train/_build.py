"""Data and model of a training run, from its `TrainConfig`."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardkit.data import (
    CriteoConfig,
    CriteoFormat,
    CriteoReader,
    GlobalBatchIterator,
    IdMapping,
    LastBatch,
    SyntheticConfig,
    SyntheticDataset,
    load_adult,
)
from shardkit.launch import current, is_initialized, local_world_size
from shardkit.models import DLRM, DLRM_DCN, DLRMTrain
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.optim import EmbOptimType
from shardkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from shardkit.sharding import EmbeddingBagCollectionSharder
from shardkit.train._config import DataSource, DenseOptimizer, ModelKind, TrainConfig

__all__ = ["Data", "build_data", "build_model", "dense_optimizer", "planner_for", "sharders_for"]

logger = logging.getLogger(__name__)


@dataclass
class Data:
    keys: tuple[str, ...]
    num_embeddings_per_feature: tuple[int, ...]
    num_dense: int
    train: Any  # an iterator of Batch with len(), state_dict() and load_state_dict()
    validation: Any


def build_data(config: TrainConfig, rank: int, world_size: int) -> Data:
    """This rank's training and validation batches (global-batch semantics)."""
    b = config.batch_size
    if config.data == DataSource.ADULT:
        adult = load_adult()
        train = GlobalBatchIterator(adult.train, batch_size=b, rank=rank, world_size=world_size,
                                    seed=config.seed)  # fmt: skip
        val = GlobalBatchIterator(adult.validation, batch_size=b, rank=rank, world_size=world_size,
                                  shuffle=False, last_batch=LastBatch.PAD)  # fmt: skip
        return Data(
            adult.keys, adult.num_embeddings_per_feature, len(adult.dense_names), train, val
        )
    if config.data == DataSource.SYNTHETIC:
        synthetic = SyntheticConfig(num_examples=config.synthetic_examples,
                                    num_embeddings=config.num_embeddings, seed=config.seed)  # fmt: skip
        # the same world (row effects, hot rows), the examples after the training ones
        held_out = dataclasses.replace(
            synthetic,
            num_examples=max(b * world_size, config.synthetic_examples // 8),
            first_example=synthetic.num_examples,
        )
        train = GlobalBatchIterator(SyntheticDataset(synthetic), batch_size=b, rank=rank,
                                    world_size=world_size, shuffle=False)  # fmt: skip
        val = GlobalBatchIterator(SyntheticDataset(held_out), batch_size=b, rank=rank,
                                  world_size=world_size, shuffle=False, last_batch=LastBatch.PAD)  # fmt: skip
        return Data(
            synthetic.keys, synthetic.num_embeddings_per_feature, synthetic.num_dense, train, val
        )
    criteo = CriteoConfig(num_embeddings=config.num_embeddings,
                          format=CriteoFormat(config.criteo_format),
                          id_mapping=IdMapping(config.id_mapping))  # fmt: skip
    train = CriteoReader(
        config.data_path, config=criteo, batch_size=b, rank=rank, world_size=world_size
    )
    val_path = config.data_val_path or config.data_path
    if config.data_val_path is None and rank == 0:
        logger.warning(
            "validating on the training data %s (AUC will be optimistic); give "
            "--data-val-path for held-out data",
            config.data_path,
        )
    val = CriteoReader(val_path, config=criteo, batch_size=b, rank=rank, world_size=world_size,
                       last_batch=LastBatch.PAD)  # fmt: skip
    return Data(criteo.keys, criteo.num_embeddings_per_feature, criteo.num_dense, train, val)


def build_model(config: TrainConfig, data: Data) -> DLRMTrain:
    """DLRM (or DCN) with one table per categorical feature, on the meta device (DMP gives each
    rank memory for its own shards only)."""
    tables = [
        EmbeddingBagConfig(
            name=f"t_{key}",
            embedding_dim=config.embedding_dim,
            num_embeddings=rows,
            feature_names=[key],
        )
        for key, rows in zip(data.keys, data.num_embeddings_per_feature)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device="meta")
    common = {
        "embedding_bag_collection": ebc,
        "dense_in_features": data.num_dense,
        "dense_arch_layer_sizes": list(config.dense_arch),
        "over_arch_layer_sizes": list(config.over_arch),
    }
    if config.model == ModelKind.DCN:
        model: nn.Module = DLRM_DCN(**common, dcn_num_layers=config.dcn_layers,
                                    dcn_low_rank_dim=config.dcn_rank)  # fmt: skip
    else:
        model = DLRM(**common)
    return DLRMTrain(model)


def sharders_for(config: TrainConfig) -> list[EmbeddingBagCollectionSharder]:
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": config.table_lr}
    return [EmbeddingBagCollectionSharder(fused_params=fused)]


def planner_for(config: TrainConfig, model: DLRMTrain, world_size: int) -> EmbeddingShardingPlanner:
    constraints = None
    if config.sharding_type is not None:
        ebc = model.model.sparse_arch.embedding_bag_collection
        constraints = {
            c.name: ParameterConstraints(sharding_types=[config.sharding_type.value])
            for c in ebc.embedding_bag_configs()
        }
    if is_initialized():  # the ranks' own device, as spawn or init_from_env chose it
        device = current().device.type
    else:
        device = (
            "cuda"
            if torch.cuda.is_available() and world_size <= torch.cuda.device_count()
            else "cpu"
        )
    topology = Topology(
        world_size=world_size,
        compute_device=device,
        local_world_size=config.local_world_size or local_world_size(world_size),
    )
    return EmbeddingShardingPlanner(topology=topology, constraints=constraints,
                                    batch_size=config.batch_size)  # fmt: skip


def dense_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The dense parameters' optimizer (sharded tables step inside backward)."""
    params = [p for n, p in model.named_parameters() if ".shards." not in n and p.requires_grad]
    if config.dense_optimizer == DenseOptimizer.ADAGRAD:
        return torch.optim.Adagrad(params, lr=config.lr)
    return torch.optim.Adam(params, lr=config.lr)
