"""Which device a rank's sharded modules compute on, when the caller does not say.

[Note: default device]
The device must be one the process group can carry: NCCL moves only GPU tensors, gloo CPU
ones. So the default follows the group: ``cuda:<current device>`` under NCCL (the launcher,
`shardkit.launch` or torchrun with `init_from_env`, has already called ``torch.cuda.set_device
(LOCAL_RANK)``), the CPU otherwise, even on a machine with GPUs. A bare ``"cuda"`` means the
current GPU, as in torch, and is resolved to its index so that the shards' metadata (saved in
checkpoints) names the GPU they are on. TorchRec 1.8's DMP defaults to the CPU whatever the
backend, which cannot work under NCCL; ours differs from it only there.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardkit.types import ShardingEnv

__all__ = ["resolve_device"]


def resolve_device(device: torch.device | str | None, env: ShardingEnv) -> torch.device:
    """``device`` with its index filled in, or the default of [Note: default device]."""
    if device is None:
        uses_nccl = env.pg is not None and "nccl" in str(dist.get_backend(env.pg))
        return _current_cuda() if uses_nccl else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return _current_cuda()
    return device


def _current_cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())
