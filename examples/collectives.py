"""Every communication primitive of "Distributed programming with PyTorch" (seed 003), on 4 ranks.

    python examples/collectives.py                          # 4 ranks started by shardkit (gloo)
    torchrun --nproc-per-node=4 examples/collectives.py     # the same, started by torchrun

Point-to-point (send/recv, isend/irecv), the collectives broadcast, reduce, scatter, gather,
all-reduce, all-gather, reduce-scatter and barrier, and process groups (new_group), each printing
what the seed prints. Ranks run concurrently; each rank records its lines with a timestamp and
the parent prints them per section, so the output is stable from run to run. The last section
shows shardkit.comm: the same collectives out of place, asynchronous and differentiable.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.launch import init_from_env, shutdown, spawn

# (section, time, rank, text)
Line = tuple[str, float, int, str]


def point_to_point(rank: int, say) -> None:
    torch.manual_seed(0)
    if rank == 0:
        tensor = torch.randn(2, 2)
        dist.send(tensor, dst=1)
    elif rank == 1:
        tensor = torch.zeros(2, 2)
        say(f"rank 1 before: {tensor}\n")
        dist.recv(tensor, src=0)
        say(f"rank 1 after: {tensor}\n")

    if rank in (0, 1):
        tensor = torch.randn(2, 2) if rank == 0 else torch.zeros(2, 2)
        request = dist.isend(tensor, dst=1) if rank == 0 else dist.irecv(tensor, src=0)
        request.wait()
        say(f"isend/irecv - rank {rank}: {tensor}")


def broadcast(rank: int, say) -> None:
    tensor = torch.tensor([10.0, 20.0]) if rank == 0 else torch.zeros(2)
    dist.broadcast(tensor, src=0)
    say(f"rank {rank}: {tensor}")


def reduce(rank: int, say) -> None:
    tensor = torch.ones(2, 2) * rank
    dist.reduce(tensor, op=dist.ReduceOp.SUM, dst=0)
    if rank == 0:
        say(str(tensor))


def scatter(rank: int, say) -> None:
    output = torch.zeros(1)
    say(f"before rank {rank}: {output}\n")
    if rank == 0:
        inputs = torch.tensor([10.0, 20.0, 30.0, 40.0])
        dist.scatter(output, scatter_list=list(torch.split(inputs, 1)), src=0)
    else:
        dist.scatter(output, src=0)
    say(f"after rank {rank}: {output}\n")


def gather(rank: int, say) -> None:
    tensor = torch.ones(1) * rank
    if rank == 0:
        outputs_list = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.gather(tensor, gather_list=outputs_list, dst=0)
        say(str(outputs_list))
    else:
        dist.gather(tensor, dst=0)


def all_reduce(rank: int, say) -> None:
    tensor = torch.ones(2, 2) * rank
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    say(f"rank {rank}: {tensor}\n")


def all_gather(rank: int, say) -> None:
    tensor = torch.ones(1) * rank
    outputs_list = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(tensor_list=outputs_list, tensor=tensor)
    say(str(outputs_list))


def reduce_scatter(rank: int, say) -> None:
    input_list = torch.tensor([1, 10, 100, 1000]) * rank
    output = torch.tensor([0])
    dist.reduce_scatter(output=output, input_list=list(torch.split(input_list, 1)))
    say(f"rank {rank}: {output}\n")


def barrier(rank: int, say, tick: float) -> None:
    if rank == 0:
        seconds = 0
        while seconds <= 3:
            time.sleep(tick)
            seconds += 1
            say(f"rank 0 - seconds: {seconds}\n")
    say(f"rank {rank}: no-barrier\n")
    dist.barrier()
    say(f"rank {rank}: barrier\n")


def new_group(rank: int, say) -> None:
    group = dist.new_group([0, 2])  # every rank calls new_group, even those not in it
    if rank in (0, 2):
        tensor = torch.ones(1) * (rank + 1)
        dist.all_reduce(tensor, group=group)
        say(f"rank {rank} in group [0, 2]: {tensor}")


def shardkit_comm(rank: int, say) -> None:
    world_size = dist.get_world_size()
    # rank r sends r+1 rows to every rank: uneven, and the receivers learn the sizes themselves.
    rows = torch.full((world_size * (rank + 1), 1), float(rank), requires_grad=True)
    handle = comm.all_to_all_single(rows, input_split_sizes=[rank + 1] * world_size, async_op=True)
    received = handle.wait()
    received.sum().backward()  # backward is the reverse all-to-all
    say(
        f"rank {rank}: received {received.flatten().tolist()}, grad of sent rows sums to {rows.grad.sum().item():g}"
    )


SECTIONS = [
    ("send/recv and isend/irecv", point_to_point),
    ("broadcast", broadcast),
    ("reduce (SUM to rank 0)", reduce),
    ("scatter", scatter),
    ("gather", gather),
    ("all-reduce", all_reduce),
    ("all-gather", all_gather),
    ("reduce-scatter", reduce_scatter),
    ("barrier", barrier),
    ("new_group", new_group),
    ("shardkit.comm.all_to_all_single (uneven, async, differentiable)", shardkit_comm),
]


def run_all(rank: int, world_size: int, tick: float = 0.2) -> list[Line]:
    """Run every section on this rank; returns its printed lines."""
    if world_size != 4:
        raise ValueError(f"the seed's outputs assume 4 ranks, got world_size={world_size}")
    lines: list[Line] = []
    for title, section in SECTIONS:

        def say(text: str, title: str = title) -> None:
            lines.append((title, time.time(), rank, text.rstrip("\n")))

        if section is barrier:
            barrier(rank, say, tick)
        else:
            section(rank, say)
        dist.barrier()  # keep sections apart
    return lines


def render(all_lines: list[Line]) -> str:
    """Sections in order; in each, lines by rank, except barrier's, in the order they happened."""
    out = []
    for title, _ in SECTIONS:
        lines = [line for line in all_lines if line[0] == title]
        key = (lambda ln: ln[1]) if title == "barrier" else (lambda ln: (ln[2], ln[1]))
        out.append(f"## {title}")
        out.extend(text for _, _, _, text in sorted(lines, key=key))
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tick", type=float, default=0.2, help="seconds per 'second' of rank 0 in the barrier demo"
    )
    args = parser.parse_args()
    if dist.is_torchelastic_launched():
        info = init_from_env(backend="gloo")
        try:
            print(render(run_all(info.rank, info.world_size, args.tick)))
        finally:
            shutdown()
        return
    per_rank = spawn(run_all, world_size=4, args=(args.tick,), backend="gloo", timeout=60)
    print(render([line for lines in per_rank for line in lines]))


if __name__ == "__main__":
    main()
