"""TorchRec's data sets at TorchRec's paths (``torchrec.datasets.*``): random batches, Criteo's
click logs and MovieLens ratings from local files, and the pipes they are built of.

shardkit's own readers for its training job live in `shardkit.data`; `shardkit.datasets.utils.Batch`
is `shardkit.data.Batch` with TorchRec's integer labels allowed.
"""

from shardkit.datasets import criteo, movielens, random, utils  # noqa: F401 (as torchrec.datasets)

__all__: list[str] = []
