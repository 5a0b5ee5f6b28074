"""TorchRec's import paths (``torchrec.distributed.*``) for shardkit's classes.

Code written for TorchRec runs after ``torchrec`` -> ``shardkit`` in its imports. Each module
here only re-exports; the code lives in ``shardkit.planner`` and ``shardkit.sharding``. This
package itself imports nothing, so ``import shardkit.distributed.types`` stays light.
"""

__all__: list[str] = []
