"""A character-level transformer language model on Jane Austen, trained with shardkit's FSDP.

    python examples/fsdp_charlm.py                         # 2 ranks, gloo, 400 steps, ~3 min
    python examples/fsdp_charlm.py --steps 200 --total-steps 600 --resume  # 200 more steps
    python examples/fsdp_charlm.py --world-size 1 --resume # the same checkpoint on 1 rank
    torchrun --nproc-per-node=2 examples/fsdp_charlm.py    # ranks started by torchrun

The model is a small GPT (pre-norm blocks of causal self-attention and an MLP) over the ~80
characters of the six novels vendored in ``data/austen/`` (the last tenth of each novel is the
validation text). Each block is its own ``fully_shard`` unit and the model the root unit, so a
rank holds 1/N of every parameter, gradient and Adam moment and gathers one block at a time.

Rank 0 prints the training loss (averaged over ranks) and the validation loss as they go down,
then text the model writes from a prompt. Every ``--ckpt-every`` steps and at the end,
``shardkit.checkpoint.save`` writes each rank's shards, the optimizer's and the step, atomically;
``--resume`` loads the latest one in whatever world size runs now. A rank's batch at step ``s`` is
a function of (seed, s, rank) and the learning rate a function of ``s``, so a run stopped and
resumed on the same world size gives the same losses and weights as one run straight through,
given the same ``--total-steps`` (the schedule's length; by default the end of this run).
"""

from __future__ import annotations

import argparse
import gzip
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from shardkit import checkpoint
from shardkit.fsdp import ShardingStrategy, fully_shard
from shardkit.launch import init_from_env, shutdown, spawn

DATA = Path(__file__).resolve().parents[1] / "data" / "austen"
BOOKS = (
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
)


# ---- data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The novels as character ids: ``train`` and ``val`` are int64 [chars]."""

    chars: str  # the vocabulary: id i is chars[i]
    train: torch.Tensor
    val: torch.Tensor

    def encode(self, text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(self.chars)}
        unknown = sorted({c for c in text if c not in index})
        if unknown:
            raise ValueError(f"characters {unknown} are not in the novels' vocabulary")
        return torch.tensor([index[c] for c in text])

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())


def load_corpus(books: tuple[str, ...] = BOOKS, root: Path = DATA) -> Corpus:
    """The books' text; the last tenth of each is validation text."""
    texts = [gzip.decompress((root / f"{book}.txt.gz").read_bytes()).decode() for book in books]
    codes = [torch.frombuffer(bytearray(t.encode("utf-32-le")), dtype=torch.int32) for t in texts]
    vocab = torch.unique(torch.cat(codes)).long()
    lookup = torch.zeros(int(vocab[-1]) + 1, dtype=torch.long)
    lookup[vocab] = torch.arange(len(vocab))
    train, val = [], []
    for book in codes:
        ids = lookup[book.long()]
        cut = len(ids) * 9 // 10
        train.append(ids[:cut])
        val.append(ids[cut:])
    chars = "".join(chr(c) for c in vocab.tolist())
    return Corpus(chars, torch.cat(train), torch.cat(val))


