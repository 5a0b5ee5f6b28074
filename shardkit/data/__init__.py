"""Data for shardkit's jobs: batches, global-batch iterators, UCI Adult, Criteo, synthetic, and
the user's own tables (CSV/TSV/Parquet with a schema).

Everything here is torch only (no NumPy, no pandas) and never downloads anything.
"""

from shardkit.data._adult import ADULT_PATH, AdultData, load_adult
from shardkit.data._batch import Batch
from shardkit.data._criteo import CriteoReader, read_criteo
from shardkit.data._criteo_format import CriteoConfig, CriteoFormat, IdMapping, Missing
from shardkit.data._global_batch import LastBatch
from shardkit.data._iterator import GlobalBatchIterator, epoch_order
from shardkit.data._synthetic import TERABYTE_NUM_EMBEDDINGS, SyntheticConfig, SyntheticDataset
from shardkit.data._table_fitted import FittedSchema
from shardkit.data._table_reader import TableReader
from shardkit.data._table_scan import TableData, scan_table
from shardkit.data._table_schema import ColumnSpec, ColumnType, TableSchema
from shardkit.data._table_schema_load import load_schema
from shardkit.data._tabular import MapDataset, TabularDataset, batch_from_ids

__all__ = [
    "ADULT_PATH",
    "TERABYTE_NUM_EMBEDDINGS",
    "AdultData",
    "Batch",
    "ColumnSpec",
    "ColumnType",
    "CriteoConfig",
    "CriteoFormat",
    "CriteoReader",
    "FittedSchema",
    "GlobalBatchIterator",
    "IdMapping",
    "LastBatch",
    "MapDataset",
    "Missing",
    "SyntheticConfig",
    "SyntheticDataset",
    "TableData",
    "TableReader",
    "TableSchema",
    "TabularDataset",
    "batch_from_ids",
    "epoch_order",
    "load_adult",
    "load_schema",
    "read_criteo",
    "scan_table",
]
