"""examples/collectives.py prints what seed 003 prints for each primitive on 4 ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import run_script

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "collectives.py"


@pytest.mark.slow
def test_collectives_example_prints_the_seed_outputs():
    out = run_script(EXAMPLE, "--tick", "0.05", timeout=180)
    # reduce and all-reduce of ones * rank over 4 ranks: 0 + 1 + 2 + 3
    assert "## reduce (SUM to rank 0)\ntensor([[6., 6.],\n        [6., 6.]])" in out
    for rank in range(4):
        assert f"rank {rank}: tensor([[6., 6.],\n        [6., 6.]])" in out
        assert f"after rank {rank}: tensor([{10 * (rank + 1)}.])" in out
        assert f"rank {rank}: tensor([{6 * 10**rank}])" in out  # reduce-scatter
    assert out.count("[tensor([0.]), tensor([1.]), tensor([2.]), tensor([3.])]") == 5
    assert "rank 1 before: tensor([[0., 0.],\n        [0., 0.]])" in out
    # barrier: nobody passes it before rank 0 arrives
    barrier = out.split("## barrier\n")[1].split("\n\n")[0].splitlines()
    first_pass = min(i for i, line in enumerate(barrier) if line.endswith(": barrier"))
    assert barrier.index("rank 0: no-barrier") < first_pass
    assert "rank 0 in group [0, 2]: tensor([4.])" in out
