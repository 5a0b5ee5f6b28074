"""How a table is cut (`ShardingType`) and which kernel looks it up (`EmbeddingComputeKernel`).

Both are ``str`` enums with TorchRec's string values, so TorchRec code that compares a plan's
field with ``ShardingType.ROW_WISE.value`` keeps working; inside shardkit they are enums, and
strings become enums at the edges with `parse`, which every enum of the vocabulary gets from
`ParsableEnum`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["EmbeddingComputeKernel", "ParsableEnum", "ShardingType"]

E = TypeVar("E", bound="ParsableEnum")


class ParsableEnum(enum.Enum):
    """An enum whose members also come from strings at the edges (configs, the command line,
    TorchRec code): `parse` takes a member, its value or its name, in any case and with ``-``
    for ``_``, or one of the extra spellings a subclass lists in `_aliases`.

    Example::

        ShardingType.parse("ROW_WISE") is ShardingType.parse("row-wise") is ShardingType.ROW_WISE
    """

    @classmethod
    def parse(cls: type[E], value: E | str) -> E:
        """``value`` as a member; ValueError (naming the choices) if it is none."""
        if isinstance(value, cls):
            return value
        member = cls.lookup(value)
        if member is None:
            raise ValueError(cls._unknown(value))
        return member

    @classmethod
    def lookup(cls: type[E], value: Any) -> E | None:
        """The member ``value`` spells, or None."""
        key = str(value).strip().lower().replace("-", "_")
        for member in cls:
            if key in (str(member.value).lower(), member.name.lower()):
                return member
        return cls._aliases().get(key)

    @classmethod
    def _aliases(cls: type[E]) -> Mapping[str, E]:
        """Extra spellings (lower case, ``_`` for ``-``) -> member."""
        return {}

    @classmethod
    def _unknown(cls, value: Any) -> str:
        """The error message for a ``value`` that is no member."""
        return f"unknown {cls.__name__} {value!r}; choose one of {[m.value for m in cls]}"


class _ValueStrEnum(str, ParsableEnum):
    """A ``str`` enum that prints and formats as its value (``"row_wise"``), as TorchRec's do."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@enum.unique
class ShardingType(_ValueStrEnum):
    """How one embedding table is split over ranks.

    A table of ``R`` rows and ``D`` columns on ``W`` ranks in hosts of ``L`` ranks:

    - ``TABLE_WISE``: the whole ``[R, D]`` table on one rank.
    - ``ROW_WISE``: ``W`` shards of about ``R / W`` rows, shard ``i`` on rank ``i``.
    - ``COLUMN_WISE``: ``k`` shards of about ``D / k`` columns on ``k`` different ranks.
    - ``TABLE_ROW_WISE``: row-wise over the ``L`` ranks of one host.
    - ``TABLE_COLUMN_WISE``: column-wise over ranks of one host.
    - ``GRID_SHARD``: ``k`` column blocks, each row-wise over the ranks of one host.
    - ``DATA_PARALLEL``: a full replica on every rank.

    Rows or columns that do not divide evenly are split as evenly as possible: 10 rows on 3
    ranks are shards of 4, 3 and 3 rows.
    """

    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    GRID_SHARD = "grid_shard"

    @classmethod
    def _unknown(cls, value: Any) -> str:
        return f"unknown sharding type {value!r}; choose one of {[m.value for m in cls]}"


@enum.unique
class EmbeddingComputeKernel(_ValueStrEnum):
    """The kernel that looks rows up.

    - ``FUSED``: shardkit's batched kernel with the optimizer fused into backward; no gradient
      of the table is ever made (TorchRec's ``"fused"``).
    - ``DENSE``: the batched kernel with autograd: a dense gradient of the table that a regular
      optimizer steps; the only kernel data-parallel tables use (TorchRec's ``"dense"``).

    Values are TorchRec 1.8's (``"fused"``, ``"dense"``); `parse` also accepts the spellings
    of the tutorials' older TorchRec (``"batched_fused"``, ``"batched_dense"``), so plans and
    checkpoints written with those still load.
    """

    DENSE = "dense"
    FUSED = "fused"

    @classmethod
    def _aliases(cls) -> Mapping[str, EmbeddingComputeKernel]:
        return {"batched_fused": cls.FUSED, "batched_dense": cls.DENSE}

    @classmethod
    def _unknown(cls, value: Any) -> str:
        return (
            f"unknown or unsupported compute kernel {value!r}; shardkit has "
            f"{[m.value for m in cls]} (also spelled 'batched_dense', 'batched_fused'); UVM, "
            "quantized and "
            "key-value kernels are not implemented"
        )

    @classmethod
    def _missing_(cls, value: object) -> EmbeddingComputeKernel | None:
        # EmbeddingComputeKernel("fused") works as EmbeddingComputeKernel.parse("fused").
        return cls.lookup(value)
