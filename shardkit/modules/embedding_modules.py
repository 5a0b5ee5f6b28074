"""`EmbeddingBagCollection` and `EmbeddingCollection`: many tables, one kernel call per dim.

The unsharded modules, and the spec every sharded version is tested against. TorchRec's
constructor, ``state_dict`` keys (``embedding_bags.<table>.weight``, ``embeddings.<table>.weight``)
and init range; the lookup is shardkit's batched kernel (see [Note: batched kernel]) with an
optional optimizer fused into backward (``fused_params`` or `apply_optimizer_in_backward`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules._graph_ops import graph_pooled, graph_sequence, register
from shardkit.modules._inputs import InputPlan, check_ids, group_input, make_plan
from shardkit.modules._interfaces import (
    EmbeddingBagCollectionInterface,
    EmbeddingCollectionInterface,
    get_embedding_names_by_table,
    process_pooled_embeddings,
    reorder_inverse_indices,
)
from shardkit.modules._kernel import lookup
from shardkit.modules._tables import (
    TableDict,
    TableStack,
    TableWeight,
    check_configs,
    fused_config,
)
from shardkit.modules._traced import assert_ids_in_range, traced_pooled, traced_sequence
from shardkit.modules._vbe import expand_variable_batch
from shardkit.modules.embedding_configs import (
    BaseEmbeddingConfig,
    EmbeddingBagConfig,
    EmbeddingConfig,
)
from shardkit.optim import FusedOptimizer
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingBagCollectionInterface",
    "EmbeddingCollection",
    "EmbeddingCollectionInterface",
    "get_embedding_names_by_table",
    "process_pooled_embeddings",
    "reorder_inverse_indices",
]


class _Collection(nn.Module):
    """What both collections share: table storage, input plans, id checks, fused optimizer."""

    _TABLES = ""  # attribute (and state_dict prefix) holding the tables

    def __init__(
        self,
        configs: Sequence[BaseEmbeddingConfig],
        kind: type,
        device: torch.device | str | None,
        fused_params: Mapping[str, Any] | None,
        validate_ids: bool,
    ) -> None:
        super().__init__()
        check_configs(configs, kind)
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.validate_ids = validate_ids
        params = []
        tables = TableDict()  # see [Note: table names]
        for config in configs:
            param = nn.Parameter(torch.empty(0, device=device))
            param._shardkit_embedding_table = True  # type: ignore[attr-defined]
            params.append(param)
            tables[config.name] = TableWeight(config, param)
        setattr(self, self._TABLES, tables)
        self._stack = TableStack(configs, params, fused_config(fused_params), self._TABLES)
        self._stack.build(device)
        self._plans: dict[tuple[str, ...], InputPlan] = {}
        self._stack.reset_parameters()
        self._graph_handle = register(self)  # see [Note: collections under torch.compile]

    @property
    def device(self) -> torch.device:
        return self._stack.params[0].device if self._stack.params else torch.device("cpu")

    @property
    def fused_optimizer(self) -> FusedOptimizer | None:
        """The optimizer run inside backward (state, param groups), or None if none was asked."""
        self._sync_groups()
        return self._stack.fused_optimizer

    def reset_parameters(self, device: torch.device | str | None = None) -> None:
        """Initialise every table (TorchRec's uniform range, or each config's ``init_fn``).

        On the meta device the tables are first given memory on ``device`` (default CPU).
        """
        if self.device.type == "meta":
            self.to_empty(device=device if device is not None else "cpu")
        self._stack.reset_parameters()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        # See [Note: table views]: convert the stacked buffers, not each view on its own.
        tables = getattr(self, self._TABLES)
        params = [module._parameters.pop("weight") for module in tables.values()]
        try:
            super()._apply(fn, recurse)
            params = self._stack.convert(fn)
        finally:
            for module, param in zip(tables.values(), params):
                module._parameters["weight"] = param
        return self

    def __deepcopy__(self, memo: dict) -> Any:
        # Parameter.__deepcopy__ clones each table on its own, breaking [Note: table views];
        # copy everything, then point the copied Parameters back into the copied buffers.
        new = object.__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        new._stack.convert(lambda t: t)
        new._graph_handle = register(new)
        return new

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._graph_handle = register(self)

    def _sync_groups(self) -> None:
        """Re-stack if `apply_optimizer_in_backward` changed some table's optimizer."""
        if self._stack.needs_rebuild():
            self._stack.build(self.device)
            self._plans.clear()
            self.__dict__.pop("_graph_columns", None)  # see `_graph_ops._columns`

    def _plan(self, keys: tuple[str, ...]) -> InputPlan:
        """The input plan for a KJT with ``keys`` (see [Note: input plan]), cached per order."""
        plan = self._plans.get(keys)
        if plan is None:
            plan = make_plan(keys, self._stack.configs, self._stack.groups)
            if not torch.compiler.is_compiling():  # a traced forward leaves the module alone
                self._plans[keys] = plan
        return plan

    def _traced_plan(self, features: KeyedJaggedTensor) -> InputPlan:
        """The plan of an exported forward (see [Note: exported lookups]): its checks in the
        graph, none that reads the data on the host."""
        if features.variable_stride_per_key():
            raise ValueError(
                f"{type(self).__name__} under torch.export needs one batch size for all keys; "
                f"this KeyedJaggedTensor has a batch size per key ({features.stride_per_key()})"
            )
        plan = self._plan(tuple(features.keys()))
        if self.validate_ids:
            assert_ids_in_range(features, plan)
        return plan

    def _prepare(
        self, features: KeyedJaggedTensor, *, validate: bool = True
    ) -> tuple[KeyedJaggedTensor, InputPlan]:
        """``features`` in the plan's key order, and the plan; checks the input first (when
        ``validate_ids``, and ``validate``: a backward recomputing its forward's input skips)."""
        self._sync_groups()
        validate = validate and self.validate_ids
        if features.variable_stride_per_key():
            raise ValueError(
                f"{type(self).__name__} needs one batch size for all keys; this "
                f"KeyedJaggedTensor has a batch size per key ({features.stride_per_key()})"
            )
        if validate:
            features.validate()  # lengths vs values, offsets, weights: names the key
        plan = self._plan(tuple(features.keys()))
        if plan.permute is not None:
            features = features.permute(plan.permute)
        if validate:
            check_ids(features, plan)
        return features, plan


