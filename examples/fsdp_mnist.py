"""Seed 004's program on shardkit: a CNN on Fashion-MNIST with DDP or shardkit's FSDP, on CPUs.

    python examples/fsdp_mnist.py --mode fsdp-autowrap           # 2 ranks, gloo, 10 epochs
    python examples/fsdp_mnist.py --mode ddp --epochs 3
    torchrun --nproc-per-node=2 examples/fsdp_mnist.py --epochs 2  # ranks started by torchrun
    SHARDKIT_FMNIST_LIMIT=2000 python examples/fsdp_mnist.py --mode fsdp-offload --epochs 2

Modes (seed 004's four runs): ``ddp`` (torch's DistributedDataParallel), ``fsdp`` (one unit),
``fsdp-autowrap`` (``size_based_auto_wrap_policy(min_num_params=20000)``: fc1 becomes its own
unit), ``fsdp-offload`` (auto-wrap plus ``CPUOffload(offload_params=True)``). Each epoch trains
with a DistributedSampler, Adadelta and StepLR, then tests; rank 0 prints the loss and the test
accuracy. At the end every rank reports its step time, its peak memory (resident set size of the
process, torch included) and the bytes of model state it holds (parameters, gradients and
optimizer state: what sharding divides). ``--save-model`` writes the full state dict from rank 0.
The data is the vendored Fashion-MNIST (examples/fsdp_data.py); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import functools
import resource
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fsdp_data import fashion_mnist
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from shardkit import comm
from shardkit.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
from shardkit.fsdp.fully_sharded_data_parallel import CPUOffload
from shardkit.fsdp.wrap import size_based_auto_wrap_policy
from shardkit.launch import init_from_env, shutdown, spawn

MODES = ("ddp", "fsdp", "fsdp-autowrap", "fsdp-offload")


class Net(nn.Module):
    """Seed 004's CNN: 1.2 M parameters, 1.18 M of them in fc1."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 1, 28, 28]
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)  # [B, 64, 12, 12]
        x = torch.flatten(self.dropout1(x), 1)  # [B, 9216]
        x = self.dropout2(F.relu(self.fc1(x)))  # [B, 128]
        return F.log_softmax(self.fc2(x), dim=1)  # [B, 10]


def wrap(model: nn.Module, mode: str) -> nn.Module:
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if mode == "fsdp":
        return FullyShardedDataParallel(model)
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=20000)
    offload = CPUOffload(offload_params=mode == "fsdp-offload")
    return FullyShardedDataParallel(model, auto_wrap_policy=policy, cpu_offload=offload)


def train_epoch(model, loader, optimizer) -> tuple[float, float, int]:
    """Returns (summed loss, examples, steps) of this rank, and times the steps."""
    model.train()
    total, count, steps = 0.0, 0, 0
    for data, target in loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target, reduction="sum")
        loss.backward()
        optimizer.step()
        total, count, steps = total + loss.item(), count + len(data), steps + 1
    return total, count, steps


def test(model, loader) -> torch.Tensor:
    """[summed loss, correct, examples] over all ranks."""
    model.eval()
    sums = torch.zeros(3)
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            sums[0] += F.nll_loss(output, target, reduction="sum").item()
            sums[1] += (output.argmax(dim=1) == target).sum().item()
            sums[2] += len(data)
    dist.all_reduce(sums)
    return sums


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this rank holds."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()]
    tensors += [v for state in optimizer.state.values() for v in state.values()]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def run(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    train_set, test_set = fashion_mnist("train"), fashion_mnist("test")
    train_sampler = DistributedSampler(train_set, rank=rank, num_replicas=world_size, shuffle=True)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(
        test_set,
        batch_size=args.test_batch_size,
        sampler=DistributedSampler(test_set, rank=rank, num_replicas=world_size),
    )
    model = wrap(Net(), args.mode)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    epochs, step_time, num_steps = [], 0.0, 0
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        start = time.perf_counter()
        loss, count, steps = train_epoch(model, train_loader, optimizer)
        step_time += time.perf_counter() - start
        num_steps += steps
        sums = test(model, test_loader)
        train_sums = torch.tensor([loss, count])
        dist.all_reduce(train_sums)
        epochs.append(
            (
                float(train_sums[0] / train_sums[1]),
                float(sums[1] / sums[2]),
                int(sums[1]),
                int(sums[2]),
            )
        )
        if rank == 0:
            print(
                f"epoch {epoch}: train loss {epochs[-1][0]:.4f}, test loss {float(sums[0] / sums[2]):.4f}, "
                f"accuracy {int(sums[1])}/{int(sums[2])} ({100 * epochs[-1][1]:.2f}%)",
                flush=True,
            )
        scheduler.step()
    if args.save_model:
        save(model, args)
    return {
        "epochs": epochs,
        "ms_per_step": 1000 * step_time / max(1, num_steps),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "state_mb": model_state_bytes(model, optimizer) / 2**20,
        "model": repr(model),
    }


def save(model: nn.Module, args: argparse.Namespace) -> None:
    """Seed 004: a barrier, then every rank calls state_dict() and rank 0 saves it."""
    dist.barrier()
    if args.mode == "ddp":
        states = model.module.state_dict()
    else:
        config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            states = model.state_dict()
    if dist.get_rank() == 0:
        torch.save(states, args.save_model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=MODES, default="fsdp-autowrap")
    parser.add_argument("--world-size", type=int, default=2, help="ranks to spawn (not torchrun)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save-model", metavar="PATH", default=None, help="e.g. mnist_cnn.pt")
    args = parser.parse_args()
    if dist.is_torchelastic_launched():  # torchrun started this process as one rank
        info = init_from_env(backend="gloo")
        try:
            results = comm.all_gather_object(run(info.rank, info.world_size, args))
        finally:
            shutdown()
        if info.rank != 0:
            return
    else:
        results = spawn(run, world_size=args.world_size, args=(args,), timeout=600)
    print(results[0]["model"])
    print(f"\n{args.mode} on {len(results)} ranks (CPU, gloo):")
    for rank, result in enumerate(results):
        print(
            f"  rank {rank}: {result['ms_per_step']:.1f} ms/step, peak RSS {result['peak_rss_mb']:.0f} MB, "
            f"model state (params + grads + optimizer) {result['state_mb']:.2f} MB"
        )


if __name__ == "__main__":
    main()
