"""Sharding plans: plain data that prints as in TorchRec's tutorials and round-trips through JSON.

A plan for 4 tables on 2 ranks, printed (``print(plan)``)::

    {'': {'large_table_0': ParameterSharding(sharding_type='table_wise',
        compute_kernel='batched_fused', ranks=[0], sharding_spec=EnumerableShardingSpec(
        shards=[ShardMetadata(shard_offsets=[0, 0], shard_sizes=[4096, 64],
        placement=rank:0/cpu)])), ...}}

The outer key is the module's path in the model (``''``: the model itself), the inner key the
table name. Each shard says where it starts in the table (``shard_offsets``: row, column), how
big it is (``shard_sizes``: rows, columns) and where it lives (``placement``: rank and device).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from shardkit.types._enums import EmbeddingComputeKernel, ShardingType

__all__ = [
    "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec",
    "ParameterSharding",
    "ShardMetadata",
    "ShardPlacement",
    "ShardingPlan",
    "placement",
]

_JSON_FORMAT = "shardkit.sharding_plan"
_JSON_VERSION = 1
# Placements are immutable, so parsed ones are shared; device names are normalised once.
_MAX_CACHED = 1 << 16
_PARSED: dict[str, ShardPlacement] = {}
_DEVICES: dict[object, str] = {}


class ShardPlacement:
    """Where a shard lives: a rank and its device, printed ``rank:0/cpu`` or ``rank:1/cuda:1``.

    Has the methods of torch's ``_remote_device`` that TorchRec code calls: `rank()` and
    `device()`.
    """

    __slots__ = ("_device", "_rank")

    def __init__(self, rank: int, device: str | torch.device) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ValueError(f"a placement's rank must be an int >= 0, got {rank!r}")
        self._rank = rank
        name = _DEVICES.get(device)
        if name is None:
            name = str(torch.device(device))
            if isinstance(device, str):
                _DEVICES[device] = name
        self._device = name

    @classmethod
    def parse(cls, text: str) -> ShardPlacement:
        """From ``"rank:<r>/<device>"``, e.g. ``"rank:1/cuda:1"``."""
        parsed = _PARSED.get(text)
        if parsed is not None:
            return parsed
        head, _, device = str(text).partition("/")
        prefix, _, rank = head.partition(":")
        if prefix != "rank" or not rank.isdigit() or not device:
            raise ValueError(
                f"placement {text!r} is not of the form 'rank:<r>/<device>' (e.g. 'rank:0/cpu')"
            )
        parsed = cls(int(rank), device)
        if len(_PARSED) < _MAX_CACHED:
            _PARSED[text] = parsed
        return parsed

    def rank(self) -> int:
        return self._rank

    def device(self) -> torch.device:
        return torch.device(self._device)

    def __repr__(self) -> str:
        return f"rank:{self._rank}/{self._device}"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardPlacement):
            return NotImplemented
        return (self._rank, self._device) == (other._rank, other._device)

    def __hash__(self) -> int:
        return hash((self._rank, self._device))

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShardPlacement, (self._rank, self._device))


def placement(compute_device: str, rank: int, local_world_size: int) -> ShardPlacement:
    """A rank's placement: ``rank:r/cpu`` on CPUs, ``rank:r/cuda:<r % local_world_size>`` on GPUs."""
    if compute_device == "cpu":
        return ShardPlacement(rank, "cpu")
    return ShardPlacement(rank, f"{compute_device}:{rank % local_world_size}")


@dataclass(frozen=True, slots=True)
class ShardMetadata:
    """One shard: ``shard_sizes`` ``[rows, columns]`` of the table starting at ``shard_offsets``
    ``[row, column]``, stored at ``placement`` (a `ShardPlacement` or its ``"rank:0/cpu"`` text)."""

    shard_offsets: list[int]
    shard_sizes: list[int]
    placement: ShardPlacement

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_offsets", _pair("shard_offsets", self.shard_offsets, 0))
        object.__setattr__(self, "shard_sizes", _pair("shard_sizes", self.shard_sizes, 0))
        if not isinstance(self.placement, ShardPlacement):
            object.__setattr__(self, "placement", ShardPlacement.parse(self.placement))


def _pair(name: str, values: Any, low: int) -> list[int]:
    # Plans of 1,000 row-wise tables on 1,024 ranks have a million shards: keep this lean.
    if len(values) == 2:
        first, second = values
        if type(first) is int and type(second) is int and first >= low and second >= low:
            return [first, second]
    raise ValueError(f"{name} must be two ints >= {low} (rows, columns), got {list(values)}")


@dataclass(frozen=True)
class EnumerableShardingSpec:
    """The list of a table's shards."""

    shards: list[ShardMetadata] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shards", list(self.shards))
        for shard in self.shards:
            if not isinstance(shard, ShardMetadata):
                raise TypeError(f"shards must be ShardMetadata, got {type(shard).__name__}")


