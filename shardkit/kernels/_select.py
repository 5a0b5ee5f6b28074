"""Which embedding kernel runs: compiled or eager, chosen once per process.

See [Note: compiled kernel]. The choice is made at the first lookup (or by `set_kernel`), from
``SHARDKIT_KERNEL`` (``auto`` when unset), and logged in one INFO line that says why.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from shardkit.kernels import _fake, _pages
from shardkit.kernels._build import BuildError, load_library

__all__ = ["ENV_VAR", "KernelPath", "advise_new_table", "kernel_path", "set_kernel", "use_kernel"]

logger = logging.getLogger(__name__)

ENV_VAR = "SHARDKIT_KERNEL"


@enum.unique
class KernelPath(enum.Enum):
    """The embedding kernel: ``EAGER`` (pure torch ops, the spec), ``COMPILED`` (C++ operators
    built on first use), or ``AUTO`` (compiled when it builds, else eager; a request only)."""

    EAGER = "eager"
    COMPILED = "compiled"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: KernelPath | str, *, source: str) -> KernelPath:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            choices = [p.value for p in cls]
            raise ValueError(
                f"{source}: unknown embedding kernel {value!r}; choose one of {choices}"
            ) from None


@dataclass(frozen=True)
class _Choice:
    path: KernelPath  # EAGER or COMPILED
    reason: str


_lock = threading.Lock()
_choice: _Choice | None = None
_scoped: list[KernelPath] = []  # `use_kernel` overrides, innermost last


def kernel_path() -> KernelPath:
    """The kernel in effect: ``EAGER`` or ``COMPILED``.

    The first call chooses for the process (building the compiled kernel if needed) and logs
    why; later calls return the same answer, unless `set_kernel` or `use_kernel` says otherwise.
    """
    if _scoped:
        return _scoped[-1]
    global _choice
    with _lock:
        if _choice is None:
            requested = _requested()
            source = f"{ENV_VAR}={requested}" if requested else f"{ENV_VAR} unset"
            path = KernelPath.parse(requested or "auto", source=ENV_VAR)
            _choice = _resolve(path, source)
            logger.info("embedding kernel: %s (%s)", _choice.path.value, _choice.reason)
        return _choice.path


def set_kernel(path: KernelPath | str) -> KernelPath:
    """Choose the kernel for the rest of the process (what ``SHARDKIT_KERNEL`` does at start-up).

    Args:
        path: ``"eager"``, ``"compiled"`` or ``"auto"`` (or a `KernelPath`).

    Returns:
        The kernel now in effect (``AUTO`` resolved).

    Raises:
        RuntimeError: ``"compiled"`` was asked for and the compiled kernel cannot be built.
    """
    global _choice
    requested = KernelPath.parse(path, source="set_kernel")
    choice = _resolve(requested, f"set_kernel({requested.value!r})")
    with _lock:
        _choice = choice
    logger.info("embedding kernel: %s (%s)", choice.path.value, choice.reason)
    return choice.path


@contextlib.contextmanager
def use_kernel(path: KernelPath | str) -> Iterator[KernelPath]:
    """Run the block with ``path`` (lookups made in it keep their kernel in backward), e.g. to
    compare both kernels in one process. Raises as `set_kernel` does."""
    requested = KernelPath.parse(path, source="use_kernel")
    resolved = _resolve(requested, f"use_kernel({requested.value!r})").path
    _scoped.append(resolved)
    try:
        yield resolved
    finally:
        _scoped.pop()


def advise_new_table(weight: torch.Tensor) -> bool:
    """Ask for 2 MiB pages for a table just allocated, before its first write, unless the eager
    kernel was chosen ([Note: huge pages from the first write] in ``_pages.py``). Decides nothing
    and builds nothing: where no kernel is chosen yet, the compiled one may run the table.

    Args:
        weight: the new, unwritten ``[rows, dim]`` table (or stack of tables).

    Returns:
        Whether the advice was given (see `shardkit.kernels._pages.advise_table`).

    Raises:
        ValueError: ``SHARDKIT_KERNEL`` or ``SHARDKIT_HUGE_PAGES`` has a value they do not take
            (read for CPU tables only: other devices never run the CPU kernel's pages).
    """
    if weight.device.type != "cpu":
        return False
    if _scoped:
        eager = _scoped[-1] == KernelPath.EAGER
    elif _choice is not None:
        eager = _choice.path == KernelPath.EAGER
    else:
        eager = KernelPath.parse(_requested() or "auto", source=ENV_VAR) == KernelPath.EAGER
    return not eager and _pages.advise_table(weight)


def _requested() -> str:
    return os.environ.get(ENV_VAR, "").strip()


def _resolve(path: KernelPath, source: str) -> _Choice:
    if path == KernelPath.EAGER:
        return _Choice(KernelPath.EAGER, f"asked for by {source}")
    _pages.huge_pages_enabled()  # refuses a bad SHARDKIT_HUGE_PAGES now, not after a build
    try:
        how = load_library()
        _fake.register()  # see [Note: compiled kernel under PT2]
    except BuildError as error:
        if path == KernelPath.COMPILED:
            raise RuntimeError(
                f"the compiled embedding kernel was asked for by {source} but is unavailable: "
                f"{error}. Fix that, or use {ENV_VAR}=auto to fall back to the eager kernel"
            ) from error
        return _Choice(KernelPath.EAGER, f"{source}; the compiled kernel is unavailable: {error}")
    return _Choice(KernelPath.COMPILED, f"{source}; C++ operators {how}")
