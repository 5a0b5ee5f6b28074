"""glibc through ctypes, loaded once per process for every package that calls it.

shardkit calls a few C library functions that Python does not wrap: ``mallopt`` (the steady heap
of `shardkit.kernels`), ``malloc_trim`` and ``madvise`` (`shardkit.fsdp`'s [Note: returning
memory], the kernels' [Note: huge pages from the first write]) and ``prctl`` (a rank dies with
its parent, `shardkit.launch`). `load_glibc` loads the library once and says what it found;
`glibc_function` hands out one function with its argument types, also once. `madvise_huge_pages`
is the one ``madvise(MADV_HUGEPAGE)`` both of those Notes give a buffer before its first write.

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

__all__ = ["HUGE_PAGE_BYTES", "glibc_function", "load_glibc", "madvise_huge_pages"]

_SONAME = "libc.so.6"  # glibc's name on every Linux architecture torch ships wheels for
HUGE_PAGE_BYTES = 2 << 20  # a transparent huge page on x86-64 (and aarch64 with 4 KiB pages)
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux (Python's mmap has the name on Linux only)


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

        malloc_trim = glibc_function("malloc_trim", (ctypes.c_size_t,))
        if malloc_trim is not None:
            malloc_trim(0)

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


def madvise_huge_pages(address: int, nbytes: int) -> bool:
    """Ask Linux to back the ``nbytes`` of memory at ``address`` with 2 MiB pages from their first
    write (``madvise(MADV_HUGEPAGE)`` on the whole 2 MiB pages inside: the ragged ends share
    their pages with other memory, which keeps the 4 KiB pages it has).

    Args:
        address: where the memory starts, e.g. a CPU tensor's ``untyped_storage().data_ptr()``.
        nbytes: its length in bytes.

    Returns:
        Whether the advice was given: not where no whole 2 MiB page lies inside, where there is
        no glibc (`load_glibc`; a no-op there), or where the OS refuses (a kernel without
        transparent huge pages). A hint: the caller goes on either way.
    """
    begin = (address + HUGE_PAGE_BYTES - 1) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    end = (address + nbytes) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if end <= begin:
        return False
    madvise = _madvise()
    return madvise is not None and madvise(begin, end - begin, _MADV_HUGEPAGE) == 0


def _madvise() -> Callable[..., Any] | None:
    """glibc's ``madvise`` (None without glibc; `glibc_function` caches it); tests hook it
    here."""
    return glibc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
