"""Running the project's scripts (examples, benchmarks, the ``shardkit`` command) as a user
would: a fresh process, its output captured, its failure shown with the end of its stderr."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port nothing listens on now (for scripts that rendezvous through MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _argv(command: Sequence[str | Path]) -> list[str]:
    args = [str(c) for c in command]
    if args[0].endswith(".py") or args[0] == "-m":
        args.insert(0, sys.executable)
    return args


def run_script(
    *command: str | Path,
    timeout: float = 300,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run ``command`` (a script path first runs under this Python; ``-m`` too) and return its
    standard output; fail the test with its standard error if it exits non-zero."""
    result = subprocess.run(
        _argv(command),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def run_scripts(
    *commands: Sequence[str | Path],
    timeout: float = 300,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """`run_script` for independent ``commands`` at once: their standard outputs, in order.

    A test takes one core of the machine's two; scripts that are mostly start-up (imports,
    rendezvous) finish sooner side by side than one after the other.
    """
    procs = [
        subprocess.Popen(
            _argv(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env={**os.environ, **(env or {})},
        )
        for command in commands
    ]
    try:
        results = [proc.communicate(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, out[-2000:] + err[-3000:]
    return [out for out, _ in results]
