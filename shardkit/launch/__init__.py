"""Starting ranks: from Python (`spawn`, `RankPool`; `set_start_method` for how their processes
start) or under torchrun (`init_from_env`).

Ranks started here record their collectives and name the rank a collective waits for
(`Watchdog`, `hang_report`; see docs/launch-and-comm.md).
"""

from shardkit.launch._context import RankInfo, current, is_initialized, select_backend_and_device
from shardkit.launch._env import init_from_env, local_world_size, shutdown
from shardkit.launch._errors import RankFailedError, RendezvousTimeoutError
from shardkit.launch._hang import HangReport, LateRankError
from shardkit.launch._intercept import hang_report
from shardkit.launch._pool import RankPool, set_start_method, spawn
from shardkit.launch._watch import Watchdog

__all__ = [
    "HangReport",
    "LateRankError",
    "RankFailedError",
    "RankInfo",
    "RankPool",
    "RendezvousTimeoutError",
    "Watchdog",
    "current",
    "hang_report",
    "init_from_env",
    "is_initialized",
    "local_world_size",
    "select_backend_and_device",
    "set_start_method",
    "shutdown",
    "spawn",
]
