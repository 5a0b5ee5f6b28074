"""Let torch's object collectives run without NumPy, for library code that uses them.

[Note: object collectives without NumPy]
torch.distributed's object collectives (``gather_object``, ``broadcast_object_list``, ...) turn
received bytes back into objects through ``tensor.numpy()``, so they fail where NumPy is not
installed, and shardkit requires only torch. shardkit's own code uses `broadcast_object` and
`all_gather_object` from `shardkit.comm`, which need no NumPy; torch code that shardkit calls
(torch.distributed.checkpoint) runs inside `object_collectives_without_numpy`, which swaps that
one conversion for a NumPy-free one while it runs. With NumPy installed it changes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed import distributed_c10d

__all__ = ["object_collectives_without_numpy"]

_lock = threading.Lock()


def _tensor_to_object(tensor: torch.Tensor, tensor_size: Any, group: Any) -> Any:
    data = tensor.cpu().contiguous()
    size = min(int(tensor_size), data.numel())
    return distributed_c10d._unpickler(io.BytesIO(ctypes.string_at(data.data_ptr(), size))).load()


@contextlib.contextmanager
def object_collectives_without_numpy() -> Iterator[None]:
    """See [Note: object collectives without NumPy]."""
    if importlib.util.find_spec("numpy") is not None:
        yield
        return
    with _lock:
        original = distributed_c10d._tensor_to_object
        distributed_c10d._tensor_to_object = _tensor_to_object
        try:
            yield
        finally:
            distributed_c10d._tensor_to_object = original
