"""Sharding plans: plain data that prints as a table and round-trips through JSON.

A plan maps a module's path in the model (``''``: the model itself) to that module's plan,
which maps a table name to its `ParameterSharding`: the sharding type, the kernel, and the
shards, each saying where it starts in the table (``shard_offsets``: row, column), how big it
is (``shard_sizes``: rows, columns) and where it lives (``placement``: rank and device).

``print(plan)`` shows the planner's stats table for the plans the planner makes (per-rank
memory and cost, what each table got, module by module), and the layout alone for plans
made by hand or read from JSON. ``repr(plan)`` is one short line per plan; a table's
``repr(plan.plan[path][name])`` is TorchRec's, as in its tutorials::

    ParameterSharding(sharding_type='table_wise', compute_kernel='fused', ranks=[0],
        sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0],
        shard_sizes=[4096, 64], placement=rank:0/cpu)]))
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from shardkit.types._enums import EmbeddingComputeKernel, ShardingType
from shardkit.types._params import ModuleShardingPlan
from shardkit.types._plan_text import layout_text, short_sharding

__all__ = [
    "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec",
    "ParameterSharding",
    "ShardMetadata",
    "ShardPlacement",
    "ShardingPlan",
    "placement",
    "refuse_kernel_settings",
    "validate_module_plan",
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


@dataclass(slots=True)
class ShardMetadata:
    """One shard: ``shard_sizes`` ``[rows, columns]`` of the table starting at ``shard_offsets``
    ``[row, column]``, stored at ``placement`` (a `ShardPlacement` or its ``"rank:0/cpu"`` text).

    Mutable, as torch's: ``shard.placement = "rank:1/cpu"`` moves a shard (assignments are
    checked and normalised as the constructor's arguments are)."""

    shard_offsets: list[int]
    shard_sizes: list[int]
    placement: ShardPlacement

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("shard_offsets", "shard_sizes"):
            value = _pair(name, value, 0)
        elif name == "placement" and not isinstance(value, ShardPlacement):
            value = ShardPlacement.parse(value)
        object.__setattr__(self, name, value)

    def __hash__(self) -> int:
        return hash((*self.shard_offsets, *self.shard_sizes, self.placement))


def _pair(name: str, values: Any, low: int) -> list[int]:
    # Plans of 1,000 row-wise tables on 1,024 ranks have a million shards: keep this lean.
    if len(values) == 2:
        first, second = values
        if type(first) is int and type(second) is int and first >= low and second >= low:
            return [first, second]
    raise ValueError(f"{name} must be two ints >= {low} (rows, columns), got {list(values)}")


@dataclass
class EnumerableShardingSpec:
    """The list of a table's shards (a list you may edit, as torch's)."""

    shards: list[ShardMetadata] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shards = list(self.shards)
        for shard in self.shards:
            if not isinstance(shard, ShardMetadata):
                raise TypeError(f"shards must be ShardMetadata, got {type(shard).__name__}")