class EmbeddingBagCollection(_Collection):
    """Pooled lookups in many tables: a KeyedJaggedTensor in, a KeyedTensor out.

    Each feature of each table is a key of the input; each key's bag of ids (SUM or MEAN pooled,
    optionally weighted per id) becomes one ``embedding_dim`` vector per example.

    Example::

        ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="product_table", embedding_dim=64, num_embeddings=4096,
                               feature_names=["product"]),
            EmbeddingBagConfig(name="user_table", embedding_dim=64, num_embeddings=4096,
                               feature_names=["user"]),
        ])
        kjt = KeyedJaggedTensor(keys=["product", "user"],
                                values=torch.tensor([101, 202, 303, 404, 505, 606]),
                                lengths=torch.tensor([2, 0, 1, 1, 1, 1]))
        ebc(kjt).to_dict()["product"].shape   # torch.Size([3, 64]): batch 3, dim 64

    Args:
        tables: the tables (unique names; a feature belongs to one table).
        is_weighted: whether the input KJT carries a weight per id.
        device: where the tables live; ``"meta"`` allocates nothing until `reset_parameters`
            (or sharding) materialises them.
        fused_params: optimizer fused into backward, TorchRec's dict, e.g.
            ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}``.
        validate_ids: check the input (`KeyedJaggedTensor.validate`: lengths, offsets and
            weights agree with the values) and that every id is within its table: a clear error
            instead of a wrong answer. False skips these passes over the input, for speed.
    """

    _TABLES = "embedding_bags"
    embedding_bags: TableDict  # set by _Collection.__init__

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        *,
        fused_params: Mapping[str, Any] | None = None,
        validate_ids: bool = True,
    ) -> None:
        self._is_weighted = is_weighted
        super().__init__(tables, EmbeddingBagConfig, device, fused_params, validate_ids)
        self._feature_names = [f for t in tables for f in t.feature_names]
        self._dims = [t.embedding_dim for t in tables for _ in t.feature_names]

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._stack.configs)  # type: ignore[arg-type]

    def is_weighted(self) -> bool:
        return self._is_weighted

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """``features``: one key per feature, batch ``B``. Returns ``[B, sum(dims)]`` keyed by feature."""
        if self._is_weighted and features.weights_or_none() is None:
            raise ValueError("this EmbeddingBagCollection is weighted but the KJT has no weights")
        if torch.compiler.is_exporting():  # see [Note: exported lookups]
            plan = self._traced_plan(features)
            weights = [group.tables.weight for group in self._stack.groups]
            values = traced_pooled(features, plan, weights, self._is_weighted, self._feature_names)
            return KeyedTensor(self._feature_names, self._dims, values)
        if torch.compiler.is_compiling() and not features.variable_stride_per_key():
            return graph_pooled(self, features)  # see [Note: collections under torch.compile]
        return self._pooled(features)

    def _pooled(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """The eager forward."""
        # a batch size per key (VBE): pooled per example of the full batch, see `_vbe`
        kjt, plan = self._prepare(expand_variable_batch(features))
        stride = kjt.stride()
        pooled: dict[str, torch.Tensor] = {}
        for group, spec in zip(self._stack.groups, plan.groups):
            inputs = group_input(kjt, spec)
            weights = inputs.per_sample_weights
            if not self._is_weighted and not any(spec.mean_per_key):
                weights = None
            dim = group.tables.dim
            out = lookup(
                group.tables, inputs.ids, inputs.offsets, weights, group.params, batch_size=stride
            )  # [B, K_g * D], example-major (a batch of 0: [0, D])
            if out.shape != (stride, spec.num_keys * dim):
                out = out.view(stride, spec.num_keys * dim)  # (no view node in the usual case)
            if len(self._stack.groups) == 1 and plan.keys == tuple(self._feature_names):
                return KeyedTensor(self._feature_names, self._dims, out)
            for position in range(spec.num_keys):
                key = plan.keys[spec.first_key + position]
                pooled[key] = out[:, position * dim : (position + 1) * dim]
        values = torch.cat([pooled[f] for f in self._feature_names], dim=1)
        return KeyedTensor(self._feature_names, self._dims, values)


class EmbeddingCollection(_Collection):
    """Per-id lookups in many tables: a KeyedJaggedTensor in, a dict of JaggedTensors out.

    Each id becomes its own row (no pooling): ``out[feature].values()`` is ``[num_ids, dim]``
    with the input's lengths, e.g. for sequence models.

    Args: as `EmbeddingBagCollection`, with `EmbeddingConfig` tables and no weights, and:
        need_indices: TorchRec's outputs carrying the ids as integer weights; shardkit's
            JaggedTensor weights are floats, so only False (read the ids from the input).
        use_gather_select, use_gather_select_per_sharding: TorchRec's choice of FBGEMM
            kernel; shardkit has one kernel, and its output is the same either way.
    """

    _TABLES = "embeddings"
    embeddings: TableDict  # set by _Collection.__init__

    def __init__(
        self,
        tables: Sequence[EmbeddingConfig],
        device: torch.device | str | None = None,
        need_indices: bool = False,
        use_gather_select: bool = False,
        use_gather_select_per_sharding: Mapping[str, bool] | None = None,
        *,
        fused_params: Mapping[str, Any] | None = None,
        validate_ids: bool = True,
    ) -> None:
        super().__init__(tables, EmbeddingConfig, device, fused_params, validate_ids)
        self._feature_names = [f for t in tables for f in t.feature_names]
        if need_indices:
            raise ValueError(
                "EmbeddingCollection(need_indices=True): shardkit's JaggedTensor weights are "
                "floats, not ids; leave need_indices False and read the ids from the input KJT"
            )
        self._need_indices = False
        del use_gather_select, use_gather_select_per_sharding  # one kernel: same output

    def need_indices(self) -> bool:
        return self._need_indices

    def embedding_dim(self) -> int:
        """The dimension every table shares (TorchRec's sequence collections need one)."""
        dims = sorted({t.embedding_dim for t in self._stack.configs})
        if len(dims) != 1:
            raise ValueError(f"the tables have several dimensions {dims}; no single embedding_dim")
        return dims[0]

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return list(self._stack.configs)  # type: ignore[arg-type]

    def embedding_names_by_table(self) -> list[list[str]]:
        return [list(t.feature_names) for t in self._stack.configs]

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """Returns ``{feature: JaggedTensor(values=[n_f, dim], lengths=[B])}``. A batch size
        per key (VBE) gives every key the full batch's ``B`` bags (see `_vbe`), as TorchRec's
        sharded EmbeddingCollection does (its unsharded one returns the deduplicated bags)."""
        if torch.compiler.is_exporting():  # see [Note: exported lookups]
            plan = self._traced_plan(features)
            weights = [group.tables.weight for group in self._stack.groups]
            return traced_sequence(features, plan, weights, self._feature_names)
        if torch.compiler.is_compiling() and not features.variable_stride_per_key():
            return graph_sequence(self, features)  # see [Note: collections under torch.compile]
        return self._sequence(features)

    def _sequence(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """The eager forward."""
        kjt, plan = self._prepare(expand_variable_batch(features))
        out: dict[str, JaggedTensor] = {}
        for group, spec in zip(self._stack.groups, plan.groups):
            inputs = group_input(kjt, spec)
            rows = lookup(group.tables, inputs.ids, None, None, group.params)  # [N_g, D]
            stride = kjt.stride()
            for position, piece in enumerate(torch.split(rows, inputs.length_per_key)):
                lengths = inputs.lengths[position * stride : (position + 1) * stride]
                out[plan.keys[spec.first_key + position]] = JaggedTensor(piece, lengths=lengths)
        return {f: out[f] for f in self._feature_names}


EmbeddingBagCollectionInterface.register(EmbeddingBagCollection)
EmbeddingCollectionInterface.register(EmbeddingCollection)
