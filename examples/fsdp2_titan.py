"""An FSDP2 training program in torchtitan's style, written for torch: it imports
``torch.distributed.fsdp``. ``benchmarks/fsdp2_parity.py`` runs it as written and after the
import rewrite ``torch.distributed.fsdp`` -> ``shardkit.fsdp``, and compares the two.

    torchrun --standalone --nproc-per-node=2 examples/fsdp2_titan.py --steps 20

A small decoder-only transformer on a synthetic next-token task (a fixed random Markov chain, so
the loss has somewhere to go); every block is its own ``fully_shard`` unit and the model the
root; bf16 parameters with float32 gradient reduction; AdamW; ``clip_grad_norm_(..., 1.0)``; and
at ``--ckpt-at`` a ``torch.distributed.checkpoint`` save of the model and optimizer through
``torch.distributed.checkpoint.state_dict``, loaded into a freshly built model and optimizer that
train on. Rank 0 prints one JSON line per step: the loss averaged over ranks and the gradient
norm before clipping.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

VOCAB, DIM, HEADS, LAYERS, CONTEXT = 32, 64, 4, 3, 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.ffn_norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, 4 * DIM, bias=False)
        self.w2 = nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        B, T, D = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, HEADS, D // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, D))
        return x + self.w2(F.gelu(self.w1(self.ffn_norm(x))))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, V]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def batch(step: int, rank: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s sequences at ``step``, from a fixed random Markov chain."""
    chain = torch.softmax(
        3 * torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0)), 1
    )
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.empty(batch_size, CONTEXT + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB, (batch_size,), generator=g)
    for t in range(CONTEXT):
        tokens[:, t + 1] = torch.multinomial(chain[tokens[:, t]], 1, generator=g)[:, 0]
    return tokens[:, :-1], tokens[:, 1:]


def build(mesh):
    torch.manual_seed(0)
    model = Transformer()
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return model, optimizer


def checkpoint_round_trip(model, optimizer, mesh, path):
    """Save model and optimizer, then continue with a fresh model and optimizer loaded from it."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=path)
    model, optimizer = build(mesh)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    return model, optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--ckpt-at", type=int, default=10, help="save and reload after this step")
    parser.add_argument("--ckpt-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world_size,))
    model, optimizer = build(mesh)
    ckpt_dir = args.ckpt_dir or os.path.join(tempfile.gettempdir(), f"fsdp2_titan_{os.getpid()}")
    if rank == 0:
        print(json.dumps({"fsdp": fully_shard.__module__, "world_size": world_size}), flush=True)
    for step in range(args.steps):
        x, y = batch(step, rank, args.batch)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().reshape(1).clone()
        dist.all_reduce(mean)
        full_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if rank == 0:
            record = {
                "step": step + 1,
                "loss": mean.item() / world_size,
                "grad_norm": full_norm.item(),
            }
            print(json.dumps(record), flush=True)
        if step + 1 == args.ckpt_at:
            model, optimizer = checkpoint_round_trip(model, optimizer, mesh, ckpt_dir)
    dist.barrier()  # every rank is done with gloo before any tears it down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