@dataclass
class ParameterSharding:
    """How one table is sharded; mutable, as TorchRec's: edit a plan the planner made.

    Assignments are normalised (``ps.compute_kernel = "fused"`` stores
    ``EmbeddingComputeKernel.FUSED``; an unknown name is refused at once); whether the fields
    agree with each other (a spec for every sharding type but data-parallel, ``ranks`` in shard
    order, no FBGEMM-only setting) is checked by `validate`, which DMP and `shard` call where the
    plan is applied, so a plan may pass through inconsistent states while you edit it.

    Example::

        plan = construct_module_sharding_plan(ebc, {"t1": row_wise()})
        plan["t1"].compute_kernel = EmbeddingComputeKernel.DENSE.value   # "dense"

    Args:
        sharding_type: a `ShardingType` (or its value, e.g. ``"table_wise"``).
        compute_kernel: an `EmbeddingComputeKernel` (or ``"fused"``, ``"dense"``; the
            tutorials' ``"batched_fused"`` and ``"batched_dense"`` also parse).
        ranks: the rank of each shard, in shard order (every rank for data-parallel).
        sharding_spec: the shards; None for data-parallel (a full replica on each rank).
        cache_params, key_value_params, stochastic_rounding, bounds_check_mode, output_dtype,
            enforce_hbm: TorchRec's FBGEMM kernel settings. shardkit keeps every shard whole in
            its rank's memory, in the table's dtype, and checks ids itself: these are None (or
            what that already means: ``enforce_hbm``, ``output_dtype=DataType.FP32``); other
            values are refused by name when the plan is applied.
    """

    sharding_type: ShardingType
    compute_kernel: EmbeddingComputeKernel
    ranks: list[int] | None = None
    sharding_spec: EnumerableShardingSpec | None = None
    cache_params: Any = None
    enforce_hbm: bool | None = None
    stochastic_rounding: bool | None = None
    bounds_check_mode: Any = None
    output_dtype: Any = None
    key_value_params: Any = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "sharding_type":
            value = ShardingType.parse(value)
        elif name == "compute_kernel":
            value = EmbeddingComputeKernel.parse(value)
        elif name == "ranks" and value is not None:
            value = list(value)
        object.__setattr__(self, name, value)

    def validate(self, table: str | None = None) -> None:
        """ValueError if the fields disagree, naming ``table`` (the plan's key) when given."""
        where = "ParameterSharding" if table is None else f"table '{table}'"
        refuse_kernel_settings(
            where,
            cache_params=self.cache_params,
            key_value_params=self.key_value_params,
            stochastic_rounding=self.stochastic_rounding,
            bounds_check_mode=self.bounds_check_mode,
            output_dtype=self.output_dtype,
        )
        spec = self.sharding_spec
        if self.sharding_type == ShardingType.DATA_PARALLEL:
            if spec is not None:
                raise ValueError(
                    f"{where}: data_parallel replicates the table: its sharding_spec is None; "
                    "set sharding_spec = None (or choose another sharding_type)"
                )
            return
        if not isinstance(spec, EnumerableShardingSpec):
            raise ValueError(
                f"{where}: {self.sharding_type.value} sharding needs a sharding_spec of shards "
                f"(an EnumerableShardingSpec), got {spec!r}; plans from the planner or "
                "construct_module_sharding_plan carry one"
            )
        shard_ranks = [shard.placement.rank() for shard in spec.shards]
        if self.ranks is not None and self.ranks != shard_ranks:
            raise ValueError(
                f"{where}: ranks {self.ranks} do not match the ranks of the shards' placements "
                f"{shard_ranks}; list one rank per shard, in shard order"
            )

    def __repr__(self) -> str:
        extra = "".join(
            f", {name}={getattr(self, name)!r}" for name in _KERNEL_SETTINGS if getattr(self, name)
        )
        return (
            f"ParameterSharding(sharding_type={self.sharding_type.value!r}, "
            f"compute_kernel={self.compute_kernel.value!r}, ranks={self.ranks!r}, "
            f"sharding_spec={self.sharding_spec!r}{extra})"
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


def validate_module_plan(
    module_plan: Mapping[str, ParameterSharding], *, module_path: str | None = None
) -> None:
    """`ParameterSharding.validate` of each table of one module's plan, naming the table (and
    the module, when its path is known); TypeError for a value that is no `ParameterSharding`."""
    for name, sharding in module_plan.items():
        label = name if not module_path else f"{name}' of module '{module_path}"
        if not isinstance(sharding, ParameterSharding):
            raise TypeError(
                f"the plan of table '{label}' is a {type(sharding).__name__}, not a "
                "ParameterSharding; build it with ParameterSharding(...) or a generator "
                "(row_wise(), table_wise(rank=...))"
            )
        sharding.validate(label)


_KERNEL_SETTINGS = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode",
                    "output_dtype", "key_value_params")  # fmt: skip
