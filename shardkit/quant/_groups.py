"""Quantized tables stacked by (data type, dim): one operator call per stack.

[Note: quantized stacks]
Tables of the same data type and dim are stored in one buffer, rows after rows, and each table's
registered buffer (``embedding_bags.<table>.weight``: TorchRec's ``state_dict`` names) is a view
of its rows; a table's ids are shifted by its first row, so one operator call looks up every
feature of a stack. Loading with ``assign=True`` or moving the module gives the tables new
tensors: `Stacks.restack` (a ``load_state_dict`` post-hook and ``_apply``) copies them back into
one buffer per stack and re-points the views.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from shardkit.modules import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    PoolingType,
    ids_per_key_unbacked,
    key_of_bag,
    traced_group_input,
)
from shardkit.quant._pack import lookup, register_quantized_meta
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["Stack", "Stacks"]


@dataclass
class Stack:
    """Tables of one (data type, dim) in one buffer."""

    data_type: DataType
    dim: int
    tables: list[int]  # indices into the collection's configs
    features: list[str]  # their features, table after table
    row_starts: list[int]  # first row of each table, then the total
    buffer: torch.Tensor | None = None

    def feature_rows(self, configs: Sequence[BaseEmbeddingConfig]) -> list[int]:
        """First row of each feature's table, per feature."""
        return [
            start
            for start, index in zip(self.row_starts, self.tables)
            for _ in configs[index].feature_names
        ]


