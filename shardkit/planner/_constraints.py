"""`ParameterConstraints`: what the user allows or knows about one table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.types import EmbeddingComputeKernel, ShardingType

__all__ = ["ParameterConstraints"]


@dataclass(frozen=True, kw_only=True)
class ParameterConstraints:
    """Limits and input statistics for one table, keyed by table name in the planner's
    ``constraints`` dict (TorchRec's fields and meaning).

    Args:
        sharding_types: the only sharding types the planner may use for the table
            (`ShardingType` or their values, e.g. ``[ShardingType.ROW_WISE.value]``).
        compute_kernels: the only kernels it may use (``"fused"``, ``"batched_dense"``...).
        min_partition: narrowest column-wise shard, in columns (default 32).
        pooling_factors: average ids per example, one per feature of the table (default 1.0
            for each feature).
        num_poolings: bags per example, one per feature (default 1.0).
        batch_sizes: examples per rank per step, one per feature (default: the planner's).
        is_weighted: the features carry a weight per id.
        feature_names: the features the statistics above are for, in order (documentation:
            the planner takes the table's features in its config's order).

    Example::

        ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value], pooling_factors=[20.0])
    """

    sharding_types: Sequence[ShardingType | str] | None = None
    compute_kernels: Sequence[EmbeddingComputeKernel | str] | None = None
    min_partition: int | None = None
    pooling_factors: Sequence[float] | None = None
    num_poolings: Sequence[float] | None = None
    batch_sizes: Sequence[int] | None = None
    is_weighted: bool = False
    feature_names: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.sharding_types is not None:
            types = _parsed("sharding_types", self.sharding_types, ShardingType.parse)
            object.__setattr__(self, "sharding_types", types)
        if self.compute_kernels is not None:
            kernels = _parsed("compute_kernels", self.compute_kernels, EmbeddingComputeKernel.parse)
            object.__setattr__(self, "compute_kernels", kernels)
        if self.min_partition is not None and (
            not isinstance(self.min_partition, int) or self.min_partition < 1
        ):
            raise ValueError(
                f"min_partition must be an int >= 1 column, got {self.min_partition!r}"
            )
        self._check_statistics()
        if self.feature_names is not None:
            object.__setattr__(self, "feature_names", tuple(self.feature_names))

    def _check_statistics(self) -> None:
        lengths = {}
        for name in ("pooling_factors", "num_poolings", "batch_sizes"):
            values = getattr(self, name)
            if values is None:
                continue
            values = tuple(values)
            bad = [v for v in values if not (isinstance(v, int | float) and math.isfinite(v))]
            low_ok = all(v > 0 for v in values if v not in bad)
            if bad or not low_ok or not values:
                raise ValueError(
                    f"{name} must be a non-empty list of finite numbers > 0, got {list(values)}"
                )
            if name == "batch_sizes" and any(not isinstance(v, int) for v in values):
                raise ValueError(f"batch_sizes must be ints, got {list(values)}")
            lengths[name] = len(values)
            object.__setattr__(self, name, values)
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"pooling_factors, num_poolings and batch_sizes give one value per feature and "
                f"must have the same length; got lengths {lengths}"
            )

    def num_inputs(self) -> int | None:
        """Features these statistics describe (None when no list is given)."""
        for name in ("pooling_factors", "num_poolings", "batch_sizes"):
            values = getattr(self, name)
            if values is not None:
                return len(values)
        return None


def _parsed(name: str, values: Sequence[object], parse: object) -> tuple:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list, got {values!r}")
    if not values:
        raise ValueError(f"{name} is empty: it would allow nothing; leave it None to allow all")
    parsed = tuple(parse(v) for v in values)  # type: ignore[operator]
    return tuple(dict.fromkeys(parsed))
