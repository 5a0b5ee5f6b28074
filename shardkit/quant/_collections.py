"""Quantized embedding collections for serving on CPU (TorchRec's ``quant.embedding_modules``).

Each table is stored in its config's ``data_type`` (FP32, FP16, INT8, INT4 or INT2 row-wise; see
[Note: quantized rows]) and looked up with torch's own quantized embedding-bag operators, which
ship in torch's CPU build. Build them from trained float modules::

    quantized = EmbeddingBagCollection.from_float(ebc)  # ebc.qconfig set, or use:
    model = quantize_embeddings(model, dtype=torch.qint8, inplace=True)  # shardkit.inference

The ``state_dict`` keeps TorchRec's keys (``embedding_bags.<table>.weight``, a uint8 buffer for
the n-bit types) in shardkit's row layout; ``load_state_dict`` also takes TorchRec's (what a
TorchRec quantized collection saves, split scale/bias or not), and `tables_in_torchrec_layout`
gives TorchRec's ([Note: TorchRec's quantized rows]). The module has no parameters (serving only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules import BaseEmbeddingConfig, EmbeddingBagConfig, EmbeddingConfig
from shardkit.modules.embedding_modules import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
)
from shardkit.quant._config import quantized_configs
from shardkit.quant._groups import Stacks
from shardkit.quant._pack import check_data_type, code_columns, lookup, pack, packed_shape
from shardkit.quant._prep import DEFAULT_ROW_ALIGNMENT, check_row_alignment, layout_switches
from shardkit.quant._torchrec_rows import from_torchrec, is_torchrec_rows, to_torchrec
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = ["EmbeddingBagCollection", "EmbeddingCollection", "quantize_state_dict"]

QuantizedWeights = Mapping[str, tuple[torch.Tensor, torch.Tensor | None]]


class _Table(nn.Module):
    """Holds one table's stored rows as buffer ``weight`` (a view, see [Note: quantized stacks])."""

    weight: torch.Tensor

    def __init__(self, config: BaseEmbeddingConfig, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self._describe = f"{config.num_embeddings}, {config.embedding_dim}, {config.data_type}"

    def extra_repr(self) -> str:
        return self._describe


class _QuantCollection(nn.Module):
    """What both quantized collections share: checks, storage, stacks, loading, moving."""

    _TABLES = ""

    def __init__(
        self,
        configs: Sequence[BaseEmbeddingConfig],
        device: torch.device | str | None,
        output_dtype: torch.dtype,
        weights: QuantizedWeights | None,
        split_scale_bias: bool,
        validate_ids: bool,
    ) -> None:
        super().__init__()
        device = torch.device(device if device is not None else "cpu")
        _check_collection(configs, device, output_dtype, split_scale_bias)
        self._output_dtype = output_dtype
        self._device = device
        self._validate_ids = validate_ids
        tables = nn.ModuleDict()
        for config in configs:
            tables[config.name] = _Table(config, _initial(config, weights, device))
        setattr(self, self._TABLES, tables)
        self._stacks = Stacks(configs, tables)
        self._stacks.restack()
        self._split_scale_bias = split_scale_bias
        self._register_state_dict_hook(_write_split_scale_bias)
        self._register_load_state_dict_pre_hook(_read_torchrec_rows, with_module=True)
        self.register_load_state_dict_post_hook(lambda module, _: module._stacks.restack())

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        super()._apply(fn, recurse)
        self._stacks.restack()  # see [Note: quantized stacks]
        return self

    def tables_in_torchrec_layout(self) -> dict[str, torch.Tensor]:
        """Each table's rows as TorchRec stores them (raw bytes; split when the module's
        ``quant_state_dict_split_scale_bias`` is on), keyed as in ``state_dict()``: what a
        TorchRec quantized collection's ``state_dict`` holds (see [Note: TorchRec's quantized
        rows])."""
        out = {}
        alignment = self.layout["row_alignment"]
        configs = {c.name: c for c in self._stacks.configs}
        for name, table in getattr(self, self._TABLES).items():
            config = configs[name]
            rows = to_torchrec(table.weight, config.embedding_dim, config.data_type,
                               alignment=alignment, split=self._split_scale_bias)  # fmt: skip
            out.update({f"{self._TABLES}.{name}.{key}": value for key, value in rows.items()})
        return out

    def _keep_layout(self, register_tbes: bool, row_alignment: int, cache_order: bool) -> None:
        check_row_alignment(row_alignment)
        self.layout = {"register_tbes": register_tbes, "row_alignment": row_alignment,
                       "cache_features_order": cache_order}  # fmt: skip

    @property
    def device(self) -> torch.device:
        return self._device

    def output_dtype(self) -> torch.dtype:
        return self._output_dtype


class EmbeddingBagCollection(_QuantCollection):
    """Quantized `shardkit.EmbeddingBagCollection`: a KeyedJaggedTensor in, a KeyedTensor out.

    Args:
        tables: the tables; each one's ``data_type`` is how it is stored.
        is_weighted: whether the input carries a weight per id.
        device: ``"cpu"`` (torch's quantized operators are CPU-only) or ``"meta"``.
        output_dtype: ``torch.float`` or ``torch.half``.
        table_name_to_quantized_weights: ``{table: (rows, scale_bias or None)}`` as
            `quantize_state_dict` gives; unset: zeros (load a ``state_dict``).
        register_tbes, row_alignment, cache_features_order: FBGEMM's layout switches: checked
            and kept in ``layout``; outputs do not depend on them ([Note: FBGEMM layout switches]).
        quant_state_dict_split_scale_bias: write n-bit tables' ``state_dict`` as TorchRec does
            with this switch (codes, float16 ``weight_qscale`` and ``weight_qbias``).
        validate_ids: refuse ids outside their table (they would read another table's rows).
    """

    _TABLES = "embedding_bags"
    embedding_bags: nn.ModuleDict  # set by _QuantCollection.__init__

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool,
        device: torch.device | str | None = None,
        output_dtype: torch.dtype = torch.float,
        table_name_to_quantized_weights: QuantizedWeights | None = None,
        register_tbes: bool = False,
        quant_state_dict_split_scale_bias: bool = False,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        cache_features_order: bool = False,
        *,
        validate_ids: bool = True,
    ) -> None:
        super().__init__(
            tables, device, output_dtype, table_name_to_quantized_weights,
            quant_state_dict_split_scale_bias, validate_ids,
        )  # fmt: skip
        self._keep_layout(register_tbes, row_alignment, cache_features_order)
        self._is_weighted = is_weighted
        self._configs = list(tables)
        self._feature_names = [f for t in tables for f in t.feature_names]
        self._dims = [t.embedding_dim for t in tables for _ in t.feature_names]

    @classmethod
    def from_float(
        cls, module: EmbeddingBagCollectionInterface, use_precomputed_fake_quant: bool = False
    ) -> EmbeddingBagCollection:
        """The quantized copy of a float `shardkit.EmbeddingBagCollection` whose ``qconfig``
        (a `QuantConfig`) gives the storage types."""
        configs = quantized_configs(module.embedding_bag_configs(), _qconfig(module))
        weights: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        device = quantize_state_dict(module, weights, {c.name: c.data_type for c in configs})
        return cls(configs, module.is_weighted(), device,  # type: ignore[arg-type]
                   output_dtype=_qconfig(module).activation().dtype,
                   table_name_to_quantized_weights=weights, **layout_switches(module))  # fmt: skip

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._configs)

    def is_weighted(self) -> bool:
        return self._is_weighted

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """``features``: one key per feature, batch ``B``. Returns ``[B, sum(dims)]``."""
        if self._is_weighted and features.weights_or_none() is None:
            raise ValueError("this EmbeddingBagCollection is weighted but the KJT has no weights")
        if features.variable_stride_per_key():
            raise ValueError(
                "the quantized EmbeddingBagCollection needs one batch size for all keys; this "
                f"KeyedJaggedTensor has a batch size per key ({features.stride_per_key()})"
            )
        if torch.compiler.is_compiling():  # torch.export: see [Note: serving programs]
            keys: list[str] = features.keys()
            if any(f not in keys for f in self._stacks.feature_order):
                self._stacks.permute(features)  # refuses, naming them
            pooled: list[Any] = self._stacks.traced_pooled(
                features, self._is_weighted, self._validate_ids
            )  # per stack, one [B, D_s] per feature
        else:
            kjt = self._stacks.permute(features)
            pooled = self._stacks.pooled(kjt, self._is_weighted, self._validate_ids)
        by_feature = {}
        for stack, out in zip(self._stacks.stacks, pooled):  # out: [F_s, B, D_s]
            for position, feature in enumerate(stack.features):
                by_feature[feature] = out[position]
        values = torch.cat([by_feature[f] for f in self._feature_names], dim=1)  # [B, sum(D)]
        return KeyedTensor(self._feature_names, self._dims, values.to(self._output_dtype))


