"""`ManagedCollisionCollection`: one managed-collision module per table, a KJT in and out.

[Note: managed collision in an exported program]
A served model remaps ids but never evicts: it is exported in eval mode, as TorchRec exports its
managed-collision modules, and then the remapping is a pure function of the ids and the slot
buffers (``searchsorted`` in the sorted raw ids, the row of the slot found, else the bucket's
reserved row). Under `torch.export` it is traced as that function, of aten operators only, so
the program serves where shardkit is not installed (not the ``shardkit_graph::remap`` operator
`torch.compile` uses, whose implementation is the live module):

- the eager forward cuts ``values`` per table at ``offset_per_key`` (a host read that would fix
  the program to one batch's id counts); traced, each table's module remaps the whole ``values``
  and ``torch.where`` keeps its rows at the positions of its features (``key_of_bag`` spread
  over the ids), so every size stays the input's;
- the search reads the slot buffers as the module's attributes (the program's buffers, which
  ``load_state_dict`` on the program's module updates), not the search index the eager module
  caches.

In training mode the module records each batch's ids and evicts every ``eviction_interval``
iterations: a window of id batches in Python lists, an iteration count on the host and a branch
on it. A program cannot carry that (it would trace one branch, and the eager operator it could
call instead mutates the live module through a handle that exists only in this process), so
`traced` refuses it and says to call ``.eval()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from shardkit.modules._mc_base import ManagedCollisionModule
from shardkit.modules._traced import key_of_bag
from shardkit.modules.embedding_configs import BaseEmbeddingConfig
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["ManagedCollisionCollection"]


class ManagedCollisionCollection(nn.Module):
    """Remaps the raw ids of every feature to rows of its table, with one module per table.

    All features of a table share its module (their ids count together). The output KJT has
    the features in table order (features not in any table are dropped), the same lengths,
    weights and batch sizes, and rows as values.

    Args:
        managed_collision_modules: ``{table name: module}``, one per table, each with
            ``output_size() == num_embeddings``.
        embedding_configs: the tables (their names and features).
        need_preprocess: kept for TorchRec's signature (sharded modules read it).
    """

    def __init__(
        self,
        managed_collision_modules: Mapping[str, ManagedCollisionModule],
        embedding_configs: Sequence[BaseEmbeddingConfig],
        need_preprocess: bool = True,
    ) -> None:
        super().__init__()
        _check_modules(managed_collision_modules, embedding_configs)
        self._embedding_configs = list(embedding_configs)
        self._managed_collision_modules = nn.ModuleDict(
            {c.name: managed_collision_modules[c.name] for c in embedding_configs}
        )
        self.need_preprocess = need_preprocess
        self._feature_names = [f for c in embedding_configs for f in c.feature_names]
        self._table_feature_splits = [len(c.feature_names) for c in embedding_configs]
        self._order: tuple[tuple[str, ...], list[int]] | None = None  # input keys -> permute

    def embedding_configs(self) -> list[BaseEmbeddingConfig]:
        return list(self._embedding_configs)

    def table_to_number_buckets(self) -> dict[str, int]:
        return {name: m.buckets() for name, m in self._modules_by_table().items()}

    def _modules_by_table(self) -> dict[str, ManagedCollisionModule]:
        return dict(self._managed_collision_modules.items())  # type: ignore[arg-type]

    def _permutation(self, keys: list[str]) -> list[int]:
        if self._order is None or self._order[0] != tuple(keys):
            missing = [f for f in self._feature_names if f not in keys]
            if missing:
                raise ValueError(
                    f"ManagedCollisionCollection: features {missing} of its tables are not keys "
                    f"of the input KeyedJaggedTensor (keys {keys}); give every table's features"
                )
            self._order = (tuple(keys), [keys.index(f) for f in self._feature_names])
        return self._order[1]

    def forward(
        self, features: KeyedJaggedTensor, mutate_miss_lengths: bool = True
    ) -> KeyedJaggedTensor:
        """``features``: raw ids, one key per feature. Returns rows, keys in table order."""
        order = self._permutation(features.keys())
        if order != list(range(len(features.keys()))):
            features = features.permute(order)
        starts = features.offset_per_key()
        lengths = features.lengths()
        bag_starts = features.lengths_offset_per_key()
        rows, key = [], 0
        modules = self._modules_by_table()
        for config, num_keys in zip(self._embedding_configs, self._table_feature_splits):
            first, last = key, key + num_keys
            table = JaggedTensor(
                values=features.values()[starts[first] : starts[last]],
                lengths=lengths[bag_starts[first] : bag_starts[last]],
            )
            remapped = modules[config.name]({config.name: table}, mutate_miss_lengths)
            rows.append(remapped[config.name].values())
            key = last
        values = torch.cat(rows) if rows else features.values()
        return with_values(features, values)

    def traced(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The eval-mode remapping as `torch.export` traces it (see [Note: managed collision in
        an exported program]): ``features`` with each table's ids replaced by rows, keys in the
        input's order (the ids of keys in no table are kept), no host read."""
        if self.training or any(m.training for m in self._managed_collision_modules.values()):
            raise ValueError(
                "torch.export of a managed-collision collection in training mode: its remapper "
                "records every batch's ids and evicts every eviction_interval iterations, state "
                "a program cannot carry; call .eval() before exporting (a served model only "
                "remaps ids, as TorchRec's exported managed-collision modules do)"
            )
        keys = features.keys()
        self._permutation(keys)  # refuses a missing feature, naming it
        values, lengths = features.values(), features.lengths()
        stride = lengths.numel() // max(len(keys), 1)
        key_of_id = torch.repeat_interleave(
            key_of_bag(len(keys), stride, values.device), lengths, output_size=values.numel()
        )
        every = JaggedTensor(values=values, lengths=lengths.new_full((1,), values.numel()))
        out = values
        for config in self._embedding_configs:
            rows = self._managed_collision_modules[config.name]({config.name: every})
            mine = torch.tensor([k in config.feature_names for k in keys], device=values.device)
            out = torch.where(mine[key_of_id], rows[config.name].values(), out)
        return KeyedJaggedTensor(keys, out, features.weights_or_none(), lengths=lengths)

    def evict(self) -> dict[str, torch.Tensor | None]:
        """``{table: rows whose id changed since the last call, or None}``."""
        return {name: m.evict() for name, m in self._modules_by_table().items()}

    def open_slots(self) -> dict[str, torch.Tensor]:
        return {name: m.open_slots() for name, m in self._modules_by_table().items()}


