"""glibc through ctypes, one loader for every package (`shardkit.compat.load_glibc`): loaded
once per process, functions made once per signature, None and the reason where there is no
glibc (every caller then does without); `madvise_huge_pages` advises the whole 2 MiB pages of a
buffer, the one ``madvise`` of `shardkit.fsdp` and `shardkit.kernels`."""

from __future__ import annotations

import ctypes
import mmap
import platform
import re

import pytest
import torch

from shardkit.compat import HUGE_PAGE_BYTES, _libc, glibc_function, load_glibc, madvise_huge_pages
from shardkit.fsdp import _memory
from shardkit.kernels import _pages

needs_glibc = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the C library is not glibc"
)


@needs_glibc
def test_glibc_is_loaded_once_and_names_its_version():
    library, said = load_glibc()
    assert library is not None
    assert said == f"glibc {platform.libc_ver()[1]}"
    assert load_glibc()[0] is library  # once per process
    madvise = glibc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    assert madvise is glibc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    assert madvise.argtypes == [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    # each signature its own function object: one caller's types never change another's
    assert (
        glibc_function("madvise", (ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int)) is not madvise
    )
    assert glibc_function("getpid", ())() > 0  # callable, the C library's own answer


class _NotGlibc:
    """A C library with no ``gnu_get_libc_version`` (musl's, say)."""

    def __init__(self, name: str, use_errno: bool = False) -> None:
        self.name = name

    def __getitem__(self, name: str):
        raise AttributeError(name)


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("darwin", r"^no glibc on darwin \(glibc is Linux's C library\)$"),
        ("missing", r"^the C library is not glibc: libnot-here\.so\.6 does not load \(.+\)$"),
        ("musl", r"^the C library is not glibc: libc\.so\.6 has no gnu_get_libc_version$"),
    ],
)
def test_no_glibc_is_none_with_the_reason(where, said, monkeypatch):
    if where == "musl":
        monkeypatch.setattr(_libc, "CDLL", _NotGlibc)
    soname = "libnot-here.so.6" if where == "missing" else "libc.so.6"
    library, reason = _libc._load("darwin" if where == "darwin" else "linux", soname)
    assert library is None
    assert re.match(said, reason), reason


@pytest.fixture
def without_glibc(monkeypatch):
    """This process as on macOS or musl: `load_glibc` finds none, and every function looked up
    before is forgotten (and looked up again after the test)."""
    caches = (glibc_function,)
    monkeypatch.setattr(_libc, "load_glibc", lambda: (None, "no glibc on darwin"))
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


def test_every_function_is_none_without_glibc(without_glibc):
    assert glibc_function("mallopt", (ctypes.c_int, ctypes.c_int)) is None


def test_every_caller_does_without_glibc(without_glibc):
    """The huge page advice and the trim are no-ops: nothing raised, nothing advised."""
    assert not madvise_huge_pages(2 * HUGE_PAGE_BYTES, 2 * HUGE_PAGE_BYTES)
    table = torch.empty(2 * _pages.MIN_BYTES, dtype=torch.uint8)
    assert not _pages.advise_table(table)
    _memory.advise_huge_pages(table)
    _memory.release_free_memory()


MIB = 1 << 20


@pytest.mark.parametrize(
    ("address", "nbytes", "advised"),
    [
        (4 * MIB, 4 * MIB, (4 * MIB, 4 * MIB)),  # aligned: all of it
        (2 * MIB + 4096, 6 * MIB, (4 * MIB, 4 * MIB)),  # the whole 2 MiB pages inside only
        (2 * MIB + 1, 3 * MIB, None),  # 3 MiB, but no whole 2 MiB page inside
        (0, 0, None),
    ],
)
def test_huge_page_advice_covers_the_whole_pages_inside(address, nbytes, advised, monkeypatch):
    calls = []
    monkeypatch.setattr(_libc, "_madvise", lambda: lambda *a: calls.append(a) or 0)
    assert madvise_huge_pages(address, nbytes) is (advised is not None)
    assert calls == ([] if advised is None else [(*advised, 14)])  # MADV_HUGEPAGE
    monkeypatch.setattr(_libc, "_madvise", lambda: lambda *a: -1)  # the OS refuses
    assert madvise_huge_pages(4 * MIB, 4 * MIB) is False


@needs_glibc
@pytest.mark.skipif(
    _pages.thp_mode() not in ("always", "madvise"), reason="no transparent huge pages here"
)
def test_glibc_takes_the_advice():
    """The real call, with its argument types: Linux accepts it for fresh memory."""
    with mmap.mmap(-1, 8 * MIB) as mapped:
        view = ctypes.c_char.from_buffer(mapped)
        try:
            assert madvise_huge_pages(ctypes.addressof(view), 8 * MIB)
        finally:
            del view  # (the mapping closes only once nothing points into it)
