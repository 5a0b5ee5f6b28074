"""Eviction policies of `MCHManagedCollisionModule`: which ids keep a row of the table.

A policy names the metadata it keeps per slot (``counts``: how often the slot's id was seen;
``last_access_iter``: the last iteration it was seen) and turns that metadata into eviction
scores: at each eviction, the slots and the ids seen since the last eviction compete for the
rows, and the highest scores win. TorchRec's three policies, with its names and arguments:

- `LFU_EvictionPolicy`: score = count (least frequently used goes first);
- `LRU_EvictionPolicy`: score = ``-(iter - last_access_iter + 1) ** decay_exponent`` (least
  recently used goes first);
- `DistanceLFU_EvictionPolicy`: score = ``count / (iter - last_access_iter + 1) ** decay_exponent``
  (frequent and recent ids stay).

The scores are computed in TorchRec's dtypes (int64 counts; float32 once a power is taken), so
ties break as they do in TorchRec. ``ttl`` (LRU and DistanceLFU only, a shardkit extension) frees
every slot whose id has not been seen for more than ``ttl`` iterations at an eviction, even when
no new id wants its row.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = [
    "DistanceLFU_EvictionPolicy",
    "LFU_EvictionPolicy",
    "LRU_EvictionPolicy",
    "MCHEvictionPolicy",
    "MCHEvictionPolicyMetadataInfo",
    "average_threshold_filter",
    "dynamic_threshold_filter",
    "probabilistic_threshold_filter",
]

COUNTS = "counts"
LAST_ACCESS = "last_access_iter"

ThresholdFilter = Callable[[torch.Tensor], tuple[torch.Tensor, "float | torch.Tensor"]]


class MCHEvictionPolicyMetadataInfo(NamedTuple):
    """One kind of per-slot metadata a policy keeps (TorchRec's tuple)."""

    metadata_name: str
    is_mch_metadata: bool
    is_history_metadata: bool


class MCHEvictionPolicy(abc.ABC):
    """Base of the eviction policies.

    A policy keeps per-slot metadata named in `metadata_info` (``"counts"`` and/or
    ``"last_access_iter"``; the module keeps each as buffer ``_mch_<name>``) and scores slots.

    Args:
        metadata_info: the metadata this policy keeps.
        threshold_filtering_func: optional filter of the ids seen since the last eviction: gets
            their counts ``[U]``, returns (a boolean mask ``[U]`` of the ids that may take a row,
            the threshold). TorchRec's experimental hook; see `dynamic_threshold_filter`.
        ttl: free the slots of ids unseen for more than ``ttl`` iterations (needs
            ``last_access_iter``).
    """

    def __init__(
        self,
        metadata_info: list[MCHEvictionPolicyMetadataInfo],
        threshold_filtering_func: ThresholdFilter | None = None,
        *,
        ttl: int | None = None,
    ) -> None:
        names = {info.metadata_name for info in metadata_info}
        unknown = sorted(names - {COUNTS, LAST_ACCESS})
        if unknown:
            raise ValueError(
                f"eviction policy metadata {unknown} is not kept by shardkit; a policy may keep "
                f"'{COUNTS}' and '{LAST_ACCESS}'"
            )
        if ttl is not None and (ttl < 1 or LAST_ACCESS not in names):
            raise ValueError(
                f"ttl={ttl} needs an integer >= 1 and a policy that keeps '{LAST_ACCESS}' "
                "(LRU_EvictionPolicy, DistanceLFU_EvictionPolicy)"
            )
        self._metadata_info = list(metadata_info)
        self._threshold_filtering_func = threshold_filtering_func
        self._ttl = ttl

    @property
    def metadata_info(self) -> list[MCHEvictionPolicyMetadataInfo]:
        return self._metadata_info

    @property
    def metadata_names(self) -> list[str]:
        return [info.metadata_name for info in self._metadata_info]

    @property
    def ttl(self) -> int | None:
        return self._ttl

    @property
    def has_threshold_filter(self) -> bool:
        return self._threshold_filtering_func is not None

    @abc.abstractmethod
    def eviction_scores(self, current_iter: int, metadata: dict[str, torch.Tensor]) -> torch.Tensor:
        """Scores ``[S]`` of ``S`` candidates (slots and new ids) from their metadata
        (``{name: [S]}``): the highest scores keep (or get) a row."""

    def expired(self, current_iter: int, metadata: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Mask ``[S]`` of candidates past their ``ttl``, or None without a ttl."""
        if self._ttl is None:
            return None
        return (current_iter - metadata[LAST_ACCESS]) > self._ttl

    def filter(self, counts: torch.Tensor) -> torch.Tensor | None:
        """Mask ``[U]`` of the window's ids the threshold filter lets in, or None."""
        if self._threshold_filtering_func is None:
            return None
        mask, _ = self._threshold_filtering_func(counts)
        if mask.dtype != torch.bool:  # an index array, as TorchRec also allows
            mask = torch.zeros_like(counts, dtype=torch.bool).index_fill_(0, mask, True)
        return mask


def _distance(current_iter: int, last_access: torch.Tensor, decay_exponent: float) -> torch.Tensor:
    # int64 ** float: float32, as in TorchRec
    return torch.pow(current_iter - last_access + 1, decay_exponent)


class LFU_EvictionPolicy(MCHEvictionPolicy):  # TorchRec's name
    """Keeps the most frequently seen ids: a slot's count adds up every time its id is seen."""

    def __init__(self, threshold_filtering_func: ThresholdFilter | None = None) -> None:
        super().__init__(
            [MCHEvictionPolicyMetadataInfo(COUNTS, True, False)], threshold_filtering_func
        )

    def eviction_scores(self, current_iter: int, metadata: dict[str, torch.Tensor]) -> torch.Tensor:
        return metadata[COUNTS]


class LRU_EvictionPolicy(MCHEvictionPolicy):  # TorchRec's name
    """Keeps the most recently seen ids.

    Args:
        decay_exponent: the power of the distance (iterations since last seen) in the score.
        threshold_filtering_func: see `MCHEvictionPolicy`.
        ttl: see `MCHEvictionPolicy` (shardkit extension).
    """

    def __init__(
        self,
        decay_exponent: float = 1.0,
        threshold_filtering_func: ThresholdFilter | None = None,
        *,
        ttl: int | None = None,
    ) -> None:
        super().__init__(
            [MCHEvictionPolicyMetadataInfo(LAST_ACCESS, True, True)],
            threshold_filtering_func,
            ttl=ttl,
        )
        self._decay_exponent = decay_exponent

    def eviction_scores(self, current_iter: int, metadata: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.neg(_distance(current_iter, metadata[LAST_ACCESS], self._decay_exponent))


class DistanceLFU_EvictionPolicy(MCHEvictionPolicy):  # TorchRec's name
    """Keeps ids that are frequent and recent: count divided by a power of the distance.

    Args: as `LRU_EvictionPolicy`.
    """

    def __init__(
        self,
        decay_exponent: float = 1.0,
        threshold_filtering_func: ThresholdFilter | None = None,
        *,
        ttl: int | None = None,
    ) -> None:
        super().__init__(
            [
                MCHEvictionPolicyMetadataInfo(COUNTS, True, False),
                MCHEvictionPolicyMetadataInfo(LAST_ACCESS, True, True),
            ],
            threshold_filtering_func,
            ttl=ttl,
        )
        self._decay_exponent = decay_exponent

    def eviction_scores(self, current_iter: int, metadata: dict[str, torch.Tensor]) -> torch.Tensor:
        distance = _distance(current_iter, metadata[LAST_ACCESS], self._decay_exponent)
        return torch.div(metadata[COUNTS], distance)


@torch.no_grad()
def dynamic_threshold_filter(
    id_counts: torch.Tensor, threshold_skew_multiplier: float = 10.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lets in ids seen more than ``threshold_skew_multiplier`` times the mean count."""
    threshold = (1 / id_counts.numel() * threshold_skew_multiplier) * id_counts.sum()
    return id_counts > threshold, threshold


@torch.no_grad()
def average_threshold_filter(id_counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Lets in ids seen more often than the mean count."""
    threshold = id_counts.float().mean()
    return id_counts > threshold, threshold


@torch.no_grad()
def probabilistic_threshold_filter(
    id_counts: torch.Tensor, per_id_probability: float = 0.01
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lets in an id seen ``c`` times with probability ``1 - (1 - per_id_probability) ** c``."""
    scores = 1 - torch.pow(
        torch.full_like(id_counts, 1 - per_id_probability, dtype=torch.float), id_counts
    )
    threshold = torch.rand(id_counts.size(), device=id_counts.device)
    return scores > threshold, threshold
