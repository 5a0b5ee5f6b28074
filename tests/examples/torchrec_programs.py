"""Running programs written for TorchRec both ways shardkit supports: after the README's import
rewrite (under torchrun), and unchanged under ``shardkit run``."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

from tests.scripts import ROOT, run_script

SHARDKIT = Path(sys.executable).with_name("shardkit")

# The README's table, "Running TorchRec and FSDP code" (this machine has no GPU, and the
# programs pick cpu/gloo themselves when torch.cuda.is_available() is False).
REWRITE = [
    (r"\bfrom fbgemm_gpu\b", "from shardkit.fbgemm_gpu"),
    (r"\bimport fbgemm_gpu\b", "import shardkit.fbgemm_gpu"),
    (r"\btorch\.distributed\.fsdp\b", "shardkit.fsdp"),
    (r"\btorchrec\b", "shardkit"),
]


def rewrite(source: str) -> str:
    """``source`` with its TorchRec (and FBGEMM, FSDP) imports pointing at shardkit."""
    for pattern, replacement in REWRITE:
        source = re.sub(pattern, replacement, source)
    return source


def rewritten_command(program: Path, tmp_path: Path, *args: str, nproc: int = 2) -> list[str]:
    """The command that runs ``program`` rewritten (written to ``tmp_path``), on ``nproc`` ranks
    under torchrun."""
    rewritten = tmp_path / program.name
    rewritten.write_text(rewrite(program.read_text()))
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(rewritten), *args]  # fmt: skip


def unchanged_command(program: Path, *args: str, nproc: int = 2) -> list[str]:
    """The command that runs ``program`` as it is, on ``nproc`` ranks under ``shardkit run``."""
    return [str(SHARDKIT), "run", f"--nproc-per-node={nproc}", str(program), *args]


def run_unchanged(program: Path, *args: str, nproc: int = 2) -> str:
    """``program`` as it is, on ``nproc`` ranks under ``shardkit run``; its standard output."""
    return run_script(*unchanged_command(program, *args, nproc=nproc), cwd=ROOT)


def results(output: str) -> dict[str, str]:
    """``RESULT <name> <rest>`` lines as ``{name: rest}``."""
    found = re.findall(r"^RESULT (\S+) (.*)$", output, flags=re.MULTILINE)
    return dict(found)


def unresolved_imports(source: str) -> list[str]:
    """The imports of ``source`` (rewritten) that name a shardkit module or name that does not
    exist: what running the rewritten program would fail on first."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in modules:
            if module.split(".")[0] != "shardkit":
                continue
            try:
                found = importlib.import_module(module)
            except ImportError:
                missing.append(module)
                continue
            if name is not None and not hasattr(found, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{module}.{name}")
    return missing
