"""Running the project's scripts (examples, benchmarks, the ``shardkit`` command) as a user
would: a fresh process, its output captured, its failure shown with the end of its stderr."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port nothing listens on now (for scripts that rendezvous through MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_script(
    *command: str | Path,
    timeout: float = 300,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run ``command`` (a script path first runs under this Python; ``-m`` too) and return its
    standard output; fail the test with its standard error if it exits non-zero."""
    args = [str(c) for c in command]
    if args[0].endswith(".py") or args[0] == "-m":
        args.insert(0, sys.executable)
    result = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout
