"""The composable API (``torchrec.distributed.shard``): shard one collection (`shard`) or every
collection of a model (`shard_modules`) in place of `DistributedModelParallel`, leaving the rest
of the model as it is (no data parallelism: wrap the dense part yourself)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from shardkit.compat import resolve_device
from shardkit.launch import local_world_size
from shardkit.planner import EmbeddingShardingPlanner, Topology
from shardkit.sharding._model_parallel import _materialize
from shardkit.sharding._sharding_plan import get_default_sharders
from shardkit.sharding._sharding_sharder import sharders_by_type, sharding_sharders
from shardkit.types import ModuleSharder, ParameterSharding, ShardingEnv, ShardingPlan

__all__ = ["shard", "shard_modules"]

logger = logging.getLogger(__name__)

Generator = Callable[..., ParameterSharding]


def _env_and_device(
    env: ShardingEnv | None, device: torch.device | str | None
) -> tuple[ShardingEnv, torch.device]:
    if env is None:
        if not dist.is_initialized():
            raise RuntimeError(
                "shard()/shard_modules() need a process group (or env=ShardingEnv...): start "
                "ranks with shardkit.launch.spawn, or call torch.distributed.init_process_group"
            )
        world = dist.group.WORLD
        assert world is not None, "initialised: checked above"
        env = ShardingEnv.from_process_group(world)
    if device is None:
        device = torch.device(torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return env, torch.device(resolve_device(device))


def shard(
    module: nn.Module,
    plan: Mapping[str, ParameterSharding | Generator] | Generator,
    env: ShardingEnv | None = None,
    device: torch.device | str | None = None,
    sharder: ModuleSharder | None = None,
) -> nn.Module:
    """The sharded version of ``module`` (an embedding collection) for ``plan``: its module
    plan (table -> `ParameterSharding`), table -> generator (``row_wise()``...), or one
    generator for every table.

    Example::

        sharded = shard(ebc, row_wise())        # a ShardedEmbeddingBagCollection
    """
    sharder = sharder or {s.module_type: s for s in get_default_sharders()}.get(type(module))
    if sharder is None:
        raise TypeError(
            f"no sharder for {type(module).__name__}; shard() takes an EmbeddingBagCollection "
            "or EmbeddingCollection, or pass sharder="
        )
    (checked,) = sharding_sharders([sharder])
    env, device = _env_and_device(env, device)
    tables = sharder.shardable_parameters(module)
    generators = {name: plan for name in tables} if callable(plan) else dict(plan)
    unknown = sorted(set(generators) - set(tables))
    if unknown:
        raise ValueError(
            f"plan names tables {unknown} that the module lacks; its tables are {sorted(tables)}"
        )
    local = local_world_size(env.world_size)
    module_plan = {
        name: g if isinstance(g, ParameterSharding)
        else g(tables[name], local, env.world_size, device.type, sharder)
        for name, g in generators.items()
    }  # fmt: skip
    return checked.shard(module, module_plan, env, device, local_world_size=local)


def shard_modules(
    module: nn.Module,
    env: ShardingEnv | None = None,
    device: torch.device | str | None = None,
    plan: ShardingPlan | None = None,
    sharders: Sequence[ModuleSharder] | None = None,
    init_params: bool = False,
) -> nn.Module:
    """``module`` with every collection a sharder handles replaced by its sharded version
    (planned collectively when ``plan`` is None); with ``init_params``, parameters left on
    the meta device are materialised on ``device``."""
    env, device = _env_and_device(env, device)
    sharders = list(sharders) if sharders is not None else get_default_sharders()
    by_type = sharders_by_type(sharders, module=module)
    local = local_world_size(env.world_size)
    if plan is None:
        topology = Topology(world_size=env.world_size, compute_device=device.type,
                            local_world_size=local)  # fmt: skip
        planner = EmbeddingShardingPlanner(topology=topology)
        plan = (
            planner.collective_plan(module, sharders, env.pg)
            if env.pg is not None
            else planner.plan(module, sharders)
        )
    root_plan = plan.get_plan_for_module("")
    if type(module) in by_type and root_plan is not None:  # no plan: not sharded, as a child
        return by_type[type(module)].shard(
            module, root_plan, env, device, "", local_world_size=local
        )
    _replace(module, "", by_type, plan, env, device, local)
    if init_params and device.type != "meta":
        _materialize(module, device)
        module = module.to(device)
    return module


def _replace(model, path, by_type, plan, env, device, local) -> None:
    for name, child in model.named_children():
        child_path = f"{path}.{name}" if path else name
        sharder = by_type.get(type(child))
        if sharder is None:
            _replace(child, child_path, by_type, plan, env, device, local)
            continue
        module_plan = plan.get_plan_for_module(child_path)
        if module_plan is not None:
            sharded = sharder.shard(child, module_plan, env, device, child_path,
                                    local_world_size=local)  # fmt: skip
            model.register_module(name, sharded)
            logger.info("sharded %s", child_path)
