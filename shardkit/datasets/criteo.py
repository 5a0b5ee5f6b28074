"""Criteo's click logs (``torchrec.datasets.criteo``): its columns, its TSV files read row by
row, its ``.npy`` form (`BinaryCriteoUtils`) and batches from that (`InMemoryBinaryCriteoIterDataPipe`).

Local files only (TorchRec opens remote ones through iopath, which shardkit does not use); NumPy
for the ``.npy`` files, as TorchRec. shardkit's own streaming reader of raw Criteo files, with
bounded memory and resumable positions, is `shardkit.data.CriteoReader`.
"""

from shardkit.datasets._criteo_binary import BinaryCriteoUtils
from shardkit.datasets._criteo_memory import InMemoryBinaryCriteoIterDataPipe
from shardkit.datasets._criteo_rows import (
    CAT_FEATURE_COUNT,
    COLUMN_TYPE_CASTERS,
    DAYS,
    DEFAULT_CAT_NAMES,
    DEFAULT_COLUMN_NAMES,
    DEFAULT_INT_NAMES,
    DEFAULT_LABEL_NAME,
    FREQUENCY_THRESHOLD,
    INT_FEATURE_COUNT,
    TOTAL_TRAINING_SAMPLES,
    CriteoIterDataPipe,
    criteo_kaggle,
    criteo_terabyte,
)

__all__ = [
    "CAT_FEATURE_COUNT",
    "COLUMN_TYPE_CASTERS",
    "DAYS",
    "DEFAULT_CAT_NAMES",
    "DEFAULT_COLUMN_NAMES",
    "DEFAULT_INT_NAMES",
    "DEFAULT_LABEL_NAME",
    "FREQUENCY_THRESHOLD",
    "INT_FEATURE_COUNT",
    "TOTAL_TRAINING_SAMPLES",
    "BinaryCriteoUtils",
    "CriteoIterDataPipe",
    "InMemoryBinaryCriteoIterDataPipe",
    "criteo_kaggle",
    "criteo_terabyte",
]
