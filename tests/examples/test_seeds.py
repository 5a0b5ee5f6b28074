"""The seeds' own code, after the README's import rewrite, runs and prints what the seeds show."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.scripts import free_port, run_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str) -> str:
    return run_script(EXAMPLES / script, *args, env={"MASTER_PORT": str(free_port())})


def _tables(block: str) -> dict[str, tuple[str, str, list[tuple[int, int, int]]]]:
    """table -> (sharding type, ranks, [(count, rows, cols) of its shards]) from one printed
    plan's table rows (``  large_table_0  4096 x 64  row_wise  batched_fused  0-1  2 x [2048,
    64]  ...``)."""
    found = {}
    for line in block.splitlines():
        cells = line.split()
        if line.startswith("  ") and cells[0].startswith(("large_table_", "small_table_")):
            shards = re.findall(r"(\d+) x \[(\d+), (\d+)\]", line)
            found[cells[0]] = (cells[4], cells[6], [tuple(map(int, s)) for s in shards])
    return found


def _seed_001_on_two_hosts(rank: int, world_size: int) -> str:
    """The example's table-row-wise function (not the seed's), on the session's ranks of 2
    hosts of 2: what ``seed_001_sharding.py table_row_wise`` runs on 4 ranks it spawns."""
    spec = importlib.util.spec_from_file_location("seed_001", EXAMPLES / "seed_001_sharding.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.table_row_wise_on_two_hosts(rank, world_size)


@pytest.mark.slow
def test_seed_001_plans_have_the_seeds_shard_sizes(run_ranks):
    # the seed's four simulations as its script runs them; table-row-wise on ranks already up
    out = _run("seed_001_sharding.py")
    out += "\n".join(run_ranks(_seed_001_on_two_hosts, 4, local_world_size=2))
    # Each rank prints its plan as one block (print(plan) is the stats table, never a repr);
    # blocks start with the seed's "rank:<r>,sharding plan: " prefix, not always at a line's
    # start: two ranks printing at once can put one's text before the other's newline.
    assert "ParameterSharding(" not in out
    blocks = re.split(r"rank:\d+,sharding plan: ", out)[1:]
    assert len(blocks) == 2 * 4 + 4, out[-4000:]
    plans = [_tables(block) for block in blocks]
    assert all(len(plan) == 4 for plan in plans), out[-4000:]
    assert all("module (the model itself)" in block for block in blocks)
    table_wise, row_wise, column_wise, data_parallel = (plans[i : i + 2] for i in range(0, 8, 2))
    # table-wise: one large and one small table on each rank
    owners = {name: int(ranks) for name, (kind, ranks, _) in table_wise[0].items()}
    assert {kind for kind, _, _ in table_wise[0].values()} == {"table_wise"}
    assert sorted([owners["large_table_0"], owners["large_table_1"]]) == [0, 1]
    assert sorted([owners["small_table_0"], owners["small_table_1"]]) == [0, 1]
    assert table_wise[1]["large_table_0"][2] == [(1, 4096, 64)]
    assert table_wise[0] == table_wise[1]  # every rank holds the same plan
    # row-wise: 2048/512-row halves, one on each rank
    assert row_wise[0]["large_table_1"] == ("row_wise", "0-1", [(2, 2048, 64)])
    assert row_wise[1]["small_table_0"] == ("row_wise", "0-1", [(2, 512, 64)])
    # column-wise: 32-column halves
    assert column_wise[0]["large_table_0"] == ("column_wise", "0-1", [(2, 4096, 32)])
    # data-parallel: a replica of each table on each rank
    assert data_parallel[0]["small_table_1"] == ("data_parallel", "0-1", [(2, 1024, 64)])
    # table-row-wise on 2 hosts of 2: rows split inside one host
    twrw = plans[8]
    for table in ("large_table_0", "large_table_1"):
        kind, ranks, shards = twrw[table]
        assert kind == "table_row_wise" and shards == [(2, 2048, 64)]
        assert ranks in ("0-1", "2-3"), "both shards on one host"
    assert all(plan == twrw for plan in plans[8:])


def test_seed_002_one_rank_answers_a_kjt_query():
    out = _run("seed_002_introduction.py")
    assert re.search(r"\n  product_table +\d+ x \d+ +table_wise ", out), out[:3000]
    assert (
        'KeyedJaggedTensor({\n    "product": [[101, 202], [], [303]],\n    "user": [[404], [505], [606]]\n})'
        in out
    )
    pooled = out.split("KeyedTensor({")[1]
    rows = re.findall(r"\[(-?[\d.e-]+(?:, -?[\d.e-]+){63})\]", pooled)
    assert len(rows) == 6, "3 examples x 2 features, 64 values each"
    assert rows[1] == ", ".join(["0.0"] * 64), "the second example has no product: zeros"