class Stacks:
    """The stacks of a collection, and the ids/offsets/weights each lookup takes."""

    def __init__(self, configs: Sequence[BaseEmbeddingConfig], holders: nn.ModuleDict) -> None:
        self.configs = list(configs)
        self.holders = holders  # {table: module holding buffer "weight"}
        by_key: dict[tuple[DataType, int], list[int]] = {}
        for index, config in enumerate(self.configs):
            by_key.setdefault((config.data_type, config.embedding_dim), []).append(index)
        self.stacks = []
        for (data_type, dim), indices in by_key.items():
            starts = [0]
            for index in indices:
                starts.append(starts[-1] + self.configs[index].num_embeddings)
            features = [f for i in indices for f in self.configs[i].feature_names]
            self.stacks.append(Stack(data_type, dim, indices, features, starts))
        self.feature_order = [f for s in self.stacks for f in s.features]
        self._permutes: dict[tuple[str, ...], list[int]] = {}

    def restack(self) -> None:
        """Copy every table into its stack's buffer; point the tables' buffers at their rows."""
        for stack in self.stacks:
            parts = [self._rows(i) for i in stack.tables]
            stack.buffer = torch.cat(parts) if len(parts) > 1 else parts[0]
            for index, start, end in zip(stack.tables, stack.row_starts, stack.row_starts[1:]):
                self.holders[self.configs[index].name].weight = stack.buffer[start:end]

    def _rows(self, index: int) -> torch.Tensor:
        rows = self.holders[self.configs[index].name].weight
        assert isinstance(rows, torch.Tensor), "a table holder keeps its rows as buffer weight"
        return rows

    def permute(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The input's keys in stack order (a feature missing from the input is refused)."""
        keys = tuple(features.keys())
        order = self._permutes.get(keys)
        if order is None:
            missing = [f for f in self.feature_order if f not in keys]
            if missing:
                raise ValueError(
                    f"features {missing} of the quantized tables are not keys of the input "
                    f"(keys {list(keys)}); give every table's features"
                )
            order = [keys.index(f) for f in self.feature_order]
            self._permutes[keys] = order
        if order == list(range(len(keys))):
            return features
        return features.permute(order)

    def pooled(
        self, features: KeyedJaggedTensor, weighted: bool, validate: bool
    ) -> list[torch.Tensor]:
        """Per stack, ``[F_s, B, D_s]`` pooled vectors (``features`` in stack order)."""
        out = []
        parts = features.split([len(s.features) for s in self.stacks])
        for stack, part in zip(self.stacks, parts):
            if validate:
                self.check_ids(stack, part)
            ids, offsets, weights = self.inputs(stack, part, weighted)
            assert stack.buffer is not None
            rows = lookup(stack.buffer, stack.data_type, ids, offsets, weights)
            out.append(rows.view(len(stack.features), features.stride(), stack.dim))
        return out

    def traced_pooled(
        self, features: KeyedJaggedTensor, weighted: bool, validate: bool
    ) -> list[list[torch.Tensor]]:
        """`pooled` as `torch.export` traces it: no host sync, ``features`` in any key order
        (see [Note: exported lookups] in ``shardkit.modules``); the id checks in the graph.
        Per stack, a ``[B, D_s]`` tensor per feature (not one ``[F_s, B, D_s]``: a view with
        the batch size as a dimension would refuse a batch of one)."""
        register_quantized_meta()  # see [Note: quantized operators under torch.export]
        index_of = {key: i for i, key in enumerate(features.keys())}
        stride = features.lengths().numel() // max(len(index_of), 1)
        if validate:
            self._assert_ids(features, index_of)
        out = []
        for stack in self.stacks:
            mean = [_is_mean(self.configs[i]) for i in stack.tables for _ in self.configs[i].feature_names]  # fmt: skip
            ids, offsets, weights = traced_group_input(
                features, [index_of[f] for f in stack.features], stack.feature_rows(self.configs),
                mean, use_weights=weighted,
            )  # fmt: skip
            assert stack.buffer is not None
            rows = lookup(stack.buffer, stack.data_type, ids, offsets, weights)  # [F_s * B, D]
            out.append([rows[k * stride : (k + 1) * stride] for k in range(len(stack.features))])
        return out

    def traced_sequence(
        self,
        features: KeyedJaggedTensor,
        feature_names: Sequence[str],
        output_dtype: torch.dtype,
        validate: bool,
    ) -> dict[str, JaggedTensor]:
        """A sequence collection's rows as `torch.export` traces them: each stack looks up every
        id in the KJT's own order (each id its own bag; the ids of other stacks' keys read row
        0), cut per key at the per-key id counts as unbacked sizes, not the host's
        ``length_per_key`` (see [Note: exported lookups] in ``shardkit.modules``)."""
        register_quantized_meta()  # see [Note: quantized operators under torch.export]
        index_of = {key: i for i, key in enumerate(features.keys())}
        values, lengths = features.values(), features.lengths()
        stride = lengths.numel() // max(len(index_of), 1)
        if validate:
            self._assert_ids(features, index_of)
        starts, counts = ids_per_key_unbacked(features)
        key_of_id = torch.repeat_interleave(
            key_of_bag(len(index_of), stride, values.device), lengths, output_size=values.numel()
        )
        each = torch.arange(values.numel() + 1, device=values.device)  # every id its own bag
        out: dict[str, JaggedTensor] = {}
        for stack in self.stacks:
            base = [-1] * len(index_of)  # -1: a key of another stack (or of no table)
            for feature, row in zip(stack.features, stack.feature_rows(self.configs)):
                base[index_of[feature]] = row
            shift = torch.tensor(base, dtype=torch.int64, device=values.device)[key_of_id]
            ids = torch.where(shift >= 0, values.long() + shift, 0)
            assert stack.buffer is not None
            rows = lookup(stack.buffer, stack.data_type, ids, each, None).to(output_dtype)
            for feature in stack.features:
                k = index_of[feature]
                piece = rows.narrow(0, starts[k], counts[k])
                out[feature] = JaggedTensor(piece, lengths=lengths[k * stride : (k + 1) * stride])
        return {f: out[f] for f in feature_names}

    def _assert_ids(self, features: KeyedJaggedTensor, index_of: dict[str, int]) -> None:
        values, lengths = features.values(), features.lengths()
        stride = lengths.numel() // max(len(index_of), 1)
        bag_key = key_of_bag(len(index_of), stride, values.device)
        key_of_id = torch.repeat_interleave(bag_key, lengths, output_size=values.numel())
        for config in self.configs:
            for feature in config.feature_names:
                rows = config.num_embeddings
                bad = (key_of_id == index_of[feature]) & ((values < 0) | (values >= rows))
                torch._assert_async(
                    ~bad.any(),
                    f"feature '{feature}': an id is outside its table of {rows} rows; ids must "
                    f"be in [0, {rows})",
                )

    def check_ids(self, stack: Stack, part: KeyedJaggedTensor) -> None:
        """Refuse an id outside its table (it would read another table of the stack)."""
        rows = [self.configs[i].num_embeddings for i in stack.tables for _ in self.configs[i].feature_names]  # fmt: skip
        values = part.values()
        limit = torch.repeat_interleave(
            torch.tensor(rows, device=values.device),
            torch.tensor(part.length_per_key(), device=values.device),
            output_size=values.numel(),
        )
        bad = (values < 0) | (values >= limit)
        if bool(bad.any()):
            at = int(bad.nonzero()[0])
            key = int(torch.searchsorted(torch.tensor(part.offset_per_key()[1:]), at, right=True))
            raise ValueError(
                f"feature '{stack.features[key]}': id {int(values[at])} is outside its table "
                f"of {rows[key]} rows; ids must be in [0, {rows[key]})"
            )

    def inputs(
        self, stack: Stack, part: KeyedJaggedTensor, weighted: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Shifted ids ``[N]``, offsets ``[F_s * B + 1]`` and per-id weights ``[N]`` or None."""
        lengths = part.lengths().long()
        shift = torch.tensor(stack.feature_rows(self.configs), device=lengths.device)
        per_key = torch.tensor(part.length_per_key(), device=lengths.device)
        ids = part.values().long() + torch.repeat_interleave(shift, per_key, output_size=part.values().numel())  # fmt: skip
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.long, device=lengths.device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        weights = part.weights() if weighted else None
        mean = [_is_mean(self.configs[i]) for i in stack.tables for _ in self.configs[i].feature_names]  # fmt: skip
        if any(mean):
            weights = _mean_weights(lengths, mean, part.stride(), weights)
        return ids, offsets, weights


def _is_mean(config: BaseEmbeddingConfig) -> bool:
    return isinstance(config, EmbeddingBagConfig) and config.pooling == PoolingType.MEAN


def _mean_weights(
    lengths: torch.Tensor, mean: list[bool], stride: int, weights: torch.Tensor | None
) -> torch.Tensor:
    """Per-id weights that turn SUM into MEAN for the features of MEAN tables."""
    per_bag = torch.where(
        torch.tensor(mean, device=lengths.device).repeat_interleave(stride),
        1.0 / lengths.clamp(min=1).float(),
        torch.ones((), device=lengths.device),
    )
    per_id = torch.repeat_interleave(per_bag, lengths)
    return per_id if weights is None else per_id * weights.float()
