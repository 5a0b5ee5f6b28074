"""``import torchrec...`` and ``import fbgemm_gpu...`` resolving to shardkit, with no rewrite.

[Note: the import aliases]
`install_aliases` puts a finder first on ``sys.meta_path``: ``torchrec`` and every
``torchrec.X.Y`` resolve to ``shardkit`` and ``shardkit.X.Y``; ``fbgemm_gpu`` and
``fbgemm_gpu.X`` to ``shardkit.fbgemm_gpu`` and ``shardkit.fbgemm_gpu.X``. The alias is the very
module object (``sys.modules["torchrec.distributed"] is shardkit.distributed``), so classes are
the same classes and ``isinstance`` holds across both names; the finder wins over an installed
TorchRec. A TorchRec module shardkit does not have is a ModuleNotFoundError (an ImportError, so a
program's ``try: import ... except ImportError`` fallback runs) that names both modules.

``torch.distributed.fsdp`` is not aliased: torch's own modules import its internals
(``torch.distributed.checkpoint`` does, at import), and handing them shardkit's FSDP would break
them. FSDP code runs on shardkit after the README's rewrite (``torch.distributed.fsdp`` ->
``shardkit.fsdp``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["ALIASES", "install_aliases", "remove_aliases", "shardkit_name"]

# alias package -> the shardkit package it names
ALIASES = {"torchrec": "shardkit", "fbgemm_gpu": "shardkit.fbgemm_gpu"}


def shardkit_name(fullname: str) -> str | None:
    """The shardkit module an aliased name means (``torchrec.optim`` -> ``shardkit.optim``), or
    None for a name that is not aliased."""
    head, dot, rest = fullname.partition(".")
    target = ALIASES.get(head)
    if target is None:
        return None
    return f"{target}{dot}{rest}"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, module: ModuleType) -> None:
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self._module  # the shardkit module itself, already executed

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import system set the alias's; keep shardkit's


class _AliasFinder(importlib.abc.MetaPathFinder):
    """See [Note: the import aliases]."""

    def find_spec(self, fullname: str, path=None, target=None):
        real = shardkit_name(fullname)
        if real is None:
            return None
        try:
            module = importlib.import_module(real)
        except ModuleNotFoundError as error:
            if error.name is None or not (real == error.name or real.startswith(f"{error.name}.")):
                raise  # something the shardkit module itself imports is missing
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: shardkit run maps it to {real}, which shardkit "
                "does not have (shardkit's tests/compat/torchrec_names.txt lists the TorchRec "
                "modules it leaves out, and why)",
                name=fullname,
            ) from None
        is_package = hasattr(module, "__path__")
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(module), is_package=is_package
        )


def install_aliases() -> None:
    """Make ``torchrec``/``fbgemm_gpu`` imports resolve to shardkit in this process (once).

    Names already imported under the alias (a real TorchRec imported earlier) are dropped from
    ``sys.modules`` first, so the next import gets shardkit's.
    """
    if any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        return
    for name in [n for n in sys.modules if shardkit_name(n) is not None]:
        del sys.modules[name]
    sys.meta_path.insert(0, _AliasFinder())


def remove_aliases() -> None:
    """Undo `install_aliases` (the aliased names leave ``sys.modules``)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AliasFinder)]
    for name in [n for n in sys.modules if shardkit_name(n) is not None]:
        if getattr(sys.modules[name], "__name__", name) != name:
            del sys.modules[name]