class EmbeddingCollection(_QuantCollection):
    """Quantized `shardkit.EmbeddingCollection`: a KeyedJaggedTensor in, ``{feature:
    JaggedTensor}`` out, one row per id.

    Args: as `EmbeddingBagCollection`, with `EmbeddingConfig` tables. ``need_indices=True``
    (TorchRec: each id returned as its JaggedTensor's weights) is refused, as by the float
    `shardkit.EmbeddingCollection`: shardkit's JaggedTensor weights are floats.
    """

    _TABLES = "embeddings"
    embeddings: nn.ModuleDict  # set by _QuantCollection.__init__

    def __init__(
        self,
        tables: Sequence[EmbeddingConfig],
        device: torch.device | str | None = None,
        need_indices: bool = False,
        output_dtype: torch.dtype = torch.float,
        table_name_to_quantized_weights: QuantizedWeights | None = None,
        register_tbes: bool = False,
        quant_state_dict_split_scale_bias: bool = False,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        cache_features_order: bool = False,
        *,
        validate_ids: bool = True,
    ) -> None:
        super().__init__(
            tables, device, output_dtype, table_name_to_quantized_weights,
            quant_state_dict_split_scale_bias, validate_ids,
        )  # fmt: skip
        if need_indices:
            raise ValueError(
                "quantized EmbeddingCollection(need_indices=True): shardkit's JaggedTensor "
                "weights are floats, not ids; leave need_indices False and read the ids from "
                "the input KJT"
            )
        self._keep_layout(register_tbes, row_alignment, cache_features_order)
        self._need_indices = False
        self._configs = list(tables)
        self._feature_names = [f for t in tables for f in t.feature_names]

    @classmethod
    def from_float(
        cls, module: EmbeddingCollectionInterface, use_precomputed_fake_quant: bool = False
    ) -> EmbeddingCollection:
        """The quantized copy of a float `shardkit.EmbeddingCollection` (see the bag one)."""
        configs = quantized_configs(module.embedding_configs(), _qconfig(module))
        weights: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        device = quantize_state_dict(module, weights, {c.name: c.data_type for c in configs})
        need_indices = getattr(module, "need_indices", lambda: False)()
        return cls(configs, device, need_indices,  # type: ignore[arg-type]
                   output_dtype=_qconfig(module).activation().dtype,
                   table_name_to_quantized_weights=weights, **layout_switches(module))  # fmt: skip

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return list(self._configs)

    def embedding_names_by_table(self) -> list[list[str]]:
        return [list(t.feature_names) for t in self._configs]

    def need_indices(self) -> bool:
        return self._need_indices

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """Returns ``{feature: JaggedTensor(values=[n_f, dim], lengths=[B])}``."""
        if torch.compiler.is_compiling():  # torch.export: see [Note: serving programs]
            keys: list[str] = features.keys()
            if any(f not in keys for f in self._stacks.feature_order):
                self._stacks.permute(features)  # refuses, naming them
            return self._stacks.traced_sequence(
                features, self._feature_names, self._output_dtype, self._validate_ids
            )
        kjt = self._stacks.permute(features)
        parts = kjt.split([len(s.features) for s in self._stacks.stacks])
        out: dict[str, JaggedTensor] = {}
        for stack, part in zip(self._stacks.stacks, parts):
            if self._validate_ids:
                self._stacks.check_ids(stack, part)
            ids, _, _ = self._stacks.inputs(stack, part, weighted=False)
            each = torch.arange(ids.numel() + 1, device=ids.device)  # every id its own bag
            assert stack.buffer is not None
            rows = lookup(stack.buffer, stack.data_type, ids, each, None).to(self._output_dtype)
            for feature, piece, jt in zip(
                stack.features, rows.split(part.length_per_key()), part.to_dict().values()
            ):
                out[feature] = JaggedTensor(values=piece, lengths=jt.lengths())
        return {f: out[f] for f in self._feature_names}


