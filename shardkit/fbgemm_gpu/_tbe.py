"""FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` on shardkit's kernel: several tables looked
up in one call, ``forward(indices, offsets, per_sample_weights)``, the optimizer fused into
backward. CPU tables (``EmbeddingLocation.HOST``/``DEVICE``); no cache, no UVM.

[Note: FBGEMM's batched input]
``offsets`` has ``T * B + 1`` entries for ``T`` features (``len(feature_table_map)``, one per
table by default) and batch ``B``: bag ``t * B + b`` is feature ``t``'s ids for example ``b``,
``indices[offsets[t * B + b]:offsets[t * B + b + 1]]``. That is a KeyedJaggedTensor's layout
(keys in feature order, ``lengths = offsets.diff()``), so the module is a shardkit
`EmbeddingBagCollection` (table ``i`` is ``t{i}``, its features ``f{t}``) fed that KJT, and the
output ``[B, sum of the features' dims]`` is its pooled values in feature order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules import DataType, EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from shardkit.optim import EmbOptimType
from shardkit.sparse import KeyedJaggedTensor
from shardkit.types import EmbeddingLocation, PoolingMode, SparseType

__all__ = ["DenseTableBatchedEmbeddingBagsCodegen", "SplitTableBatchedEmbeddingBagsCodegen"]

_POOLING = {PoolingMode.SUM: PoolingType.SUM, PoolingMode.MEAN: PoolingType.MEAN}
_PRECISION = {SparseType.FP32: DataType.FP32, SparseType.FP16: DataType.FP16,
              SparseType.BF16: DataType.BF16}  # fmt: skip
_ON_CPU = (EmbeddingLocation.HOST, EmbeddingLocation.DEVICE)
# FBGEMM arguments taken at their defaults only: (default, why another value is refused).
_DEFAULT_ONLY: dict[str, tuple[Any, str]] = {
    "cache_load_factor": (0.2, "no cache in shardkit (every table lives whole in memory)"),
    "cache_sets": (0, "no cache in shardkit"),
    "cache_reserved_memory": (0.0, "no cache in shardkit"),
    "cache_precision": (None, "no cache in shardkit"),
    "enforce_hbm": (False, "no cache in shardkit"),
    "prefetch_pipeline": (False, "no cache in shardkit"),
    "gradient_clipping": (False, "FBGEMM's per-row gradient clipping is not in shardkit"),
    "max_norm": (0.0, "FBGEMM's max-norm clipping is not in shardkit"),
    "table_names": (None, "tables are named t0, t1, ... by position"),
}  # fmt: skip
_IGNORED = ("weight_decay_mode", "cache_algorithm", "stochastic_rounding", "max_gradient", "bounds_check_mode",
            "record_cache_metrics", "gather_uvm_cache_stats")  # fmt: skip


class _BatchedTables(nn.Module):
    """What both FBGEMM modules share: tables ``t{i}`` in an `EmbeddingBagCollection` fed
    FBGEMM's batched input (see [Note: FBGEMM's batched input])."""

    def _build(
        self,
        specs: list[tuple[int, int]],
        features: list[int],
        weights_precision: SparseType,
        output_dtype: SparseType,
        pooling_mode: PoolingMode,
        device: torch.device,
        fused: dict[str, Any] | None,
    ) -> None:
        _check_choices(specs, features, weights_precision, output_dtype, pooling_mode)
        self.feature_table_map = features
        self._num_tables = len(specs)
        self._keys = [f"f{t}" for t in range(len(features))]
        self._output_dtype = output_dtype.as_dtype()
        tables = [
            EmbeddingBagConfig(
                name=f"t{i}", num_embeddings=rows, embedding_dim=dim,
                feature_names=[self._keys[t] for t, table in enumerate(features) if table == i],
                pooling=_POOLING[pooling_mode], data_type=_PRECISION[weights_precision],
            )
            for i, (rows, dim) in enumerate(specs)
        ]  # fmt: skip
        self._collection = EmbeddingBagCollection(
            tables, is_weighted=True, device=device, fused_params=fused
        )

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
        feature_requires_grad: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``indices`` ``[N]``, ``offsets`` ``[T * B + 1]``, ``per_sample_weights`` ``[N]`` or
        None. Returns ``[B, sum of the features' dims]`` (feature order)."""
        num_features = len(self._keys)
        if offsets.dim() != 1 or (offsets.numel() - 1) % num_features:
            raise ValueError(
                f"offsets must be 1-D with T * B + 1 entries for T = {num_features} features; "
                f"got shape {tuple(offsets.shape)}"
            )
        if int(offsets[-1]) != indices.numel() or int(offsets[0]) != 0:
            raise ValueError(
                f"offsets must start at 0 and end at len(indices) ({indices.numel()}); got "
                f"{int(offsets[0])} .. {int(offsets[-1])}"
            )
        weights = torch.ones(indices.numel(), device=indices.device) if per_sample_weights is None else per_sample_weights  # fmt: skip
        kjt = KeyedJaggedTensor(keys=self._keys, values=indices, lengths=offsets.diff(),
                                weights=weights.float())  # fmt: skip
        pooled = self._collection(kjt).to_dict()
        return torch.cat([pooled[key] for key in self._keys], dim=1).to(self._output_dtype)

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """Each table's weights ``[rows, dim]`` (live: writing into them changes the tables)."""
        bags = self._collection.embedding_bags
        weights = []
        for i in range(self._num_tables):
            weight = bags[f"t{i}"].weight
            assert isinstance(weight, torch.Tensor), "a table holds its rows as weight"
            weights.append(weight.detach())
        return weights


