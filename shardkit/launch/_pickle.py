"""Pickle functions by value when the rank processes could not import them by name.

Spawned ranks re-import the function they run. That fails for a function defined in a notebook or
in ``python -c`` (its ``__main__`` has no file to re-import), for a lambda and for a nested function.
For those, and only those, this pickler ships the code object, the globals it names, its defaults
and its closure, and rebuilds the function in the child. Both sides run the same interpreter, so
``marshal`` is safe for the code object. Classes are still pickled by reference.
"""

from __future__ import annotations

import builtins
import importlib
import io
import marshal
import os
import pickle
import sys
import types
from typing import Any

__all__ = ["dumps", "main_is_reimportable"]


def dumps(obj: Any) -> bytes:
    """`pickle.dumps` that falls back to by-value pickling for non-importable functions."""
    buffer = io.BytesIO()
    _ByValuePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


class _ByValuePickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType) and not _importable_by_name(obj):
            return _reduce_function(obj)
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        return NotImplemented


def main_is_reimportable() -> bool:
    """Whether spawned children can re-run ``__main__`` from its file (not so for stdin)."""
    main = sys.modules["__main__"]
    if getattr(main.__spec__, "name", None) is not None:
        return True  # `python -m package.module`
    path = getattr(main, "__file__", None)
    return path is not None and os.path.isfile(path)


def _importable_by_name(fn: types.FunctionType) -> bool:
    module = sys.modules.get(fn.__module__)
    if module is None:
        return False
    if fn.__module__ == "__main__" and not main_is_reimportable():
        return False  # notebook, `python -c` or stdin: the child cannot re-run __main__
    found: Any = module
    for part in fn.__qualname__.split("."):
        found = getattr(found, part, None)  # '<locals>' and '<lambda>' end the walk with None
    return found is fn


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


class _EmptyCell:
    """Marks a closure cell that had no value when pickled."""


def _reduce_function(fn: types.FunctionType) -> tuple:
    fn_globals = {
        name: fn.__globals__[name]
        for name in sorted(_global_names(fn.__code__))
        if name in fn.__globals__ and name != "__builtins__"
    }
    cells = fn.__closure__ or ()
    closure_values = []
    for cell in cells:
        try:
            closure_values.append(cell.cell_contents)
        except ValueError:
            closure_values.append(_EmptyCell)
    skeleton = (marshal.dumps(fn.__code__), fn.__name__, len(cells))
    # The state is applied after the skeleton is memoised, so recursive functions work.
    state = (fn_globals, fn.__defaults__, fn.__kwdefaults__, closure_values, fn.__qualname__)
    return _make_skeleton, skeleton, state, None, None, _fill_function


def _make_skeleton(code_bytes: bytes, name: str, num_cells: int) -> types.FunctionType:
    code = marshal.loads(code_bytes)
    fn_globals: dict[str, Any] = {"__builtins__": builtins, "__name__": "__main__"}
    closure = tuple(types.CellType() for _ in range(num_cells)) or None
    return types.FunctionType(code, fn_globals, name, None, closure)


def _fill_function(fn: types.FunctionType, state: tuple) -> None:
    fn_globals, defaults, kwdefaults, closure_values, qualname = state
    fn.__globals__.update(fn_globals)
    fn.__defaults__ = defaults
    fn.__kwdefaults__ = kwdefaults
    fn.__qualname__ = qualname
    for cell, value in zip(fn.__closure__ or (), closure_values):
        if value is not _EmptyCell:
            cell.cell_contents = value
