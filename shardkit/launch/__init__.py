"""Starting ranks: from Python (`spawn`, `RankPool`) or under torchrun (`init_from_env`)."""

from shardkit.launch._context import RankInfo, current, is_initialized, select_backend_and_device
from shardkit.launch._env import init_from_env, local_world_size, shutdown
from shardkit.launch._errors import RankFailedError, RendezvousTimeoutError
from shardkit.launch._pool import RankPool, spawn

__all__ = [
    "RankFailedError",
    "RankInfo",
    "RankPool",
    "RendezvousTimeoutError",
    "current",
    "init_from_env",
    "is_initialized",
    "local_world_size",
    "select_backend_and_device",
    "shutdown",
    "spawn",
]