class SplitTableBatchedEmbeddingBagsCodegen(_BatchedTables):
    """Tables batched in one module with FBGEMM's constructor and forward; see [Note: FBGEMM's
    batched input].

    Args:
        embedding_specs: ``(rows, dim, EmbeddingLocation, ComputeDevice)`` per table.
        feature_table_map: the table of each feature (default: feature ``i`` is table ``i``).
        optimizer: the fused optimizer (FBGEMM's default ``EXACT_SGD``; ``NONE`` is refused).
        learning_rate, eps, momentum, weight_decay, eta, beta1, beta2: FBGEMM's hyperparameters
            (``momentum`` and ``eta`` are LARS_SGD's; for ``weight_decay`` see `_weight_decay`).
            FBGEMM's Adam puts ``eps`` outside the bias correction, shardkit's fused Adam
            (torch's SparseAdam) inside: the two differ by ``eps`` terms.
        weights_precision: ``SparseType.FP32``, ``FP16`` or ``BF16``.
        output_dtype: the output's precision (float types).
        pooling_mode: ``PoolingMode.SUM`` or ``MEAN``.
        device: ``"cpu"`` (the default) or another device shardkit's kernel runs on.
        **fbgemm: FBGEMM's other arguments: cache, clipping and decay-mode settings at their
            defaults only (another value is an error naming it); ``weight_decay_mode``
            (NONE or L2; see `_weight_decay`); ``cache_algorithm``,
            ``stochastic_rounding`` (no effect on float32 tables; shardkit rounds to nearest),
            ``max_gradient`` (without clipping), ``bounds_check_mode`` (shardkit always checks
            ids) and the cache-statistics switches have no effect. Unknown names are errors.
    """

    def __init__(
        self,
        embedding_specs: Sequence[tuple[int, int, Any, Any]],
        feature_table_map: Sequence[int] | None = None,
        *,
        optimizer: EmbOptimType = EmbOptimType.EXACT_SGD,
        learning_rate: float = 0.01,
        eps: float = 1.0e-8,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        weights_precision: SparseType = SparseType.FP32,
        output_dtype: SparseType = SparseType.FP32,
        pooling_mode: PoolingMode = PoolingMode.SUM,
        device: str | int | torch.device | None = None,
        **fbgemm: Any,
    ) -> None:
        super().__init__()
        _check_fbgemm_arguments(fbgemm)
        optimizer = EmbOptimType.parse(optimizer)
        weight_decay = _weight_decay(optimizer, weight_decay, fbgemm.get("weight_decay_mode"))
        specs = [_spec(i, spec) for i, spec in enumerate(embedding_specs)]
        features = list(range(len(specs))) if feature_table_map is None else list(feature_table_map)
        self.embedding_specs = list(embedding_specs)
        fused: dict[str, Any] = {
            "optimizer": optimizer, "learning_rate": learning_rate, "eps": eps,
            "weight_decay": weight_decay, "beta1": beta1, "beta2": beta2,
        }  # fmt: skip
        if optimizer == EmbOptimType.LARS_SGD:
            fused.update(momentum=momentum, eta=eta)
        device = torch.device("cpu" if device is None else device)
        self._build(specs, features, weights_precision, output_dtype, pooling_mode, device, fused)

    @property
    def fused_optimizer(self) -> Any:
        """The fused optimizer (learning rate in its param groups, state by table)."""
        return self._collection.fused_optimizer

    def set_learning_rate(self, lr: float) -> None:
        """FBGEMM's way to change the learning rate."""
        for group in self.fused_optimizer.param_groups:
            group["lr"] = lr

    def get_learning_rate(self) -> float:
        return float(self.fused_optimizer.param_groups[0]["lr"])


