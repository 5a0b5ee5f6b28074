"""What the user programs of this folder share (issue 26), kept as a user keeps a helper module
beside their training scripts: it imports torch alone, so ``torchrun`` (TorchRec) and
``shardkit run`` both import it unchanged from the script's folder."""

import zlib

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor


@torch.no_grad()
def initialise(model, scale):
    """Every floating tensor of the state dict from a generator seeded by its name, times
    ``scale`` (shards: their block of the full tensor), so both runs start from the same
    model whatever their plans."""
    for key, value in sorted(model.state_dict().items()):
        g = torch.Generator().manual_seed(zlib.crc32(key.removeprefix("module.").encode()))
        size = value.size() if isinstance(value, ShardedTensor) else value.shape
        full = torch.randn(tuple(size), generator=g) * scale
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                block = full
                for dim, (o, n) in enumerate(zip(shard.metadata.shard_offsets,
                                                 shard.metadata.shard_sizes)):  # fmt: skip
                    block = block.narrow(dim, o, n)
                shard.tensor.copy_(block)
        elif value.is_floating_point():
            value.copy_(full)


def mean_over_ranks(value):
    """A scalar's mean over the ranks (each rank's loss -> the global batch's)."""
    every = [torch.zeros(()) for _ in range(dist.get_world_size())]
    dist.all_gather(every, value.detach().reshape(()))
    return float(sum(every) / len(every))
