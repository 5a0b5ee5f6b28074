"""What `EmbeddingShardingPlanner` does with TorchRec's planner components.

[Note: TorchRec's planner components]
TorchRec's planner is assembled from components (enumerator, storage reservation, proposers,
partitioner, performance model, stats); shardkit's is one pipeline (``_core``) with its own
search. It takes TorchRec's components that it has equivalents of:

- ``enumerator``: an `EmbeddingEnumerator` gives its constraints and batch size where the
  planner was given none (its estimators are shardkit's);
- ``storage_reservation``: any of shardkit's reservations;
- ``proposer``, ``partitioner``: TorchRec's classes are accepted, and shardkit's search (which
  tries more proposals than they would, and places them itself) is what runs; one INFO line says
  so;
- ``stats``: `EmbeddingStats` logs the stats table (the default), `NoopEmbeddingStats` not;
- ``performance_model``, ``callbacks``, ``plan_loader``: only their defaults.

A component of another class (your own `Proposer`...) is refused by name: shardkit would not
call it, and ignoring it silently would plan differently from what the code says.

TorchRec's component classes live at the compatibility edge (``shardkit.distributed.planner``),
which the planner does not import: each declares the part it plays in a class attribute,
``_shardkit_component`` (``"enumerator"``, ``"proposer"``, ``"partitioner"``, ``"stats"`` or
``"no stats"``), and that, inherited like ``isinstance``, is what is checked here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.planner._inputs import HeuristicalStorageReservation
from shardkit.planner._reservations import (
    FixedAbsoluteStorageReservation,
    FixedPercentageStorageReservation,
    InferenceStorageReservation,
)

__all__ = ["Components", "resolve_components"]

logger = logging.getLogger(__name__)

_RESERVATIONS = (HeuristicalStorageReservation, FixedPercentageStorageReservation,
                 FixedAbsoluteStorageReservation, InferenceStorageReservation)  # fmt: skip
# The edge's classes that play each part (see the Note), for the refusal's message.
_COMPONENTS = {
    "enumerator": ("EmbeddingEnumerator",),
    "proposer": ("GreedyProposer", "UniformProposer", "GridSearchProposer",
                 "DynamicProgrammingProposer"),
    "partitioner": ("GreedyPerfPartitioner",),
    "stats": ("EmbeddingStats", "NoopEmbeddingStats"),
}  # fmt: skip


@dataclass(frozen=True)
class Components:
    """What the planner takes from TorchRec's components."""

    constraints: Any
    batch_size: int | None
    storage_reservation: Any
    log_stats: bool


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, Sequence) else [value]


def _role(value: Any) -> str | None:
    role = getattr(type(value), "_shardkit_component", None)
    return "stats" if role == "no stats" else role


def _refuse(name: str, value: Any, allowed: tuple[type, ...] = ()) -> None:
    if isinstance(value, allowed) or (name in _COMPONENTS and _role(value) == name):
        return
    kinds = [kind.__name__ for kind in allowed] or list(_COMPONENTS.get(name, ()))
    names = ", ".join(kinds) or "None"
    raise TypeError(
        f"EmbeddingShardingPlanner({name}={type(value).__name__}(...)): shardkit's planner "
        f"runs its own search and does not call custom components; pass {names} or leave "
        f"{name} out (see docs/planner.md)"
    )


def resolve_components(
    *, enumerator: Any, storage_reservation: Any, proposer: Any, partitioner: Any,
    performance_model: Any, stats: Any, callbacks: Any, plan_loader: Any,
    constraints: Any, batch_size: int | None,
) -> Components:  # fmt: skip
    """Check the components (see [Note: TorchRec's planner components]) and what they give."""
    for name, value in (("performance_model", performance_model), ("plan_loader", plan_loader)):
        if value is not None:
            _refuse(name, value)
    if callbacks:
        raise ValueError(
            f"EmbeddingShardingPlanner(callbacks={list(callbacks)}): shardkit's planner does not "
            "rewrite its sharding options through callbacks; use ParameterConstraints instead"
        )
    if enumerator is not None:
        _refuse("enumerator", enumerator)
        constraints = constraints if constraints is not None else enumerator.constraints
        batch_size = batch_size if batch_size is not None else enumerator.batch_size
    if storage_reservation is not None:
        _refuse("storage_reservation", storage_reservation, _RESERVATIONS)
    searchers = [*_listed(proposer), *_listed(partitioner)]
    for each in _listed(proposer):
        _refuse("proposer", each)
    if partitioner is not None:
        _refuse("partitioner", partitioner)
    if searchers:
        logger.info("planner: %s accepted; shardkit's own search proposes and places",
                    [type(s).__name__ for s in searchers])  # fmt: skip
    log = True
    for each in _listed(stats):
        _refuse("stats", each)
    if stats is not None:
        log = any(getattr(type(s), "_shardkit_component", None) == "stats" for s in _listed(stats))
    return Components(constraints, batch_size, storage_reservation, log)
