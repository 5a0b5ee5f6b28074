"""An FSDP1 transformer as torch's FSDP docs and tutorials write it (issue 27): an auto-wrap
policy per encoder layer, AdamW, gradient clipping through the wrapper, a full state dict on
rank 0, a sharded checkpoint of model and optimizer through torch.distributed.checkpoint, and the
documented sharded optimizer reload (load_sharded_optimizer_state_dict + optim_state_dict_to_load).
Run: torchrun --nproc-per-node 2 fsdp1_transformer.py OUT
"""

import functools
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
CHECKPOINT = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "fsdp1_checkpoint")


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True) for _ in range(2)
        )
        self.head = nn.Linear(16, 50)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build(seed):
    torch.manual_seed(seed)
    policy = functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={nn.TransformerEncoderLayer}
    )
    model = FSDP(
        Model(), auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu")
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def batch(step):
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, 50, (4 * world, 6), generator=g)
    mine = tokens[rank * 4 : (rank + 1) * 4]
    return mine[:, :-1], mine[:, 1:]


def train(model, optim, steps, losses, norms):
    for step in steps:
        inputs, targets = batch(step)
        loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optim.zero_grad()
        loss.backward()
        norms.append(float(model.clip_grad_norm_(1.0)))
        optim.step()
        every = [torch.zeros(()) for _ in range(world)]
        dist.all_gather(every, loss.detach())
        losses.append(float(sum(every) / world))


model, optim = build(0)
losses, norms = [], []
train(model, optim, range(4), losses, norms)

with FSDP.state_dict_type(
    model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)
):
    full = model.state_dict()

with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
    state = {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optim)}
    dcp.save(state, checkpoint_id=CHECKPOINT)

resumed, resumed_optim = build(1)
with FSDP.state_dict_type(resumed, StateDictType.SHARDED_STATE_DICT):
    model_state_dict = resumed.state_dict()
    checkpoint = {"model": model_state_dict}
    dcp.load(state_dict=checkpoint, storage_reader=dcp.FileSystemReader(CHECKPOINT))
    resumed.load_state_dict(checkpoint["model"])
    optim_state = load_sharded_optimizer_state_dict(
        model_state_dict=model_state_dict,
        optimizer_key="optim",
        storage_reader=dcp.FileSystemReader(CHECKPOINT),
    )
    flattened_osd = FSDP.optim_state_dict_to_load(resumed, resumed_optim, optim_state["optim"])
    resumed_optim.load_state_dict(flattened_osd)

continued, resumed_losses, ignored = [], [], []
train(model, optim, range(4, 7), continued, ignored)
train(resumed, resumed_optim, range(4, 7), resumed_losses, ignored)

if rank == 0:
    figures = {
        "losses": losses,
        "grad_norms": norms,
        "full_state_dict_keys": len(full),
        "full_state_dict_abs_sum": float(sum(v.abs().sum() for v in full.values())),
        "full_state_dict_shapes": json.dumps({k: list(v.shape) for k, v in sorted(full.items())}),
        "continued_losses": continued,
        "resumed_losses": resumed_losses,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
