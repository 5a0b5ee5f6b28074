"""Dependencies between shardkit's packages only point down (../shared/STYLE.md, "Layering").

Each package lists the shardkit packages it may import; the test reads every module's imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import shardkit

ROOT = Path(shardkit.__file__).parent

# package -> shardkit packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "launch": set(),
    "comm": set(),
    "sparse": set(),
    "optim": set(),
    "kernels": {"optim"},
    "modules": {"sparse", "optim", "kernels"},
    "planner": {"launch", "sparse", "modules", "optim", "comm", "kernels"},
    "sharding": {"launch", "comm", "sparse", "modules", "optim", "planner", "kernels"},
    "distributed": {
        "launch", "comm", "sparse", "modules", "optim", "planner", "sharding", "kernels",
    },
    "fsdp": {"comm", "launch"},
    "models": {"sparse", "modules", "optim", "kernels"},
    "data": {"sparse"},
    "metrics": {"comm", "launch"},
    "checkpoint": {
        "launch", "comm", "sparse", "modules", "optim", "planner", "sharding", "fsdp", "kernels",
    },
    "bench": {
        "launch", "comm", "sparse", "modules", "optim", "planner", "sharding", "fsdp", "kernels",
    },
    "cli": {
        "launch", "comm", "sparse", "modules", "optim", "planner", "sharding", "distributed",
        "fsdp", "models", "data", "checkpoint", "bench", "train", "metrics", "kernels",
    },
    "train": {
        "launch", "comm", "sparse", "modules", "optim", "planner", "sharding", "distributed",
        "fsdp", "models", "data", "checkpoint", "metrics", "kernels",
    },
}  # fmt: skip


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "shardkit" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_packages_only_import_downwards():
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if len(relative.parts) == 1:
            continue  # shardkit/__init__.py and __main__.py sit on top
        package = relative.parts[0]
        assert package in ALLOWED, f"new package {package!r}: add it to ALLOWED with its layer"
        bad = _imports(path) - ALLOWED[package] - {package}
        if bad:
            problems.append(f"{relative} imports {sorted(bad)}")
    assert not problems, "\n".join(problems)
