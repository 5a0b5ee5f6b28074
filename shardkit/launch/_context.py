"""What a rank knows about itself once its process group is up.

`spawn` and `init_from_env` are the only places that create a `RankInfo`; the rest of shardkit asks
`current()` instead of reading environment variables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RankInfo", "current", "is_initialized", "select_backend_and_device"]

# Used when neither `spawn(timeout=...)` nor `init_from_env(timeout=...)` says otherwise: long
# enough for a slow first step, short enough that a hung collective ends the job the same hour.
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RankInfo:
    """The identity of this process in the job.

    Args:
        rank: global rank, ``0 <= rank < world_size``.
        world_size: number of ranks in the job.
        local_rank: rank inside this host, ``0 <= local_rank < local_world_size``.
        local_world_size: ranks per host (a "host" may be simulated: see ``spawn``).
        backend: the process group backend, ``"gloo"`` or ``"nccl"``.
        device: the device this rank computes on.
        timeout_s: the collective timeout of the process group, in seconds.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank must be in [0, local_world_size={self.local_world_size}), "
                f"got {self.local_rank}"
            )

    @property
    def num_hosts(self) -> int:
        """Number of hosts, ``world_size // local_world_size`` (hosts must be equal in size)."""
        if self.world_size % self.local_world_size:
            raise ValueError(
                f"world_size ({self.world_size}) is not a multiple of local_world_size "
                f"({self.local_world_size}): shardkit's host-aware sharding needs the same "
                "number of ranks on every host"
            )
        return self.world_size // self.local_world_size

    @property
    def host_index(self) -> int:
        """Index of this rank's host, ``rank // local_world_size``."""
        return self.rank // self.local_world_size


_current: RankInfo | None = None


def current() -> RankInfo:
    """The `RankInfo` of this process; raises if shardkit did not set up its process group."""
    if _current is None:
        raise RuntimeError(
            "this process has no shardkit rank: start ranks with shardkit.launch.spawn(fn, "
            "world_size=N), or call shardkit.launch.init_from_env() in a script run by torchrun"
        )
    return _current


def is_initialized() -> bool:
    """Whether `spawn` or `init_from_env` set up this process."""
    return _current is not None


def _set_current(info: RankInfo | None) -> None:
    global _current
    _current = info


def select_backend_and_device(
    local_rank: int, local_world_size: int, backend: str | None = None
) -> tuple[str, torch.device]:
    """Pick the backend and device of one rank.

    NCCL on ``cuda:<local_rank>`` when every rank of the host has a GPU of its own, gloo on the CPU
    otherwise. ``backend`` forces a choice; asking for NCCL without enough GPUs is an error.
    """
    num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    has_own_gpu = num_gpus >= local_world_size
    if backend is None:
        backend = "nccl" if has_own_gpu and torch.distributed.is_nccl_available() else "gloo"
    if backend == "nccl":
        if not has_own_gpu:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank on each host: {local_world_size} ranks per "
                f"host but {num_gpus} GPU(s) visible; use backend='gloo' or fewer ranks per host"
            )
        return backend, torch.device("cuda", local_rank)
    if backend == "gloo":
        return backend, torch.device("cpu")
    raise ValueError(f"backend must be 'gloo', 'nccl' or None (choose for me), got {backend!r}")
