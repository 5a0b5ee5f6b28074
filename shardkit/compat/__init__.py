"""TorchRec's names that shardkit leaves out, refused with a reason instead of a bare ImportError.

A shardkit module at a TorchRec path (``torchrec.X.Y`` -> ``shardkit.X.Y``) that leaves some of
TorchRec's names out says why, and what to use instead, when one is imported::

    from shardkit.compat import refuse

    __getattr__ = refuse(__name__, {"SemisyncOptimizer": "cross-region ...; use ..."})

    from shardkit.optim import SemisyncOptimizer   # NotInShardkitError: shardkit.optim has no ...

The error is an `ImportError`, so TorchRec code that probes for an optional name with
``try: from ... import X / except ImportError:`` takes its fallback.

``shardkit run`` (no rewrite at all) uses the rest: `install_aliases` makes ``import torchrec``
and ``import fbgemm_gpu`` resolve to shardkit ([Note: the import aliases]), `map_cuda_to_cpu`
runs CUDA code on the CPU where there is no GPU ([Note: cuda on cpu]), `carry_to_children`
carries both into the Python processes the program starts ([Note: child processes]);
`resolve_device` is how shardkit's entry points honour the mapping.

`load_glibc` and `glibc_function` are the one way every package calls the C library (glibc's
allocator, ``madvise``, ``prctl``): loaded once per process, None and the reason where there is
no glibc; `madvise_huge_pages` asks for 2 MiB pages for a buffer not yet written (a no-op without
glibc). `is_dtensor` asks whether a value is a DTensor without importing DTensor (seconds at
start-up: [Note: DTensor on demand]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardkit.compat._aliases import ALIASES, install_aliases, remove_aliases, shardkit_name
from shardkit.compat._children import carry_to_children
from shardkit.compat._devices import cuda_mapped, map_cuda_to_cpu, resolve_device
from shardkit.compat._dtensor import is_dtensor
from shardkit.compat._libc import HUGE_PAGE_BYTES, glibc_function, load_glibc, madvise_huge_pages

__all__ = [
    "ALIASES",
    "HUGE_PAGE_BYTES",
    "NotInShardkitError",
    "carry_to_children",
    "cuda_mapped",
    "glibc_function",
    "install_aliases",
    "is_dtensor",
    "load_glibc",
    "madvise_huge_pages",
    "map_cuda_to_cpu",
    "refuse",
    "remove_aliases",
    "resolve_device",
    "shardkit_name",
]


class NotInShardkitError(ImportError):
    """A TorchRec (or FBGEMM) name that shardkit deliberately does not provide."""


def refuse(module: str, reasons: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module`` that refuses ``reasons``' names.

    Args:
        module: the module's ``__name__``.
        reasons: ``{name: "why it is left out; what to use instead"}``, one line each.

    Returns:
        The function to assign to the module's ``__getattr__``. Other missing names raise the
        usual `AttributeError`.
    """
    reasons = dict(reasons)

    def __getattr__(name: str) -> Any:
        if name in reasons:
            raise NotInShardkitError(f"{module} has no {name}: {reasons[name]}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
