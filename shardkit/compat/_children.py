"""Carrying ``shardkit run`` into the Python processes a program starts itself.

[Note: child processes]
``shardkit run`` maps imports in its own process (`install_aliases`), but a program may start
more Pythons: a serving step in a fresh ``python`` subprocess, multiprocessing's spawned ranks,
a helper script. `carry_to_children` sets the environment those inherit:

- ``SHARDKIT_RUN`` = ``aliases`` (and ``cuda-on-cpu`` where CUDA runs on the CPU);
- ``PYTHONPATH`` starts with ``shardkit/compat/_site``, whose ``sitecustomize`` every Python
  imports at start-up: it reads ``SHARDKIT_RUN`` and, on the process's first ``torchrec`` or
  ``fbgemm_gpu`` import (not before: a child that never imports them pays nothing), installs
  the same aliases and mapping; then it runs the ``sitecustomize`` it hides, if there is one.

A child started with ``python -S`` or ``-I`` (no site, or no environment) or with an
environment of its own making gets none of this, as it would get no ``PYTHONPATH``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CHILD_MODE_VARIABLE", "SITE_DIRECTORY", "carry_to_children"]

CHILD_MODE_VARIABLE = "SHARDKIT_RUN"
SITE_DIRECTORY = str(Path(__file__).resolve().parent / "_site")


def carry_to_children(*, cuda_on_cpu: bool) -> None:
    """Set this process's environment so Pythons it starts map imports as it does (see
    [Note: child processes]); ``cuda_on_cpu`` carries `map_cuda_to_cpu` too."""
    os.environ[CHILD_MODE_VARIABLE] = "aliases,cuda-on-cpu" if cuda_on_cpu else "aliases"
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if SITE_DIRECTORY not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([SITE_DIRECTORY, *paths])
