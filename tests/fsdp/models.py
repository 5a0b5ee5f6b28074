"""Small models with awkward sizes, their data, and the single-process training that is the spec.

Sizes 3, 5, 7, 11, 13 divide neither by 2 nor (mostly) by 3, so shards are uneven and some ranks
hold no rows of a parameter; the root unit mixes a frozen parameter, a 0-dim parameter and a
buffer with trainable weights.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

STEPS = 3
ROWS_PER_RANK = 4
# float32 training of the same model on the same global batch: sharded and single-process runs
# differ only in the order of summation (AVG reduce-scatter vs one mean), ~1e-7 relative.
TOL = {"atol": 1e-5, "rtol": 1e-4}


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class ToyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(5, 7)
        self.blocks = nn.Sequential(Block(7, 11), Block(7, 13))
        self.frozen = nn.Parameter(torch.randn(7), requires_grad=False)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.head = nn.Linear(7, 3)
        self.register_buffer("offset", torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.blocks(self.embed(x) + self.frozen)
        return self.head(hidden) * self.scale + self.offset


def make_model(seed: int = 0) -> ToyNet:
    torch.manual_seed(seed)
    return ToyNet()


def batches(world_size: int, steps: int = STEPS, seed: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """Global batches ``[world_size * ROWS_PER_RANK, 5] -> [.., 3]``; rank r takes chunk r."""
    g = torch.Generator().manual_seed(seed)
    rows = world_size * ROWS_PER_RANK
    return [
        (torch.randn(rows, 5, generator=g), torch.randn(rows, 3, generator=g)) for _ in range(steps)
    ]


def local(batch: tuple[torch.Tensor, ...], rank: int, world_size: int) -> tuple[torch.Tensor, ...]:
    return tuple(t.chunk(world_size)[rank] for t in batch)


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adam": functools.partial(torch.optim.Adam, lr=0.01),
    "adadelta": functools.partial(torch.optim.Adadelta, lr=1.0),
    "sgd": functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
}


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x).float() - y) ** 2).mean()


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | None = None,
) -> None:
    """Steps on this rank's chunk of each global batch, moved to ``device`` (default: left on
    the CPU)."""
    for batch in data:
        x, y = (t.to(device) if device is not None else t for t in local(batch, rank, world_size))
        optimizer.zero_grad()
        loss_fn(model, x, y).backward()
        optimizer.step()


def reference(world_size: int, optimizer: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """The spec: the unsharded model trained in one process on the global batches."""
    model = make_model()
    train(model, OPTIMIZERS[optimizer](model.parameters()), batches(world_size, steps))
    return model.state_dict()


def assert_state_equal(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], **tol: float
) -> None:
    assert list(got) == list(want), f"keys differ: {list(got)} vs {list(want)}"
    for key, value in want.items():
        torch.testing.assert_close(got[key].float(), value.float(), msg=key, **(tol or TOL))


def init_module(module: nn.Module) -> None:
    """Initialise one module's own parameters and buffers (what ``param_init_fn`` gets)."""
    if isinstance(module, ToyNet):
        with torch.no_grad():
            module.frozen.normal_()
            module.scale.fill_(1.5)
            module.offset.normal_()
    elif hasattr(module, "reset_parameters"):
        module.reset_parameters()


def meta_reference(seed: int = 0) -> dict[str, torch.Tensor]:
    """The spec for meta-device init: the unsharded model materialised with ``to_empty`` and
    initialised module by module in ``modules()`` order from the same seed."""
    with torch.device("meta"):
        model = ToyNet()
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    for module in model.modules():
        if list(module.parameters(recurse=False)) or list(module.buffers(recurse=False)):
            init_module(module)
    return model.state_dict()


_MESHES: dict[tuple[int, ...], Any] = {}


def mesh_of(shape: tuple[int, ...], device_type: str = "cpu") -> Any:
    """A DeviceMesh of ``shape`` (``(replicate, shard)`` names when 2-D) on ``device_type``, one
    per rank process: creating one creates process groups, a collective."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    key = (id(dist.group.WORLD), device_type, *shape)
    if key not in _MESHES:
        names = ("replicate", "shard") if len(shape) == 2 else None
        _MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _MESHES[key]


def fsdp2_kwargs(
    strategy: str,
    world_size: int,
    *,
    offload: bool = False,
    per_host: int | None = None,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """``fully_shard``'s arguments (FSDP2's) for an FSDP1 strategy name: FULL_SHARD is the
    default, SHARD_GRAD_OP keeps parameters after forward, NO_SHARD and HYBRID_SHARD are 2-D
    meshes (replicas x shards) with shards of 1 and ``per_host`` ranks; the mesh is on
    ``device``'s type when one is given (FSDP2 computes on its mesh's device)."""
    from shardkit.fsdp import CPUOffloadPolicy

    kwargs: dict[str, Any] = {"offload_policy": CPUOffloadPolicy()} if offload else {}
    shape: tuple[int, ...] | None = None
    if strategy == "SHARD_GRAD_OP":
        kwargs["reshard_after_forward"] = False
    elif strategy == "NO_SHARD":
        shape = (world_size, 1)
    elif strategy == "HYBRID_SHARD":
        per_host = per_host or world_size
        shape = (world_size // per_host, per_host)
    else:
        assert strategy == "FULL_SHARD", strategy
    device_type = "cpu" if device is None else torch.device(device).type
    if shape is not None or device_type != "cpu":
        kwargs["mesh"] = mesh_of(shape or (world_size,), device_type)
    return kwargs


def shard_blocks(model: nn.Module, **kwargs: Any) -> nn.Module:
    """FSDP2's usual layout: every block a unit, then the model (the root unit)."""
    from shardkit.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model
