"""TorchRec's import path: ``from shardkit.sparse.jagged_tensor import KeyedJaggedTensor``."""

from shardkit.sparse._jagged import JaggedTensor
from shardkit.sparse._keyed import KeyedTensor
from shardkit.sparse._kjt import KeyedJaggedTensor

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"]
