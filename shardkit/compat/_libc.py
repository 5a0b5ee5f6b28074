"""glibc through ctypes, loaded once per process for every package that calls it.

shardkit calls a few C library functions that Python does not wrap: ``mallopt`` (the steady heap
of `shardkit.kernels`), ``malloc_trim`` and ``madvise`` (`shardkit.fsdp`'s [Note: returning
memory], the kernels' [Note: huge pages from the first write]) and ``prctl`` (a rank dies with
its parent, `shardkit.launch`). `load_glibc` loads the library once and says what it found;
`glibc_function` hands out one function with its argument types, also once.

Only glibc counts: ``mallopt`` and ``malloc_trim`` are glibc's allocator's own, and torch's Linux
wheels need glibc anyway, so where the C library is another (musl) or there is none (macOS,
Windows) every caller does without, as each did before this loader (the reason is returned, for
their log lines).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from ctypes import CDLL
from typing import Any

__all__ = ["glibc_function", "load_glibc"]

_SONAME = "libc.so.6"  # glibc's name on every Linux architecture torch ships wheels for


@functools.cache
def load_glibc() -> tuple[CDLL | None, str]:
    """glibc, loaded once per process, and what was loaded or why nothing was.

    Returns:
        ``(library, "glibc 2.35")``, or ``(None, reason)`` off Linux, where ``libc.so.6`` does
        not load, or where it is not glibc (no ``gnu_get_libc_version``: musl and others).
        Take functions with `glibc_function`, or ``library["name"]`` (a function object of
        your own: attribute access shares one, argument types included, with every caller).
    """
    return _load(sys.platform, _SONAME)


def _load(platform: str, soname: str) -> tuple[CDLL | None, str]:
    if not platform.startswith("linux"):
        return None, f"no glibc on {platform} (glibc is Linux's C library)"
    try:
        library = CDLL(soname, use_errno=True)
    except OSError as error:
        return None, f"the C library is not glibc: {soname} does not load ({error})"
    try:
        version = library["gnu_get_libc_version"]
    except AttributeError:
        return None, f"the C library is not glibc: {soname} has no gnu_get_libc_version"
    version.restype = ctypes.c_char_p
    return library, f"glibc {version().decode()}"


@functools.cache
def glibc_function(
    name: str, argtypes: tuple[Any, ...], restype: Any = ctypes.c_int
) -> Callable[..., Any] | None:
    """glibc's function ``name`` with these argument and result types (ctypes types), made once
    per process and signature; None where `load_glibc` found no glibc (it says why).

    Example::

        madvise = glibc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
        if madvise is not None:
            madvise(address, length, 14)  # MADV_HUGEPAGE

    Raises:
        AttributeError: glibc has no function ``name``.
    """
    library, _ = load_glibc()
    if library is None:
        return None
    function = library[name]
    function.argtypes = list(argtypes)
    function.restype = restype
    return function
