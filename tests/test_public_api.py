"""The public surface of each package is pinned: adding or removing a name is a decision."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PUBLIC = {
    "shardkit.launch": [
        "RankFailedError",
        "RankInfo",
        "RankPool",
        "RendezvousTimeoutError",
        "current",
        "init_from_env",
        "is_initialized",
        "select_backend_and_device",
        "shutdown",
        "spawn",
    ],
    "shardkit.comm": [
        "CollectiveError",
        "CollectiveMismatchError",
        "Handle",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_sizes",
        "all_reduce",
        "all_to_all_single",
        "barrier",
        "broadcast",
        "broadcast_object",
        "reduce_scatter_tensor",
        "set_debug",
    ],
    "shardkit.fsdp": [
        "BackwardPrefetch",
        "CPUOffload",
        "FSDPModule",
        "FullStateDictConfig",
        "FullyShardedDataParallel",
        "MixedPrecision",
        "PrefetchPolicy",
        "ShardedStateDictConfig",
        "ShardingStrategy",
        "StateDictType",
        "fully_shard",
        "optim_state_dict",
        "optim_state_dict_to_load",
        "state_dict_type",
        "summon_full_params",
    ],
    "shardkit.fsdp.fully_sharded_data_parallel": [
        "BackwardPrefetch",
        "CPUOffload",
        "FullStateDictConfig",
        "FullyShardedDataParallel",
        "MixedPrecision",
        "ShardedStateDictConfig",
        "ShardingStrategy",
        "StateDictType",
    ],
    "shardkit.fsdp.wrap": [
        "ModuleWrapPolicy",
        "always_wrap_policy",
        "enable_wrap",
        "lambda_auto_wrap_policy",
        "size_based_auto_wrap_policy",
        "transformer_auto_wrap_policy",
        "wrap",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_pinned(module):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is in __all__ but missing"


def test_import_has_no_side_effects():
    code = (
        "import logging, torch.distributed as dist, shardkit, shardkit.launch, shardkit.comm,"
        " shardkit.fsdp;"
        "assert not dist.is_initialized();"
        "assert logging.getLogger().handlers == [];"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
