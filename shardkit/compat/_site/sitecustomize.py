"""Python processes a ``shardkit run`` program starts itself run on shardkit too.

See [Note: child processes] in ``shardkit.compat._children``: ``shardkit run`` puts this
directory first on ``PYTHONPATH`` and says in ``SHARDKIT_RUN`` what to carry, so every Python
the program starts (``subprocess.run([sys.executable, ...])``, multiprocessing's spawned
children, a ``python`` on ``PATH``) imports this module at start-up. It costs nothing until the
process first imports ``torchrec`` or ``fbgemm_gpu``: only then is shardkit imported and the
aliases (and, with ``cuda-on-cpu``, the CUDA mapping) installed. Then the next
``sitecustomize`` on ``sys.path`` (a virtual environment's own, say) runs, as it would have.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ALIASED = ("torchrec", "fbgemm_gpu")


class _FirstUse(importlib.abc.MetaPathFinder):
    """Installs shardkit's aliases on the first ``torchrec``/``fbgemm_gpu`` import, then steps
    aside."""

    def __init__(self, modes: list[str]) -> None:
        self._modes = modes

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in _ALIASED:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        from shardkit.compat import install_aliases, map_cuda_to_cpu

        install_aliases()
        if "cuda-on-cpu" in self._modes:
            import torch

            if not torch.cuda.is_available():
                map_cuda_to_cpu()
        return importlib.util.find_spec(fullname)  # now the aliases' answer


def _chain() -> None:
    """Run the ``sitecustomize`` this one hides (the next one on ``sys.path``), if any."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_modes = [m for m in os.environ.get("SHARDKIT_RUN", "").split(",") if m]
if "aliases" in _modes:
    sys.meta_path.insert(0, _FirstUse(_modes))
_chain()
