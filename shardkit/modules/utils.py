"""Helpers TorchRec users import from ``torchrec.modules.utils``: activations given as a module,
a function or a factory, output sizes, stacks of copies of a module, id de-duplication.

The embedding collections' own internals that TorchRec keeps in that module (building jagged
outputs, sequence VBE contexts, FBGEMM's jagged index select, hash-ZCH buckets) are refused by
name: shardkit's collections do that work themselves.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from shardkit.compat import refuse

__all__ = [
    "check_module_output_dimension",
    "construct_modulelist_from_single_module",
    "convert_list_of_modules_to_modulelist",
    "deterministic_dedup",
    "extract_module_or_tensor_callable",
    "get_module_output_dimension",
    "init_mlp_weights_xavier_uniform",
    "reset_module_states_post_sharding",
]

_INTERNAL = (
    "internal to TorchRec's embedding collections; shardkit's EmbeddingCollection and "
    "EmbeddingBagCollection build their outputs themselves: call them"
)
__getattr__ = refuse(
    __name__,
    {
        "construct_jagged_tensors": _INTERNAL,
        "construct_jagged_tensors_inference": _INTERNAL,
        "SequenceVBEContext": _INTERNAL,
        "jagged_index_select_with_empty": "an FBGEMM jagged operator; index the JaggedTensor's "
        "values with torch instead",
        "make_hash_zch_buckets_non_persistent": "hash-based managed collision (ZCH) is not in "
        "shardkit; use shardkit's managed-collision modules",
    },
)


def extract_module_or_tensor_callable(
    module_or_callable: nn.Module
    | Callable[[], nn.Module]
    | Callable[[torch.Tensor], torch.Tensor],
) -> nn.Module | Callable[[torch.Tensor], torch.Tensor]:
    """A module (returned as is), a module class or factory of no arguments (called: a new
    module each time), or a function of one tensor (returned as is)."""
    if isinstance(module_or_callable, nn.Module):
        return module_or_callable
    try:
        made = module_or_callable()  # type: ignore[call-arg]
    except TypeError as error:
        if "required positional argument" in str(error) or "missing" in str(error):
            return module_or_callable  # type: ignore[return-value]  # a function of a tensor
        raise
    if not isinstance(made, nn.Module):
        raise ValueError(
            f"a callable of no arguments given as an activation must return a torch.nn.Module, "
            f"got {type(made).__name__}"
        )
    return made


def get_module_output_dimension(
    module: nn.Module | Callable[[torch.Tensor], torch.Tensor], in_features: int
) -> int:
    """The last output dimension of ``module`` on a ``[1, in_features]`` input of zeros."""
    return module(torch.zeros(1, in_features)).size(-1)


def check_module_output_dimension(
    module: Iterable[nn.Module] | nn.Module, in_features: int, out_features: int
) -> bool:
    """Whether ``module`` (or every module of a list, recursively) maps ``in_features`` to
    ``out_features``."""
    if isinstance(module, list | nn.ModuleList):
        return all(check_module_output_dimension(m, in_features, out_features) for m in module)
    return get_module_output_dimension(module, in_features) == out_features  # type: ignore[arg-type]


def init_mlp_weights_xavier_uniform(m: nn.Module) -> None:
    """For ``module.apply``: Xavier-uniform weights and zero biases for each ``nn.Linear``."""
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight)
        if m.bias is not None:
            m.bias.data.fill_(0.0)


def construct_modulelist_from_single_module(module: nn.Module, sizes: Sequence[int]) -> nn.Module:
    """Nested ``ModuleList``s of shape ``sizes`` holding copies of ``module``, each copy's
    linear layers initialised afresh (`init_mlp_weights_xavier_uniform`)."""
    if len(sizes) == 1:
        return nn.ModuleList(
            copy.deepcopy(module).apply(init_mlp_weights_xavier_uniform) for _ in range(sizes[0])
        )
    return nn.ModuleList(
        construct_modulelist_from_single_module(module, sizes[1:]) for _ in range(sizes[0])
    )


def convert_list_of_modules_to_modulelist(modules: Sequence, sizes: Sequence[int]) -> nn.Module:
    """Nested lists of modules of shape ``sizes`` as nested ``ModuleList``s."""
    if len(modules) != sizes[0]:
        raise ValueError(
            f"convert_list_of_modules_to_modulelist: {len(modules)} module(s) at a level where "
            f"sizes {list(sizes)} asks for {sizes[0]}"
        )
    if len(sizes) == 1:
        return nn.ModuleList(modules)
    return nn.ModuleList(convert_list_of_modules_to_modulelist(m, sizes[1:]) for m in modules)


def deterministic_dedup(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sorted unique ids ``[U]`` and, for each, the position of its last occurrence in
    ``ids`` ``[U]`` (so that of several updates to one id the last one wins)."""
    sorted_ids, order = ids.flatten().sort(stable=True)
    unique, inverse = sorted_ids.unique_consecutive(return_inverse=True)
    last = torch.zeros_like(unique, dtype=torch.int64).scatter_reduce(
        0, inverse, order, reduce="amax", include_self=False
    )
    return unique, last


def reset_module_states_post_sharding(module: nn.Module) -> None:
    """TorchRec clears modules' cached tensors here after sharding; shardkit's modules keep no
    state that sharding makes stale, so there is nothing to do."""
