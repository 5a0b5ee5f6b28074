"""Data and model of a training run, from its `TrainConfig`."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shardkit.compat import is_dtensor
from shardkit.data import (
    CriteoConfig,
    CriteoReader,
    FittedSchema,
    GlobalBatchIterator,
    LastBatch,
    SyntheticConfig,
    SyntheticDataset,
    TableData,
    TableReader,
    load_adult,
)
from shardkit.launch import current, is_initialized, local_world_size
from shardkit.models import DLRM, DLRM_DCN, DLRMTrain
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from shardkit.optim import EmbOptimType
from shardkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from shardkit.sharding import (
    DataParallelWrapper,
    EmbeddingBagCollectionSharder,
    FullyShardDataParallelWrapper,
)
from shardkit.train._config import (
    DataSource,
    DenseOptimizer,
    DenseSharding,
    ModelKind,
    TrainConfig,
)

__all__ = [
    "Data",
    "build_data",
    "build_model",
    "dense_optimizer",
    "dense_wrapper",
    "fitted_data",
    "planner_for",
    "sharders_for",
    "table_model",
]

logger = logging.getLogger(__name__)


@dataclass
class Data:
    keys: tuple[str, ...]
    num_embeddings_per_feature: tuple[int, ...]
    num_dense: int
    train: Any  # an iterator of Batch with len(), state_dict() and load_state_dict()
    validation: Any
    # (name, features, rows, pooling) per table when tables are not one per feature
    tables: tuple[tuple[str, tuple[str, ...], int, PoolingType], ...] | None = None
    fitted: FittedSchema | None = None  # table data: saved with every checkpoint


def build_data(
    config: TrainConfig, rank: int, world_size: int, table: TableData | None = None
) -> Data:
    """This rank's training and validation batches (global-batch semantics); ``table`` is
    the scanned table of ``--data table`` (see `prepare`)."""
    if config.data == DataSource.TABLE:
        assert table is not None, "--data table: scan the table first (train.prepare)"
        return _table_data(config, rank, world_size, table)
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
        return _synthetic_data(config, rank, world_size)
    criteo = CriteoConfig(num_embeddings=config.num_embeddings, format=config.criteo_format,
                          id_mapping=config.id_mapping)  # fmt: skip
    criteo_train = CriteoReader(
        config.data_path, config=criteo, batch_size=b, rank=rank, world_size=world_size
    )
    val_path = config.data_val_path or config.data_path
    if not config.data_val_path and rank == 0:
        logger.warning(
            "validating on the training data %s (AUC will be optimistic); give "
            "--data-val-path for held-out data",
            [str(p) for p in config.data_path],
        )
    criteo_val = CriteoReader(val_path, config=criteo, batch_size=b, rank=rank,
                              world_size=world_size, last_batch=LastBatch.PAD)  # fmt: skip
    return Data(criteo.keys, criteo.num_embeddings_per_feature, criteo.num_dense, criteo_train,
                criteo_val)  # fmt: skip


def _synthetic_data(config: TrainConfig, rank: int, world_size: int) -> Data:
    b = config.batch_size
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


def _table_data(config: TrainConfig, rank: int, world_size: int, table: TableData) -> Data:
    common: dict[str, Any] = {
        "batch_size": config.batch_size,
        "rank": rank,
        "world_size": world_size,
        "cache": config.table_cache,
    }
    train = TableReader(table, split="train", shuffle_buffer=config.shuffle_buffer,
                        seed=config.seed, **common)  # fmt: skip
    val = TableReader(table, split="validation", **common)
    train.start()  # its first batches are made while the model is built
    return fitted_data(table.fitted, train, val)


def fitted_data(fitted: FittedSchema, train: Any = None, validation: Any = None) -> Data:
    """The model's view of a fitted table schema (with these readers): what `build_model`
    needs to build the model a checkpoint of that table holds, e.g. to serve an export."""
    pooling = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
    tables = tuple(
        (t.name, t.features, t.num_embeddings, pooling[t.pooling]) for t in fitted.tables
    )
    return Data(fitted.keys, fitted.num_embeddings_per_feature, len(fitted.dense), train,
                validation, tables=tables, fitted=fitted)  # fmt: skip


def table_model(
    fitted: FittedSchema, config: TrainConfig | None = None, *, device: str = "cpu"
) -> DLRMTrain:
    """The whole (unsharded) model that ``shardkit train --data table`` trains for a fitted
    schema: load an export into it and serve (``config``: the architecture flags trained
    with; default: the defaults)::

        fitted = FittedSchema.load("model.schema.json")
        model = table_model(fitted)
        model.load_state_dict(torch.load("model.pt"))
        loss, (_, logits, _) = model(fitted.batch([{"user_id": "42", ...}]))
    """
    return build_model(config or TrainConfig(), fitted_data(fitted), device=device)


def build_model(config: TrainConfig, data: Data, *, device: str = "meta") -> DLRMTrain:
    """DLRM (or DCN) with a table per categorical feature (or as ``data.tables`` says), the
    tables on the meta device (DMP gives each rank memory for its own shards only); on
    ``device="cpu"`` a whole model, e.g. to load an export into and serve."""
    specs = data.tables or tuple(
        (key, (key,), rows, PoolingType.SUM)
        for key, rows in zip(data.keys, data.num_embeddings_per_feature)
    )
    tables = [
        EmbeddingBagConfig(name=f"t_{name}", embedding_dim=config.embedding_dim,
                           num_embeddings=rows, feature_names=list(features), pooling=pooling)
        for name, features, rows, pooling in specs
    ]  # fmt: skip
    ebc = EmbeddingBagCollection(tables=tables, device=device)
    dense, over = list(config.dense_arch), list(config.over_arch)
    if config.model == ModelKind.DCN:
        model: DLRM = DLRM_DCN(ebc, data.num_dense, dense, over, dcn_num_layers=config.dcn_layers,
                               dcn_low_rank_dim=config.dcn_rank)  # fmt: skip
    else:
        model = DLRM(ebc, data.num_dense, dense, over)
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
    cap = config.memory_cap  # None: the machine's (see Topology)
    topology = Topology(
        world_size=world_size,
        compute_device=device,
        hbm_cap=cap if device == "cuda" else None,
        ddr_cap=cap if device == "cpu" else None,
        local_world_size=config.local_world_size or local_world_size(world_size),
    )
    return EmbeddingShardingPlanner(topology=topology, constraints=constraints,
                                    batch_size=config.batch_size)  # fmt: skip


def dense_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The dense parameters' optimizer (sharded tables step inside backward). Under
    ``--dense-sharding fsdp`` the DTensor shards and the plain replicas (data-parallel tables)
    are separate groups: one foreach step cannot mix the two kinds."""
    params = [p for n, p in model.named_parameters() if ".shards." not in n and p.requires_grad]
    sharded = [p for p in params if is_dtensor(p)]  # See [Note: DTensor on demand]
    plain = [p for p in params if not is_dtensor(p)]
    groups = [{"params": group} for group in (sharded, plain) if group]
    if config.dense_optimizer == DenseOptimizer.ADAGRAD:
        return torch.optim.Adagrad(groups, lr=config.lr)
    return torch.optim.Adam(groups, lr=config.lr)