def quantize_state_dict(
    module: nn.Module,
    table_name_to_quantized_weights: dict[str, tuple[torch.Tensor, torch.Tensor | None]],
    table_name_to_data_type: Mapping[str, Any],
    table_name_to_num_embeddings_post_pruning: Mapping[str, int] | None = None,
) -> torch.device:
    """Quantize every ``<table>.weight`` of ``module``'s ``state_dict`` named in
    ``table_name_to_data_type`` into ``table_name_to_quantized_weights[table] = (codes,
    scale_bias)`` (``scale_bias`` None for FP32/FP16); returns the tables' device."""
    if table_name_to_num_embeddings_post_pruning:
        raise ValueError(
            "row pruning (table_name_to_num_embeddings_post_pruning) is not supported; quantize "
            "the whole tables"
        )
    device = torch.device("cpu")
    for key, tensor in module.state_dict().items():
        parts = key.split(".")
        if parts[-1] != "weight" or len(parts) < 2 or parts[-2] not in table_name_to_data_type:
            continue
        data_type = table_name_to_data_type[parts[-2]]
        check_data_type(parts[-2], data_type, tensor.shape[1])
        packed = pack(tensor, data_type)
        codes = code_columns(tensor.shape[1], data_type)
        scale_bias = packed[:, codes:] if packed.shape[1] > codes else None
        table_name_to_quantized_weights[parts[-2]] = (packed[:, :codes], scale_bias)
        device = tensor.device
    return device