_REFUSED = {
    "cache_params": "UVM caching is an FBGEMM kernel feature; shardkit keeps every shard whole "
    "in its rank's memory: leave cache_params None (and give the ranks the memory, or more ranks)",
    "key_value_params": "SSD and parameter-server tables are FBGEMM kernels, not in shardkit: "
    "leave key_value_params None",
    "stochastic_rounding": "shardkit's kernel updates tables in their own dtype with "
    "round-to-nearest: leave stochastic_rounding None (or False)",
    "bounds_check_mode": "shardkit checks ids itself (the collection's validate_ids): leave "
    "bounds_check_mode None",
    "output_dtype": "shardkit's lookups output the table's dtype: leave output_dtype None (or "
    "DataType.FP32 for float32 tables)",
}


def refuse_kernel_settings(where: str, **settings: Any) -> None:
    """ValueError naming the first FBGEMM kernel setting in ``settings`` that shardkit cannot
    honour (see `ParameterSharding`); None, False and FP32 outputs pass."""
    for name, value in settings.items():
        if value is None or value is False:
            continue
        if name == "output_dtype" and str(getattr(value, "value", value)).upper() == "FP32":
            continue
        raise ValueError(f"{where}: {name}={value!r}: {_REFUSED[name]}")


_REPR_TABLES = 6  # tables named in a repr; the rest are counted


class EmbeddingModuleShardingPlan(ModuleShardingPlan, dict[str, ParameterSharding]):
    """One module's plan: table name -> `ParameterSharding`.

    Prints as a table (see `ShardingPlan`); inside a `ShardingPlan` it also knows its module's
    path (`module_path`) and the plan's estimates (`stats`), which a plan built alone lacks.
    """

    module_path: str | None = None
    stats: Any = None

    def __str__(self) -> str:
        if self.stats is not None and self.module_path is not None:
            return self.stats.text(module=self.module_path)
        return layout_text({self.module_path: self})

    def __repr__(self) -> str:
        names = list(self)
        parts = [f"{name!r}: {short_sharding(self[name])}" for name in names[:_REPR_TABLES]]
        if len(names) > _REPR_TABLES:
            parts.append(f"... {len(names) - _REPR_TABLES} more")
        return "{" + ", ".join(parts) + "}"

    def _serialize(self) -> dict[str, Any]:
        return {name: sharding.to_dict() for name, sharding in self.items()}


@dataclass
class ShardingPlan:
    """The plan of a model: module path -> that module's `EmbeddingModuleShardingPlan`.

    ``str(plan)`` is a table: the planner's estimates (``stats``, its `PlanStats`: per-rank
    memory and cost, per-table layout, module by module) when the planner made the plan, else
    the layout alone. ``repr(plan)`` is short. `to_json` and `from_json` round-trip the plan
    (not its estimates).

    Args:
        plan: module path -> table name -> `ParameterSharding`.
        stats: the planner's estimates of this plan (anything with ``text(module=None)``);
            None for plans made by hand. Not part of the plan's equality.
    """

    plan: dict[str, EmbeddingModuleShardingPlan] = field(default_factory=dict)
    stats: Any = field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        plan = {}
        for path, module_plan in self.plan.items():
            if not isinstance(path, str):
                raise TypeError(f"module paths are strings, got {path!r}")
            plan[path] = EmbeddingModuleShardingPlan(module_plan)
            plan[path].module_path = path
            plan[path].stats = self.stats
        self.plan = plan

    def get_plan_for_module(self, module_path: str) -> EmbeddingModuleShardingPlan | None:
        """The plan of the module at ``module_path``, or None if it is not sharded."""
        return self.plan.get(module_path)

    def validate(self) -> None:
        """ValueError naming the first table whose `ParameterSharding` is inconsistent (see
        `ParameterSharding.validate`); DMP calls it on the plan it applies."""
        for path, module_plan in self.plan.items():
            validate_module_plan(module_plan, module_path=path)

    def __str__(self) -> str:
        if self.stats is not None:
            return self.stats.text()
        return layout_text(self.plan)

    def __repr__(self) -> str:
        modules = ", ".join(f"{path!r}: {module_plan!r}" for path, module_plan in self.plan.items())
        return f"ShardingPlan({{{modules}}})"

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
