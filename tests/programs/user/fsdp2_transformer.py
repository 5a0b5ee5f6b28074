"""An FSDP2 transformer as torch's fully_shard docs and torchtitan write it (issue 27):
fully_shard per block then the root, gradient clipping on DTensor parameters, the
torch.distributed.checkpoint.state_dict API (get_state_dict / set_state_dict, full and sharded),
a DCP save and load of model and optimizer into a fresh model, and training on.
Run: torchrun --nproc-per-node 2 fsdp2_transformer.py OUT
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
CHECKPOINT = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "fsdp2_checkpoint")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.mlp = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(16, 40)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build(seed):
    torch.manual_seed(seed)
    model = Model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)


def train(model, optim, steps):
    losses, norms = [], []
    for step in steps:
        g = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, 40, (3 * world, 8), generator=g)[rank * 3 : (rank + 1) * 3]
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5).full_tensor()))
        optim.step()
        optim.zero_grad()
        every = [torch.zeros(()) for _ in range(world)]
        dist.all_gather(every, loss.detach())
        losses.append(float(sum(every) / world))
    return losses, norms


model, optim = build(0)
losses, norms = train(model, optim, range(5))

full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
model_sd, optim_sd = get_state_dict(model, optim)
dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=CHECKPOINT)

resumed, resumed_optim = build(1)
train(resumed, resumed_optim, range(100, 101))  # optimizer state exists, then is replaced
model_sd, optim_sd = get_state_dict(resumed, resumed_optim)
state = {"model": model_sd, "optim": optim_sd}
dcp.load(state, checkpoint_id=CHECKPOINT)
set_state_dict(resumed, resumed_optim, model_state_dict=state["model"],
               optim_state_dict=state["optim"])  # fmt: skip
continued, _ = train(model, optim, range(5, 8))
resumed_losses, resumed_norms = train(resumed, resumed_optim, range(5, 8))

if rank == 0:
    figures = {
        "losses": losses,
        "grad_norms": norms,
        "full_state_dict_keys": len(full),
        "full_state_dict_abs_sum": float(sum(v.abs().sum() for v in full.values())),
        "full_on_cpu_plain": all(
            type(v) is torch.Tensor and v.device.type == "cpu" for v in full.values()
        ),
        "optim_state_keys": len(optim_sd["state"]),
        "continued_losses": continued,
        "resumed_losses": resumed_losses,
        "resumed_grad_norms": resumed_norms,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
