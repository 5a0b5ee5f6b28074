"""TorchRec's import path: ``from shardkit.sparse.jagged_tensor import KeyedJaggedTensor``."""

from shardkit.sparse._jagged import JaggedTensor
from shardkit.sparse._keyed import KeyedTensor
from shardkit.sparse._kjt import KeyedJaggedTensor
from shardkit.sparse._sparse_utils import (
    ComputeJTDictToKJT,
    ComputeKJTToJTDict,
    JaggedTensorMeta,
    flatten_kjt_list,
    jt_is_equal,
    kjt_is_equal,
    permute_multi_embedding,
    regroup_kts,
    unflatten_kjt_list,
)

__all__ = [
    "ComputeJTDictToKJT",
    "ComputeKJTToJTDict",
    "JaggedTensor",
    "JaggedTensorMeta",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "flatten_kjt_list",
    "jt_is_equal",
    "kjt_is_equal",
    "permute_multi_embedding",
    "regroup_kts",
    "unflatten_kjt_list",
]