def _qconfig(module: nn.Module) -> Any:
    qconfig = getattr(module, "qconfig", None)
    if qconfig is None:
        raise ValueError(
            f"{type(module).__name__}.from_float needs module.qconfig (a QuantConfig giving the "
            "storage dtype); or use shardkit.inference.quantize_embeddings, which sets it"
        )
    return qconfig


def _initial(
    config: BaseEmbeddingConfig, weights: QuantizedWeights | None, device: torch.device
) -> torch.Tensor:
    """The table's stored rows: from ``weights`` (checked), else zeros."""
    shape, dtype = packed_shape(config.num_embeddings, config.embedding_dim, config.data_type)
    if weights is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    if config.name not in weights:
        raise ValueError(f"table '{config.name}' has no entry in table_name_to_quantized_weights")
    codes, scale_bias = weights[config.name]
    rows = codes if scale_bias is None else torch.cat([codes, scale_bias], dim=1)
    if tuple(rows.shape) != shape or rows.dtype != dtype:
        raise ValueError(
            f"table '{config.name}': quantized weights are {rows.dtype} {list(rows.shape)} but "
            f"{config.data_type} rows of dim {config.embedding_dim} are {dtype} {list(shape)}"
        )
    return rows.to(device)


def _write_split_scale_bias(
    module: _QuantCollection, state_dict: dict[str, Any], prefix: str, _: Any
) -> None:
    """With ``quant_state_dict_split_scale_bias``, every table as TorchRec writes it."""
    if module._split_scale_bias:
        for key, value in module.tables_in_torchrec_layout().items():
            state_dict[prefix + key] = value


def _read_torchrec_rows(
    module: _QuantCollection, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """Tables saved by TorchRec (its layout, split or not) become shardkit's rows."""
    alignment = module.layout["row_alignment"]
    for config in module._stacks.configs:
        key = f"{prefix}{module._TABLES}.{config.name}.weight"
        value = state_dict.get(key)
        if not isinstance(value, torch.Tensor):
            continue
        qscale = state_dict.pop(key + "_qscale", None)
        qbias = state_dict.pop(key + "_qbias", None)
        dim, data_type = config.embedding_dim, config.data_type
        if qscale is not None or is_torchrec_rows(value, dim, data_type, alignment):
            state_dict[key] = from_torchrec(value, dim, data_type, qscale=qscale, qbias=qbias)


def _check_collection(
    configs: Sequence[BaseEmbeddingConfig],
    device: torch.device,
    output_dtype: torch.dtype,
    split_scale_bias: bool,
) -> None:
    if device.type not in ("cpu", "meta"):
        raise ValueError(
            f"quantized tables are served on CPU (torch's quantized embedding-bag operators are "
            f"CPU-only), got device {device}; use device='cpu'"
        )
    if output_dtype not in (torch.float32, torch.float16):
        raise ValueError(f"output_dtype must be torch.float or torch.half, got {output_dtype}")
    names = [c.name for c in configs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"table names must be unique; {repeated} appear more than once")
    for config in configs:
        check_data_type(config.name, config.data_type, config.embedding_dim)


# As TorchRec's quantized collections, instances of the float ones' interfaces.
EmbeddingBagCollectionInterface.register(EmbeddingBagCollection)
EmbeddingCollectionInterface.register(EmbeddingCollection)
