"""Benchmarks that ship with the package (run them with ``shardkit bench ...``)."""

from shardkit.bench._machine import machine_info, machine_line
from shardkit.bench.comm import CommBenchConfig, CommBenchRow, format_table, run_comm_bench

__all__ = [
    "CommBenchConfig",
    "CommBenchRow",
    "format_table",
    "machine_info",
    "machine_line",
    "run_comm_bench",
]
