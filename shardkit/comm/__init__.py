"""Collectives that sharding and FSDP are built on: differentiable, asynchronous, checked.

Same on gloo and NCCL; where a backend lacks an operation (uneven all-gather/reduce-scatter,
reduce-scatter on other backends) a fallback built from supported operations gives the same result.
"""

from shardkit.comm._api import (
    all_gather_into_tensor,
    all_gather_sizes,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    reduce_scatter_tensor,
)
from shardkit.comm._autograd import Handle
from shardkit.comm._debug import CollectiveMismatchError, set_debug
from shardkit.comm._errors import CollectiveError
from shardkit.comm._exit import watch_torch_collectives
from shardkit.comm._label import label
from shardkit.comm._objects import all_gather_object, broadcast_object, group_device
from shardkit.comm._placement import PlacementError, collective_device, set_collective_device

__all__ = [
    "CollectiveError",
    "CollectiveMismatchError",
    "Handle",
    "PlacementError",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_sizes",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object",
    "collective_device",
    "group_device",
    "label",
    "reduce_scatter_tensor",
    "set_collective_device",
    "set_debug",
    "watch_torch_collectives",
]