@dataclass(frozen=True)
class ParameterSharding:
    """How one table is sharded.

    Args:
        sharding_type: a `ShardingType` (or its value, e.g. ``"table_wise"``).
        compute_kernel: an `EmbeddingComputeKernel` (or ``"batched_fused"``, ``"fused"``...).
        ranks: the rank of each shard, in shard order (every rank for data-parallel).
        sharding_spec: the shards; None for data-parallel (a full replica on each rank).
    """

    sharding_type: ShardingType
    compute_kernel: EmbeddingComputeKernel
    ranks: list[int] | None = None
    sharding_spec: EnumerableShardingSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding_type", ShardingType.parse(self.sharding_type))
        object.__setattr__(
            self, "compute_kernel", EmbeddingComputeKernel.parse(self.compute_kernel)
        )
        if self.ranks is not None:
            object.__setattr__(self, "ranks", list(self.ranks))
        spec = self.sharding_spec
        if self.sharding_type == ShardingType.DATA_PARALLEL:
            if spec is not None:
                raise ValueError("data_parallel replicates the table: its sharding_spec is None")
            return
        if spec is None:
            raise ValueError(f"{self.sharding_type.value} sharding needs a sharding_spec of shards")
        shard_ranks = [shard.placement.rank() for shard in spec.shards]
        if self.ranks is not None and self.ranks != shard_ranks:
            raise ValueError(
                f"ranks {self.ranks} do not match the ranks of the shards' placements "
                f"{shard_ranks}; list one rank per shard, in shard order"
            )

    def __repr__(self) -> str:
        return (
            f"ParameterSharding(sharding_type={self.sharding_type.value!r}, "
            f"compute_kernel={self.compute_kernel.value!r}, ranks={self.ranks!r}, "
            f"sharding_spec={self.sharding_spec!r})"
        )

    def to_dict(self) -> dict[str, Any]:
        shards = None
        if self.sharding_spec is not None:
            shards = [
                {
                    "offsets": shard.shard_offsets,
                    "sizes": shard.shard_sizes,
                    "placement": str(shard.placement),
                }
                for shard in self.sharding_spec.shards
            ]
        return {
            "sharding_type": self.sharding_type.value,
            "compute_kernel": self.compute_kernel.value,
            "ranks": self.ranks,
            "shards": shards,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParameterSharding:
        shards = data.get("shards")
        spec = None
        if shards is not None:
            spec = EnumerableShardingSpec(
                [ShardMetadata(s["offsets"], s["sizes"], s["placement"]) for s in shards]
            )
        return cls(data["sharding_type"], data["compute_kernel"], data.get("ranks"), spec)


class EmbeddingModuleShardingPlan(dict[str, ParameterSharding]):
    """One module's plan: table name -> `ParameterSharding` (prints as a dict)."""


@dataclass(frozen=True)
class ShardingPlan:
    """The plan of a model: module path -> that module's `EmbeddingModuleShardingPlan`.

    ``str(plan)`` prints the nested dict as TorchRec's tutorials show; `to_json` and `from_json`
    round-trip it.
    """

    plan: dict[str, EmbeddingModuleShardingPlan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        plan = {}
        for path, module_plan in self.plan.items():
            if not isinstance(path, str):
                raise TypeError(f"module paths are strings, got {path!r}")
            plan[path] = EmbeddingModuleShardingPlan(module_plan)
        object.__setattr__(self, "plan", plan)

    def get_plan_for_module(self, module_path: str) -> EmbeddingModuleShardingPlan | None:
        """The plan of the module at ``module_path``, or None if it is not sharded."""
        return self.plan.get(module_path)

    def __str__(self) -> str:
        return str(self.plan)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _JSON_FORMAT,
            "version": _JSON_VERSION,
            "plan": {
                path: {name: sharding.to_dict() for name, sharding in module_plan.items()}
                for path, module_plan in self.plan.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardingPlan:
        if data.get("format") != _JSON_FORMAT or data.get("version") != _JSON_VERSION:
            raise ValueError(
                f"not a shardkit sharding plan (format {data.get('format')!r}, version "
                f"{data.get('version')!r}); expected format {_JSON_FORMAT!r} version "
                f"{_JSON_VERSION}, as written by ShardingPlan.to_json"
            )
        return cls(
            {
                path: EmbeddingModuleShardingPlan(
                    {name: ParameterSharding.from_dict(ps) for name, ps in tables.items()}
                )
                for path, tables in data["plan"].items()
            }
        )

    def to_json(self, *, indent: int | None = None) -> str:
        """The plan as JSON text (`from_json` reads it back to an equal plan)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> ShardingPlan:
        return cls.from_dict(json.loads(text))