def with_values(kjt: KeyedJaggedTensor, values: torch.Tensor) -> KeyedJaggedTensor:
    """``kjt`` with its ids replaced by ``values`` (same keys, lengths, weights and batch: a
    remapper's output); a variable batch per key stays one."""
    variable = kjt.variable_stride_per_key()
    return KeyedJaggedTensor(
        keys=kjt.keys(),
        values=values,
        weights=kjt.weights_or_none(),
        lengths=kjt.lengths(),
        stride=None if variable else kjt.stride(),
        stride_per_key_per_rank=kjt.stride_per_key_per_rank() if variable else None,
        length_per_key=kjt.length_per_key(),
        offset_per_key=kjt.offset_per_key(),
        inverse_indices=kjt.inverse_indices_or_none(),
    )


def _check_modules(
    modules: Mapping[str, ManagedCollisionModule], configs: Sequence[BaseEmbeddingConfig]
) -> None:
    names = [c.name for c in configs]
    missing = [n for n in names if n not in modules]
    extra = sorted(set(modules) - set(names))
    if missing or extra:
        raise ValueError(
            f"ManagedCollisionCollection needs one module per table: tables {missing} have "
            f"none, modules {extra} have no table; key managed_collision_modules by the "
            f"tables' names {names}"
        )
    for config in configs:
        size = modules[config.name].output_size()
        if size != config.num_embeddings:
            raise ValueError(
                f"table '{config.name}' has num_embeddings {config.num_embeddings} but its "
                f"managed-collision module maps to {size} rows; make zch_size equal "
                "num_embeddings"
            )
