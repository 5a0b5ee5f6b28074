"""Training checkpoints: each rank writes its own shards, atomically; load into any sharding."""

from shardkit.checkpoint._api import load, read_extra, save
from shardkit.checkpoint._export import export_checkpoint, import_checkpoint
from shardkit.checkpoint._store import CheckpointError, latest, verify

__all__ = [
    "CheckpointError",
    "export_checkpoint",
    "import_checkpoint",
    "latest",
    "load",
    "read_extra",
    "save",
    "verify",
]
