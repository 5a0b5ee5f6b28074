"""glibc through ctypes, one loader for every package (`shardkit.compat.load_glibc`): loaded
once per process, functions made once per signature, None and the reason where there is no
glibc (every caller then does without)."""

from __future__ import annotations

import ctypes
import platform
import re

import pytest

from shardkit.compat import _libc, glibc_function, load_glibc

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


def test_every_function_is_none_without_glibc(monkeypatch):
    monkeypatch.setattr(_libc, "load_glibc", lambda: (None, "no glibc on darwin"))
    glibc_function.cache_clear()
    try:
        assert glibc_function("mallopt", (ctypes.c_int, ctypes.c_int)) is None
    finally:
        glibc_function.cache_clear()
