"""The seeds' own code, after the README's import rewrite, runs and prints what the seeds show."""

from __future__ import annotations

import re
from pathlib import Path

from tests.scripts import free_port, run_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str) -> str:
    return run_script(EXAMPLES / script, *args, env={"MASTER_PORT": str(free_port())})


def _shards(plan_line: str, table: str) -> list[tuple[list[int], list[int], int]]:
    """(offsets, sizes, rank) of each shard of ``table`` in a printed plan."""
    entry = plan_line.split(f"'{table}': ParameterSharding(")[1].split("ParameterSharding(")[0]
    found = re.findall(
        r"shard_offsets=\[(\d+), (\d+)\], shard_sizes=\[(\d+), (\d+)\], placement=rank:(\d+)/cpu",
        entry,
    )
    return [([int(a), int(b)], [int(c), int(d)], int(r)) for a, b, c, d, r in found]


def test_seed_001_plans_have_the_seeds_shard_sizes():
    out = _run("seed_001_sharding.py", "table_row_wise")
    # Ranks print at the same moment; one's newline may land after the other's line, so the
    # plans are found by their shape, not by line.
    plans = re.findall(r"rank:\d+,sharding plan: \{.*?\}\}", out)
    assert len(plans) == 2 * 4 + 4, out[-4000:]
    table_wise, row_wise, column_wise, data_parallel = (plans[i : i + 2] for i in range(0, 8, 2))
    # table-wise: one large and one small table on each rank
    owners = {
        t: _shards(table_wise[0], t)[0][2]
        for t in ("large_table_0", "large_table_1", "small_table_0", "small_table_1")
    }
    assert sorted([owners["large_table_0"], owners["large_table_1"]]) == [0, 1]
    assert sorted([owners["small_table_0"], owners["small_table_1"]]) == [0, 1]
    assert _shards(table_wise[1], "large_table_0")[0][1] == [4096, 64]
    # row-wise: 2048/512-row halves
    assert _shards(row_wise[0], "large_table_1") == [
        ([0, 0], [2048, 64], 0),
        ([2048, 0], [2048, 64], 1),
    ]
    assert _shards(row_wise[1], "small_table_0") == [
        ([0, 0], [512, 64], 0),
        ([512, 0], [512, 64], 1),
    ]
    # column-wise: 32-column halves
    assert _shards(column_wise[0], "large_table_0") == [
        ([0, 0], [4096, 32], 0),
        ([0, 32], [4096, 32], 1),
    ]
    # data-parallel: replicated, no shards
    assert (
        "'small_table_1': ParameterSharding(sharding_type='data_parallel', compute_kernel='batched_dense', ranks=[0, 1], sharding_spec=None)"
        in data_parallel[0]
    )
    # table-row-wise on 2 hosts of 2: rows split inside one host
    twrw = plans[8]
    for table in ("large_table_0", "large_table_1"):
        shards = _shards(twrw, table)
        assert [s[1] for s in shards] == [[2048, 64], [2048, 64]]
        assert {s[2] // 2 for s in shards} in ({0}, {1}), "both shards on one host"
    assert all(p.split("plan: ")[1] == plans[8].split("plan: ")[1] for p in plans[8:])


def test_seed_002_one_rank_answers_a_kjt_query():
    out = _run("seed_002_introduction.py")
    assert "'product_table': ParameterSharding(sharding_type='table_wise'" in out
    assert (
        'KeyedJaggedTensor({\n    "product": [[101, 202], [], [303]],\n    "user": [[404], [505], [606]]\n})'
        in out
    )
    pooled = out.split("KeyedTensor({")[1]
    rows = re.findall(r"\[(-?[\d.e-]+(?:, -?[\d.e-]+){63})\]", pooled)
    assert len(rows) == 6, "3 examples x 2 features, 64 values each"
    assert rows[1] == ", ".join(["0.0"] * 64), "the second example has no product: zeros"
