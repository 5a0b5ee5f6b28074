"""The README's quick starts run as printed (so they cannot rot)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> dict[str, str]:
    text = README.read_text()
    found = {}
    for title, body in re.findall(r"## (Quick start: [^\n]+)\n\n```python\n(.*?)```", text, re.S):
        found[title] = body
    return found


def test_the_readme_has_both_quick_starts():
    assert set(_blocks()) == {
        "Quick start: model-parallel embeddings",
        "Quick start: fully sharded data parallel",
    }


@pytest.mark.parametrize("title", sorted(_blocks()))
def test_quick_start_runs(title, tmp_path):
    script = tmp_path / "quick_start.py"
    script.write_text(_blocks()[title])
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if title == "Quick start: model-parallel embeddings":  # print(model.plan): the stats table
        lines = result.stdout.splitlines()
        assert lines[0] == (
            "4 tables in 1 module(s) on 2 ranks (1 host(s) x 2), cpu, batch size 512 per rank"
        )
        assert lines[1].startswith("memory per rank: ") and "module (the model itself)" in lines
        assert [line.split()[0] for line in lines if line.startswith("  t")] == [
            "t0", "t1", "t2", "t3",
        ]  # fmt: skip
        assert "ParameterSharding(" not in result.stdout
