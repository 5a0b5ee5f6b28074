"""Test files share helpers through support modules (``tests/sharding/common.py``,
``tests/fsdp/models.py``, ...), never by importing another test file or a private name of
another module: a test file is free to change its own helpers (issue 17)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _borrowed(path: Path) -> list[str]:
    """Imports in ``path`` (nested ones included) of a test file or of a private name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            if node.module.rpartition(".")[2].startswith("test_"):
                found.append(f"line {node.lineno}: from {node.module} (a test file)")
            private = [alias.name for alias in node.names if alias.name.startswith("_")]
            if private:
                found.append(f"line {node.lineno}: {private} from {node.module} (private)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tests.") and ".test_" in alias.name:
                    found.append(f"line {node.lineno}: import {alias.name} (a test file)")
    return found


def test_test_files_share_helpers_only_through_support_modules():
    problems = [
        f"{path.relative_to(TESTS.parent)} {problem}"
        for path in sorted(TESTS.rglob("*.py"))
        for problem in _borrowed(path)
    ]
    assert not problems, "move shared helpers into a support module:\n" + "\n".join(problems)
