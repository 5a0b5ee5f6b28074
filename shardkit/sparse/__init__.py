"""Sparse features and pooled outputs: `JaggedTensor`, `KeyedJaggedTensor`, `KeyedTensor`.

TorchRec's data structures with TorchRec's names and semantics (code written for
``torchrec.sparse.jagged_tensor`` runs against ``shardkit.sparse.jagged_tensor``), in plain
PyTorch: no FBGEMM, no Python loop over the batch, metadata cached after one device->host sync.
Constructors check only what is free; ``validate()`` checks the data. All three are pytree
nodes, so they pass into and out of `torch.compile` and `torch.export` (see [Note: sparse
pytrees] in `_pytree`).
"""

from shardkit.sparse._jagged import JaggedTensor
from shardkit.sparse._keyed import KeyedTensor
from shardkit.sparse._kjt import KeyedJaggedTensor
from shardkit.sparse._pytree import register_sparse_pytrees

register_sparse_pytrees()  # see [Note: sparse pytrees]

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"]