def batch_at(
    ids: torch.Tensor, step: int, rank: int, batch: int, block: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s windows at ``step``: inputs and next-character targets, [batch, block]."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    starts = torch.randint(len(ids) - block - 1, (batch,), generator=generator)
    windows = torch.stack([ids[s : s + block + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


# ---- model -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    vocab: int
    block: int = 128  # context length
    layers: int = 4
    heads: int = 4
    dim: int = 192
    dropout: float = 0.0


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads, self.dropout = config.heads, config.dropout
        self.norm1 = nn.LayerNorm(config.dim)
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)
        self.norm2 = nn.LayerNorm(config.dim)
        self.mlp = nn.Sequential(
            nn.Linear(config.dim, 4 * config.dim),
            nn.GELU(),
            nn.Linear(4 * config.dim, config.dim),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, D]
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.norm2(x))


class CharGPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab, config.dim)
        self.positions = nn.Embedding(config.block, config.dim)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: [B, T] -> logits [B, T, V]
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def generate(model: nn.Module, corpus: Corpus, prompt: str, length: int, seed: int) -> str:
    """Sample ``length`` characters after ``prompt``. Every rank runs it (each forward gathers
    the blocks' parameters) with the same generator, so every rank writes the same text."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    ids = corpus.encode(prompt)[None]
    for _ in range(length):
        logits = model(ids[:, -model.config.block :])[:, -1]
        nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
        ids = torch.cat([ids, nxt], dim=1)
    model.train()
    return corpus.decode(ids[0])


# ---- training ----------------------------------------------------------------------------------


def learning_rate(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to a tenth (a function of the step: nothing to save)."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.total_steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def validation_loss(model: nn.Module, corpus: Corpus, args: argparse.Namespace) -> float:
    """Mean loss over the same ``--val-batches`` windows of the validation text on any world size
    (rank r evaluates batches r, r + N, ...; the sums are all-reduced)."""
    model.eval()
    rank, world = dist.get_rank(), dist.get_world_size()
    sums = torch.zeros(2, dtype=torch.float64)
    for index in range(args.val_batches):  # every rank runs every forward: FSDP gathers in it
        x, y = batch_at(corpus.val, index, 0, args.batch, args.block, seed=12345)
        loss = loss_of(model, x, y)
        if index % world == rank:
            sums += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
    dist.all_reduce(sums)
    model.train()
    return float(sums[0] / sums[1])


def shard(model: CharGPT, strategy: ShardingStrategy) -> CharGPT:
    """Each block is a unit; the root unit holds the embeddings, the last norm and the head.
    FSDP2 says the strategy with its arguments: SHARD_GRAD_OP keeps the gathered parameters
    after forward, NO_SHARD is a 2-D mesh of replicas with shards of one rank."""
    kwargs: dict = {}
    if strategy is ShardingStrategy.SHARD_GRAD_OP:
        kwargs["reshard_after_forward"] = False
    elif strategy is ShardingStrategy.NO_SHARD:
        kwargs["mesh"] = init_device_mesh("cpu", (dist.get_world_size(), 1))
    elif strategy is not ShardingStrategy.FULL_SHARD:
        raise ValueError(f"--strategy {strategy.name} is not offered by this example")
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def run(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(max(1, args.threads))
    corpus = load_corpus()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    config = GPTConfig(len(corpus.chars), args.block, args.layers, args.heads, args.dim)
    model = CharGPT(config)
    num_params = sum(p.numel() for p in model.parameters())
    model = shard(model, ShardingStrategy[args.strategy])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    start = 0
    if args.resume and checkpoint.latest(args.ckpt_dir) is not None:
        found = checkpoint.load(args.ckpt_dir, model=model, optimizer=optimizer, extra={"step": 0})
        start = found["step"]
        if rank == 0:
            print(f"resumed from {checkpoint.latest(args.ckpt_dir)} at step {start}", flush=True)
    if rank == 0:
        print(
            f"{num_params:,} parameters, vocabulary of "
            f"{len(corpus.chars)}, {len(corpus.train):,} training characters; {world_size} ranks, "
            f"{args.strategy}",
            flush=True,
        )
    end = start + args.steps
    args.total_steps = args.total_steps or end
    losses: list[float] = []
    val_losses: dict[int, float] = {}
    tokens, elapsed, recent = 0, 0.0, torch.zeros(2, dtype=torch.float64)
    for step in range(start, end):
        began = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        x, y = batch_at(corpus.train, step, rank, args.batch, args.block, args.seed)
        loss = loss_of(model, x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # DTensors: the global norm
        optimizer.step()
        elapsed += time.perf_counter() - began
        tokens += x.numel() * world_size
        mean = loss.detach().double().reshape(1)
        dist.all_reduce(mean)
        losses.append(float(mean) / world_size)
        recent += torch.tensor([losses[-1], 1.0], dtype=torch.float64)
        done = step + 1
        if done % args.eval_every == 0 or done == end:
            val_losses[done] = validation_loss(model, corpus, args)
        if done % args.log_every == 0 or done in val_losses:
            if rank == 0:
                val = f", val loss {val_losses[done]:.4f}" if done in val_losses else ""
                print(
                    f"step {done}/{end}: train loss {float(recent[0] / recent[1]):.4f}{val}, "
                    f"{tokens / elapsed:,.0f} tokens/s",
                    flush=True,
                )
            recent.zero_()
        if done % args.ckpt_every == 0 or done == end:
            path = checkpoint.save(
                args.ckpt_dir, step=done, model=model, optimizer=optimizer, extra={"step": done}
            )
            if rank == 0:
                print(f"checkpoint written to {path}", flush=True)
    if end not in val_losses:  # --steps 0: evaluate what was loaded
        val_losses[end] = validation_loss(model, corpus, args)
    sample = generate(model, corpus, args.prompt, args.sample_chars, seed=args.seed)
    if rank == 0:
        print(f"final validation loss {val_losses[end]!r}", flush=True)
        print(f"\n--- sample (prompt {args.prompt!r}) ---\n{sample}\n---", flush=True)
    return {"losses": losses, "val_losses": val_losses, "sample": sample}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--world-size", type=int, default=2, help="ranks to spawn (gloo; ignored under torchrun)")
    add("--steps", type=int, default=400, help="optimizer steps to take in this run")
    add(
        "--total-steps",
        type=int,
        default=0,
        help="length of the LR schedule (default: to the end of this run)",
    )
    add("--batch", type=int, default=16, help="windows per rank per step")
    add("--block", type=int, default=128, help="context length in characters")
    add("--layers", type=int, default=4)
    add("--heads", type=int, default=4)
    add("--dim", type=int, default=192, help="model width")
    add("--lr", type=float, default=3e-3, help="peak learning rate of AdamW")
    add("--warmup", type=int, default=50, help="warm-up steps")
    add("--strategy", choices=["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"], default="FULL_SHARD")
    add("--seed", type=int, default=0)
    add("--log-every", type=int, default=50)
    add("--eval-every", type=int, default=100, help="steps between validation losses")
    add("--val-batches", type=int, default=8, help="validation batches (same on any world size)")
    add("--ckpt-dir", default="checkpoints/charlm", help="where checkpoints go")
    add("--ckpt-every", type=int, default=200)
    add("--resume", action="store_true", help="go on from the latest checkpoint in --ckpt-dir")
    add("--prompt", default="It is a truth universally acknowledged")
    add("--sample-chars", type=int, default=300, help="characters to generate at the end")
    add("--threads", type=int, default=1, help="torch threads per rank")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if dist.is_torchelastic_launched():  # torchrun started this process as one rank
        info = init_from_env(backend="gloo")
        try:
            run(info.rank, info.world_size, args)
        finally:
            shutdown()
        return
    spawn(run, world_size=args.world_size, args=(args,), timeout=600)


if __name__ == "__main__":
    main()