class DenseTableBatchedEmbeddingBagsCodegen(_BatchedTables):
    """FBGEMM's batched tables without a fused optimizer: backward leaves dense gradients on the
    tables' parameters (one per table, not FBGEMM's one flat ``weights``): step them with any
    torch optimizer over ``parameters()``.

    Args:
        embedding_specs: ``(rows, dim)`` per table.
        feature_table_map: the table of each feature (default: feature ``i`` is table ``i``).
        weights_precision, output_dtype, pooling_mode: as `SplitTableBatchedEmbeddingBagsCodegen`.
        use_cpu: FBGEMM's switch; the tables are on the CPU either way (no GPU build here).
        use_mtia: only False.
    """

    def __init__(
        self,
        embedding_specs: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int] | None = None,
        weights_precision: SparseType = SparseType.FP32,
        pooling_mode: PoolingMode = PoolingMode.SUM,
        use_cpu: bool = False,
        output_dtype: SparseType = SparseType.FP32,
        use_mtia: bool = False,
    ) -> None:
        super().__init__()
        if use_mtia:
            raise ValueError("use_mtia=True: MTIA devices are not in shardkit; use use_cpu=True")
        specs = [(int(rows), int(dim)) for rows, dim in embedding_specs]
        features = list(range(len(specs))) if feature_table_map is None else list(feature_table_map)
        self.embedding_specs = list(embedding_specs)
        cpu = torch.device("cpu")
        self._build(specs, features, weights_precision, output_dtype, pooling_mode, cpu, None)


def _spec(i: int, spec: tuple[int, int, Any, Any]) -> tuple[int, int]:
    rows, dim, location, compute_device = spec
    if EmbeddingLocation(int(location)) not in _ON_CPU:
        raise ValueError(
            f"table {i}: EmbeddingLocation.{EmbeddingLocation(int(location)).name} (UVM or its "
            "cache) is not in shardkit; use EmbeddingLocation.HOST (tables in memory)"
        )
    if getattr(compute_device, "name", "CPU") != "CPU":
        raise ValueError(
            f"table {i}: ComputeDevice.{compute_device.name}: this batched module runs on CPU; "
            "use ComputeDevice.CPU, or shardkit's EmbeddingBagCollection on the GPU"
        )
    return int(rows), int(dim)


