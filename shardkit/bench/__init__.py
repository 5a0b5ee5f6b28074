"""Benchmarks that ship with the package (run them with ``shardkit bench ...``)."""

from shardkit.bench._calibrate import (
    CalibrationConfig,
    calibrate,
    format_profile,
)
from shardkit.bench._fit import fit_nonnegative
from shardkit.bench._machine import machine_identity, machine_info, machine_line
from shardkit.bench._resample import MachineSampler, resampled_profile
from shardkit.bench.comm import CommBenchConfig, CommBenchRow, format_table, run_comm_bench

__all__ = [
    "CalibrationConfig",
    "CommBenchConfig",
    "CommBenchRow",
    "MachineSampler",
    "calibrate",
    "fit_nonnegative",
    "format_profile",
    "format_table",
    "machine_identity",
    "machine_info",
    "machine_line",
    "resampled_profile",
    "run_comm_bench",
]
