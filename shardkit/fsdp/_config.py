"""What a unit runs with, whichever face made it: FSDP1's `MixedPrecision` and FSDP2's
`MixedPrecisionPolicy` both become one `Precision`; prefetching one `Prefetch`; what a tree's
state dicts hold one `StateDictForm` (FSDP1's `StateDictType` and configs are read into it at
FSDP1's ``state_dict_type``; ``fully_shard`` keeps the default, FSDP2's DTensor shards)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from shardkit.fsdp._policies import MixedPrecisionPolicy
from shardkit.fsdp.api import BackwardPrefetch, MixedPrecision

__all__ = ["Precision", "Prefetch", "SaveForm", "StateDictForm"]


@dataclass(frozen=True)
class Precision:
    """Dtypes of one unit (None: the parameters' own). ``reduce_dtype`` is already resolved
    (``param_dtype`` when the user gave none). Inputs are cast to ``param_dtype`` for every unit
    with ``cast_forward_inputs``, for the outermost one with ``cast_root_forward_inputs``;
    floating outputs to ``output_dtype``."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    buffer_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = False

    @classmethod
    def of(cls, policy: MixedPrecision | MixedPrecisionPolicy) -> Precision:
        reduce_dtype = policy.reduce_dtype or policy.param_dtype
        if isinstance(policy, MixedPrecisionPolicy):
            return cls(
                param_dtype=policy.param_dtype,
                reduce_dtype=reduce_dtype,
                output_dtype=policy.output_dtype,
                cast_forward_inputs=policy.cast_forward_inputs and policy.param_dtype is not None,
            )
        return cls(
            param_dtype=policy.param_dtype,
            reduce_dtype=reduce_dtype,
            buffer_dtype=policy.buffer_dtype,
            cast_forward_inputs=policy.cast_forward_inputs,
            cast_root_forward_inputs=policy.cast_root_forward_inputs,
        )


@dataclass(frozen=True)
class Prefetch:
    """``forward``: a unit starts gathering the unit that ran after it in the previous iteration
    when its forward starts. ``backward``: see `BackwardPrefetch`; None gathers each unit only
    when its backward starts. Explicit lists (``set_modules_to_*_prefetch``) replace both."""

    forward: bool = True
    backward: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE

    def __post_init__(self) -> None:
        if self.backward is not None and not isinstance(self.backward, BackwardPrefetch):
            raise TypeError(
                f"backward_prefetch must be a BackwardPrefetch or None, got {self.backward!r}; "
                "use BackwardPrefetch.BACKWARD_PRE"
            )


@enum.unique
class SaveForm(enum.Enum):
    """How a parameter (and its optimizer state) appears in a state dict."""

    FULL = "full"  # a plain tensor of the unsharded parameter (a gather per parameter)
    SHARDED = "sharded"  # a DTensor with the global shape holding this rank's rows (FSDP2)
    LOCAL = "local"  # this rank's rows as a plain tensor (loads into the same sharding only)


@dataclass(frozen=True)
class StateDictForm:
    """What ``state_dict()`` and ``optim_state_dict`` give for one tree of units.

    The default is ``fully_shard``'s (FSDP2: DTensor shards; optimizer state moved to the CPU, as
    torch's default optimizer config does); FSDP1's wrapper starts from ``FULL``.
    ``rank0_only`` (FULL only): the other ranks get an empty dict.
    """

    form: SaveForm = SaveForm.SHARDED
    offload_to_cpu: bool = False
    rank0_only: bool = False
    optim_offload_to_cpu: bool = True
    optim_rank0_only: bool = False