def _check_choices(specs, features, weights_precision, output_dtype, pooling_mode) -> None:
    bad = [t for t in features if not 0 <= t < len(specs)]
    if bad or not features:
        raise ValueError(
            f"feature_table_map {features} must name tables 0..{len(specs) - 1}, at least one"
        )
    if weights_precision not in _PRECISION:
        raise ValueError(
            f"weights_precision {weights_precision}: training tables are FP32, FP16 or BF16 "
            "(serve INT8/INT4 with shardkit.quant)"
        )
    if not output_dtype.is_float() or output_dtype not in _PRECISION:
        raise ValueError(f"output_dtype {output_dtype}: use SparseType.FP32, FP16 or BF16")
    if pooling_mode not in _POOLING:
        raise ValueError(
            f"pooling_mode {pooling_mode}: this module pools (SUM or MEAN); for one row per id "
            "use shardkit's EmbeddingCollection"
        )


def _check_fbgemm_arguments(fbgemm: dict[str, Any]) -> None:
    unknown = sorted(set(fbgemm) - set(_DEFAULT_ONLY) - set(_IGNORED))
    if unknown:
        raise TypeError(
            f"SplitTableBatchedEmbeddingBagsCodegen got FBGEMM argument(s) {unknown} that "
            f"shardkit does not take; it takes those in its docstring and, at their defaults, "
            f"{sorted(_DEFAULT_ONLY)}"
        )
    for name, value in fbgemm.items():
        if name in _DEFAULT_ONLY and value != _DEFAULT_ONLY[name][0]:
            default, why = _DEFAULT_ONLY[name]
            raise ValueError(f"{name}={value!r}: {why}; leave it at {default!r}")


_DECOUPLED = (EmbOptimType.LAMB, EmbOptimType.LARS_SGD, EmbOptimType.PARTIAL_ROWWISE_ADAM,
              EmbOptimType.PARTIAL_ROWWISE_LAMB)  # fmt: skip


def _weight_decay(optimizer: EmbOptimType, weight_decay: float, mode: Any) -> float:
    """The weight decay FBGEMM applies, as shardkit's fused config takes it.

    FBGEMM's SGD and (row-wise) Adagrad decay nothing unless row-wise Adagrad has
    ``weight_decay_mode`` L2 (shardkit's L2); its LAMB/LARS/partial rules decay as their rule
    says (shardkit's do the same); its Adam decays decoupled, shardkit's fused Adam by L2.
    """
    mode_name = "NONE" if mode is None else getattr(mode, "name", {0: "NONE", 1: "L2"}.get(mode))
    if optimizer in _DECOUPLED and mode_name == "NONE":
        return weight_decay
    if optimizer == EmbOptimType.EXACT_ROWWISE_ADAGRAD and mode_name in ("NONE", "L2"):
        return weight_decay if mode_name == "L2" else _no_decay(optimizer, weight_decay)
    if optimizer in (EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ADAGRAD) and mode_name == "NONE":
        return _no_decay(optimizer, weight_decay)
    if optimizer == EmbOptimType.ADAM and mode_name == "NONE" and not weight_decay:
        return 0.0
    raise ValueError(
        f"weight_decay={weight_decay} with weight_decay_mode {mode!r} for {optimizer.name}: "
        "shardkit takes FBGEMM's L2 mode for EXACT_ROWWISE_ADAGRAD and the rules' own decay for "
        "LAMB, LARS_SGD and the partial row-wise ones; FBGEMM's Adam decays decoupled, which "
        "shardkit's fused Adam does not: use weight_decay=0 there"
    )


def _no_decay(optimizer: EmbOptimType, weight_decay: float) -> float:
    if weight_decay:
        raise ValueError(
            f"weight_decay={weight_decay}: FBGEMM's {optimizer.name} applies no weight decay "
            "without weight_decay_mode (L2, for EXACT_ROWWISE_ADAGRAD); set it, or drop "
            "weight_decay"
        )
    return 0.0