def dense_wrapper(config: TrainConfig) -> DataParallelWrapper | None:
    """How `DistributedModelParallel` makes the dense part data-parallel: None (its default,
    DDP) or `FullyShardDataParallelWrapper` for ``--dense-sharding fsdp``."""
    if config.dense_sharding is DenseSharding.FSDP:
        return FullyShardDataParallelWrapper()
    return None


_TABLES = "model.sparse_arch.embedding_bag_collection.embedding_bags."


def model_from_state_dict(
    state: dict[str, torch.Tensor], schema: dict | None = None
) -> tuple[DLRMTrain, list[str]]:
    """The model ``shardkit train`` trained, rebuilt from an export's tensors (their shapes give
    the tables, the dense and over arches, DLRM or DCN), with ``state`` loaded, and the
    features in the order its KeyedJaggedTensor takes them.

    Args:
        state: the unsharded state dict (`shardkit.checkpoint.export_checkpoint`).
        schema: the run's fitted table schema (its checkpoint's ``schema`` extra), which names
            each table's features and pooling; without it table ``t_<key>`` is feature ``key``
            (Adult, Criteo, synthetic data).
    """
    state = {k if k.startswith("model.") else f"model.{k}": v for k, v in state.items()}
    rows = {k[len(_TABLES) : -len(".weight")]: v.shape for k, v in state.items()
            if k.startswith(_TABLES)}  # fmt: skip
    if not rows:
        raise ValueError(
            f"the state dict has no tables under {_TABLES!r}; it is not the model of "
            "shardkit train (DLRM or DCN), so build your model and call "
            "shardkit.inference.export_program"
        )
    dense = _layer_sizes(state, "model.dense_arch.model._mlp.{}._linear.weight")
    over = _layer_sizes(state, "model.over_arch.model.0._mlp.{}._linear.weight")
    over.append(state["model.over_arch.model.1.weight"].shape[0])
    cross = [k for k in state if k.startswith("model.inter_arch.crossnet.W_kernels.")]
    config = TrainConfig(
        embedding_dim=next(iter(rows.values()))[1], dense_arch=tuple(dense),
        over_arch=tuple(over), model=ModelKind.DCN if cross else ModelKind.DLRM,
        dcn_layers=max(len(cross), 1),
        dcn_rank=state[cross[0]].shape[1] if cross else TrainConfig().dcn_rank,
    )  # fmt: skip
    num_dense = state["model.dense_arch.model._mlp.0._linear.weight"].shape[1]
    if schema is not None:
        data = fitted_data(FittedSchema.from_dict(schema))
    else:
        keys = tuple(name.removeprefix("t_") for name in rows)
        data = Data(keys, tuple(shape[0] for shape in rows.values()), num_dense, None, None)
    model = build_model(config, data, device="cpu")
    model.load_state_dict(state)
    ebc = model.model.sparse_arch.embedding_bag_collection
    return model, [f for c in ebc.embedding_bag_configs() for f in c.feature_names]


def _layer_sizes(state: dict[str, torch.Tensor], pattern: str) -> list[int]:
    sizes: list[int] = []
    while pattern.format(len(sizes)) in state:
        sizes.append(state[pattern.format(len(sizes))].shape[0])
    return sizes
