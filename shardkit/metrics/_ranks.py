"""How metric states travel: sums are all-reduced, per-example rows all-gathered (uneven counts).

Outside a process group (a single process, or before ``init_process_group``) nothing moves, so
the same metric code runs in a notebook and on N ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardkit import comm

__all__ = ["Group", "collective_device", "distributed", "gather_rows", "sum_over_ranks"]

Group = dist.ProcessGroup | None


def distributed(group: Group) -> bool:
    """Whether there are other ranks to combine with."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def collective_device(group: Group) -> torch.device:
    """Where tensors must be for the group's backend: the current GPU for NCCL, else the CPU."""
    return comm.group_device(group) if distributed(group) else torch.device("cpu")


def sum_over_ranks(local: torch.Tensor, group: Group) -> torch.Tensor:
    """``local`` summed over the ranks of ``group`` (every rank gets it), on the CPU."""
    if not distributed(group):
        return local.cpu()
    total = comm.all_reduce(local.to(collective_device(group)), group=group)
    assert isinstance(total, torch.Tensor)
    return total.cpu()


def gather_rows(local: torch.Tensor, group: Group) -> torch.Tensor:
    """Every rank's ``[N_r, *]`` rows concatenated in rank order (``N_r`` may differ; 0 too),
    on the CPU."""
    if not distributed(group):
        return local.cpu()
    device = collective_device(group)
    sizes = comm.all_gather_sizes(local.size(0), group=group, device=device)
    if sum(sizes) == 0:  # every rank knows: all skip the gather together
        return local.cpu()
    gathered = comm.all_gather_into_tensor(local.to(device), output_split_sizes=sizes, group=group)
    assert isinstance(gathered, torch.Tensor)
    return gathered.cpu()
