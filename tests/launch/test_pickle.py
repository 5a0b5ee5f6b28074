"""Functions the ranks cannot import by name travel by value."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest

from shardkit.launch._pickle import dumps


def module_level(x):
    return x + 1


def test_importable_functions_go_by_reference():
    assert b"module_level" in dumps(module_level)
    assert pickle.loads(dumps(module_level)) is module_level


def test_closures_lambdas_and_recursion_go_by_value():
    base = 5

    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    def add_base(x, scale=2, *, extra=0):
        return base + scale * x + extra + fact(3)

    restored = pickle.loads(dumps(add_base))
    assert restored is not add_base
    assert restored(1) == add_base(1) == 13
    assert restored(1, 3, extra=1) == 15
    assert pickle.loads(dumps(lambda y: y * base))(2) == 10


NOTEBOOK = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from shardkit.launch import spawn

    SCALE = 10

    def helper(rank):
        return rank * SCALE

    def work(rank, world_size):
        t = torch.tensor([float(helper(rank))])
        dist.all_reduce(t)
        return t.item()

    print(spawn(work, world_size=2, timeout=30))
    """
)

SCRIPT = textwrap.dedent(
    """
    import torch.distributed as dist
    from shardkit.launch import spawn

    def work(rank, world_size):
        return dist.get_rank() * 2

    if __name__ == "__main__":
        print(spawn(work, world_size=2, timeout=30))
    """
)


@pytest.mark.slow
def test_spawn_from_notebook_style_main():
    """Code fed on stdin has no file for the ranks to re-import, like a notebook cell."""
    result = subprocess.run(
        [sys.executable, "-"], input=NOTEBOOK, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[10.0, 10.0]"


def test_spawn_from_script(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 2]"
