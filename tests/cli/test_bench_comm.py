"""``shardkit bench comm`` runs end to end on a tiny sweep and writes its JSON."""

from __future__ import annotations

import json

from shardkit.cli import main


def test_bench_comm_smoke(tmp_path, capsys):
    out = tmp_path / "comm.json"
    status = main(
        [
            "bench", "comm", "--world-size", "2", "--min-bytes", "1K", "--max-bytes", "4K",
            "--repeats", "1", "--json", str(out),
        ]
    )  # fmt: skip
    assert status == 0
    table = capsys.readouterr().out
    assert "busbw(GB/s)" in table and "overhead" in table
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    ops = {(row["op"], row["bytes"]) for row in report["rows"]}
    assert ops == {
        (op, size)
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
        for size in (1024, 4096)
    }
    for row in report["rows"]:
        assert row["time_us"] > 0 and row["busbw_gbps"] > 0
