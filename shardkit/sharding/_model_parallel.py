"""`DistributedModelParallel`: shard a model's embedding collections, replicate the rest.

TorchRec's entry point (seeds 000-002). Given any module, it plans (or takes a plan), replaces
every embedding collection at any depth with its sharded version, materialises parameters left
on the meta device, moves the dense rest to the rank's device (as TorchRec's data-parallel
wrapper does) and wraps it in torch's DistributedDataParallel, whose averaged gradients match
the sharded tables' divided ones (see `ShardedEmbeddingBagCollection`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardkit import comm, launch
from shardkit.compat import resolve_device
from shardkit.kernels import steady_heap
from shardkit.optim import CombinedOptimizer
from shardkit.planner import EmbeddingShardingPlanner, Topology
from shardkit.sharding._data_parallel import DataParallelWrapper, wrap_data_parallel
from shardkit.sharding._device import resolve_device as device_of
from shardkit.sharding._sharding_plan import get_default_sharders
from shardkit.sharding._sharding_sharder import sharders_by_type, sharding_sharders
from shardkit.types import ModuleSharder, ShardingEnv, ShardingEnv2D, ShardingPlan

__all__ = ["DistributedModelParallel"]

logger = logging.getLogger(__name__)


class DistributedModelParallel(nn.Module):
    """Model parallelism for embedding tables, data parallelism for everything else.

    Args:
        module: the model, possibly on the meta device.
        env: the ranks (default: the world process group).
        device: where this rank computes (default: ``cuda:<current device>`` when the process
            group is NCCL, else the CPU; see [Note: default device]).
        plan: a `ShardingPlan`; default: planned collectively by `EmbeddingShardingPlanner`.
        sharders: which module types to shard (default: embedding bag and sequence collections).
        init_data_parallel: wrap the non-sharded parameters in DistributedDataParallel.
        init_parameters: materialise parameters still on the meta device and initialise them.
        data_parallel_wrapper: how to make the rest data-parallel (a `DataParallelWrapper`);
            default: torch's DistributedDataParallel with torch's default settings (pass
            `DefaultDataParallelWrapper()` for TorchRec's: static graph, bucket views), or
            `FullyShardDataParallelWrapper()` to shard the dense part with `fully_shard`.
        model_tracker_configs: TorchRec's tracking of updated ids; not in shardkit (None).
        local_world_size: ranks per host (default: what `shardkit.launch` knows, else all ranks
            on one host).
        gradient_division: scale sharded tables' gradients by 1 / world size (the DDP
            convention; TorchRec's default).
    """

    def __init__(
        self,
        module: nn.Module,
        env: ShardingEnv | None = None,
        device: torch.device | None = None,
        plan: ShardingPlan | None = None,
        sharders: Sequence[ModuleSharder] | None = None,
        init_data_parallel: bool = True,
        init_parameters: bool = True,
        data_parallel_wrapper: DataParallelWrapper | None = None,
        model_tracker_configs: Any = None,
        *,
        local_world_size: int | None = None,
        gradient_division: bool = True,
    ) -> None:
        super().__init__()
        _refuse_unsupported(env, model_tracker_configs)
        self._env = env or ShardingEnv.from_process_group(_world())
        self._data_parallel_wrapper = data_parallel_wrapper
        # cuda under `shardkit run` on a machine without one: see [Note: cuda on cpu]
        self.device = device_of(resolve_device(device), self._env)
        self._sharders = list(sharders) if sharders is not None else get_default_sharders()
        sharding_sharders(self._sharders, module=module)  # before planning, a collective
        self._local_world_size = local_world_size or _local_world_size(self._env.world_size)
        if plan is None:
            planner = EmbeddingShardingPlanner(
                topology=Topology(
                    world_size=self._env.world_size,
                    compute_device=self.device.type,
                    local_world_size=self._local_world_size,
                )
            )
            plan = planner.collective_plan(module, self._sharders, self._env.pg)
        _check_same_plan(plan, self._env)
        self.plan = plan
        self._sharded_paths: list[str] = []
        module = self._shard(module, gradient_division)
        if init_parameters:
            _materialize(module, self.device)
        module.to(self.device)  # the dense rest; the sharded collections are there already
        if self.device.type == "cpu":
            steady_heap()  # after the tables: see [Note: a steady heap] in shardkit.kernels
        self._dmp_wrapped_module = module
        if init_data_parallel:
            self.init_data_parallel()

    # -- construction --------------------------------------------------------------------

    def _shard(self, module: nn.Module, gradient_division: bool) -> nn.Module:
        by_type = sharders_by_type(self._sharders, module=module)
        targets = [
            (path, child, plan)
            for path, child in module.named_modules()
            if type(child) in by_type and (plan := self.plan.get_plan_for_module(path)) is not None
        ]
        for path, child, plan in targets:
            sharder = by_type[type(child)]
            sharded = sharder.shard(
                child,
                plan,
                self._env,
                self.device,
                path,
                local_world_size=self._local_world_size,
                gradient_division=gradient_division,
            )
            self._sharded_paths.append(path)
            if path == "":
                return sharded
            parent, _, name = path.rpartition(".")
            setattr(module.get_submodule(parent), name, sharded)
        logger.info(
            "sharded %d module(s): %s", len(targets), [p or "<root>" for p, _, _ in targets]
        )
        return module

    def sharded_parameter_names(self) -> list[str]:
        """Names (in the wrapped module) of this rank's table shards, and of its replicas of
        data-parallel tables with the FUSED kernel (whose replicas keep themselves equal)."""
        module = self.module
        return [
            f"{path}.{name}" if path else name
            for path in self._sharded_paths
            for name, param in module.get_submodule(path).named_parameters()
            if ".shards." in name or getattr(param, "_shardkit_replica", False)
        ]

    def init_data_parallel(self) -> None:
        """Wrap the unsharded parameters in data parallelism (once; TorchRec's lazy init)."""
        if isinstance(self._dmp_wrapped_module, DistributedDataParallel):
            return
        if self._data_parallel_wrapper is not None:
            self._data_parallel_wrapper.wrap(self, self._env, self.device)
            return
        # each rank's own state (managed-collision remappers): DDP must not broadcast rank 0's
        own = [
            f"{path}.{name}" if path else name
            for path in self._sharded_paths
            for name, _ in self.module.get_submodule(path).named_buffers()
        ]
        self._dmp_wrapped_module = wrap_data_parallel(
            self._dmp_wrapped_module, self._env, self.device, self.sharded_parameter_names() + own
        )

    # -- the model's interface -----------------------------------------------------------

    @property
    def module(self) -> nn.Module:
        """The model itself, with its sharded collections (not the DDP wrapper)."""
        wrapped = self._dmp_wrapped_module
        return wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped

    @property
    def fused_optimizer(self) -> CombinedOptimizer:
        """The optimizers fused into the sharded tables' backward, keyed by module path."""
        fused = []
        for path in self._sharded_paths:
            optimizer = getattr(self.module.get_submodule(path), "fused_optimizer", None)
            if optimizer is not None:
                fused.append((path, optimizer))
        return CombinedOptimizer(fused)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._dmp_wrapped_module(*args, **kwargs)

    # ignore[override]: *args and **kwargs forward torch's overloads, which mypy cannot match
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        return self.module.named_buffers(prefix, recurse, remove_duplicate)


def _refuse_unsupported(env: ShardingEnv | None, model_tracker_configs: Any) -> None:
    if isinstance(env, ShardingEnv2D):
        raise ValueError(
            "DistributedModelParallel got a ShardingEnv2D: 2D parallelism (sharding groups "
            "replicated across replica groups, TorchRec's DMPCollection) is not in shardkit; "
            "shard over all ranks with ShardingEnv.from_process_group"
        )
    if model_tracker_configs is not None:
        raise ValueError(
            "DistributedModelParallel(model_tracker_configs=...): tracking updated ids is not "
            "in shardkit; leave it None"
        )


def _world() -> dist.ProcessGroup:
    if not dist.is_initialized():
        raise RuntimeError(
            "DistributedModelParallel needs a process group: start ranks with "
            "shardkit.launch.spawn (or init_from_env under torchrun), or call "
            "torch.distributed.init_process_group() first, even for one rank"
        )
    world = dist.group.WORLD
    assert world is not None, "initialised: checked above"
    return world


def _local_world_size(world_size: int) -> int:
    return launch.current().local_world_size if launch.is_initialized() else world_size


def _check_same_plan(plan: ShardingPlan, env: ShardingEnv) -> None:
    """Every rank must hold the same valid plan (plans are mutable: a user may have edited one);
    name the ranks whose plan differs, or the first inconsistent table, on every rank."""
    problem = None
    try:
        plan.validate()
        digest = hashlib.sha256(plan.to_json().encode()).hexdigest()[:16]
    except (TypeError, ValueError) as error:
        problem, digest = (type(error).__name__, str(error)), ""
    if env.world_size == 1:
        reports = [(digest, problem)]
    else:  # agree first, so that a plan wrong on one rank fails every rank, none waits
        reports = comm.all_gather_object((digest, problem), group=env.pg)
    for rank, (_, rank_problem) in enumerate(reports):
        if rank_problem is not None:
            kind, message = rank_problem
            where = "" if env.world_size == 1 else f"rank {rank}'s plan: "
            raise (TypeError if kind == "TypeError" else ValueError)(where + message)
    digests = [d for d, _ in reports]
    if len(set(digests)) > 1:
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ValueError(
            f"ranks hold different sharding plans: rank(s) {odd} differ from rank 0. Every rank "
            "must shard with the same plan; plan with EmbeddingShardingPlanner.collective_plan "
            "(plans on rank 0 and broadcasts), or build the same plan on every rank"
        )


def _materialize(module: nn.Module, device: torch.device) -> None:
    """Give memory to parameters and buffers left on the meta device, and initialise them."""
    for name, child in module.named_modules():
        tensors = list(child.parameters(recurse=False)) + list(child.buffers(recurse=False))
        if not any(t.device.type == "meta" for t in tensors):
            continue
        child.to_empty(device=device, recurse=False)
        if hasattr(child, "reset_parameters"):
            child.reset_parameters()
        else:
            logger.warning(
                "%s was on the meta device and has no reset_parameters(): left empty", name
            )
