"""Auto-wrap policies choose the units torch's do (no ranks needed: a stand-in wrapper records
what would be wrapped), manual wrapping, and the import paths of seed 004."""

from __future__ import annotations

import functools

import pytest
import torch.nn.functional as F
from torch import nn

from shardkit.fsdp.wrap import (
    ModuleWrapPolicy,
    always_wrap_policy,
    enable_wrap,
    lambda_auto_wrap_policy,
    recursive_wrap,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
    wrap,
)


class Net(nn.Module):
    """Seed 004's CNN."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(self.dropout1(x).flatten(1))))


class Wrapped(nn.Module):
    def __init__(self, module, path=""):
        super().__init__()
        self.module, self.path = module, path


def _units(model, policy):
    paths = []

    def wrap_fn(module, path):
        paths.append(path)
        return Wrapped(module, path)

    recursive_wrap(
        model,
        policy,
        wrap_fn,
        ignored_modules=frozenset(),
        ignored_params=frozenset(),
        only_wrap_children=True,
    )
    return paths


def test_size_based_policy_on_the_seed_model():
    # seed 004: with 20000 only fc1 (1.18 M) becomes a unit; conv2 has 18 496 parameters
    assert _units(Net(), functools.partial(size_based_auto_wrap_policy, min_num_params=20000)) == [
        "fc1"
    ]
    # with 100 every layer with parameters does
    assert _units(Net(), functools.partial(size_based_auto_wrap_policy, min_num_params=100)) == [
        "conv1",
        "conv2",
        "fc1",
        "fc2",
    ]


def test_size_based_policy_counts_what_children_left():
    model = nn.Sequential(nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10)), nn.Linear(2, 2))
    # each inner Linear (110) is a unit; their parent keeps 0 and is not; the small one stays
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    assert _units(model, policy) == ["0.0", "0.1"]
    # ModuleList / ModuleDict never become units, MultiheadAttention is not looked into
    layers = nn.ModuleList([nn.Linear(10, 10)])
    assert _units(nn.Sequential(layers), policy) == ["0.0"]
    # (its out_proj is not a unit of its own: the container holding it becomes the unit)
    attention = nn.Sequential(nn.Sequential(nn.MultiheadAttention(16, 2)))
    assert _units(attention, policy) == ["0"]


def test_class_and_lambda_policies():
    def model():
        return nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Sequential(nn.Linear(2, 2)))

    assert _units(model(), ModuleWrapPolicy({nn.Linear})) == ["0", "2.0"]
    assert repr(ModuleWrapPolicy({nn.Linear})) == "ModuleWrapPolicy({Linear})"
    transformer = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.ReLU})
    assert _units(model(), transformer) == ["1"]
    by_lambda = functools.partial(
        lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.Sequential)
    )
    assert _units(model(), by_lambda) == ["2"]
    assert _units(model(), always_wrap_policy) == ["0", "1", "2.0", "2"]


def test_enable_wrap_and_wrap():
    layer = nn.Linear(2, 2)
    assert wrap(layer) is layer  # outside enable_wrap: unchanged
    with enable_wrap(wrapper_cls=Wrapped, path="default"):
        assert wrap(layer).path == "default"
        assert wrap(layer, path="override").path == "override"
    assert wrap(layer) is layer


def test_seed_import_paths():
    from shardkit.fsdp import FullyShardedDataParallel
    from shardkit.fsdp.fully_sharded_data_parallel import (
        BackwardPrefetch,
        CPUOffload,
        MixedPrecision,
        ShardingStrategy,
    )
    from shardkit.fsdp.fully_sharded_data_parallel import (
        FullyShardedDataParallel as FromModule,
    )

    assert FromModule is FullyShardedDataParallel
    assert CPUOffload(offload_params=True).offload_params
    assert BackwardPrefetch.BACKWARD_PRE.name == "BACKWARD_PRE"
    assert MixedPrecision().param_dtype is None
    assert {s.name for s in ShardingStrategy} == {
        "FULL_SHARD",
        "SHARD_GRAD_OP",
        "NO_SHARD",
        "HYBRID_SHARD",
        "_HYBRID_SHARD_ZERO2",
    }


def test_custom_policy():
    from shardkit.fsdp.wrap import CustomPolicy

    def model():
        return nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Sequential(nn.Linear(2, 2)))

    policy = CustomPolicy(lambda m: {"forward_prefetch": True} if isinstance(m, nn.ReLU) else False)
    assert _units(model(), policy) == ["1"]
    assert policy.overrides(nn.ReLU()) == {"forward_prefetch": True}
    assert _units(model(), CustomPolicy(lambda m: isinstance(m, nn.Linear))) == ["0", "2.0"]
    bad = CustomPolicy(lambda m: "yes")
    with pytest.raises(
        ValueError,
        match=r"CustomPolicy's lambda_fn must return True, False or a dict of arguments, got 'yes' for Linear",
    ):
        _units(model(), bad)
