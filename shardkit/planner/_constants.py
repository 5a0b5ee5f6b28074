"""The planner's defaults. Capacities, bandwidths and batch size are TorchRec's (1.8), so plans
made with default arguments compare with TorchRec's; the rest say where they come from.

Bandwidths are in bytes per millisecond, so every cost the planner prints is in milliseconds.
"""

from __future__ import annotations

__all__ = [
    "BATCHED_COPY_PERF_FACTOR",
    "BATCH_SIZE",
    "BIGINT_DTYPE",
    "BWD_COMPUTE_MULTIPLIER",
    "CROSS_NODE_BANDWIDTH",
    "DDR_CAP",
    "DDR_MEM_BW",
    "DENSE_KERNEL_BW_FACTOR",
    "DENSE_PARAMETER_MULTIPLIER",
    "DENSE_UPDATE_PERF_FACTOR",
    "HBM_CAP",
    "HBM_MEM_BW",
    "HBM_TO_DDR_MEM_BW",
    "INTRA_NODE_BANDWIDTH",
    "KJT_BUFFER_COPIES",
    "MIN_CW_DIM",
    "NUM_POOLINGS",
    "OPTIMIZER_STATE_DTYPE_SIZE",
    "PER_SAMPLE_WEIGHT_DTYPE",
    "POOLING_FACTOR",
    "SSD_MEM_BW",
    "STORAGE_RESERVE_PERCENTAGE",
    "WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER",
]

_GIB = 1024**3

# Memory per rank (TorchRec's defaults: a 32 GB GPU, 128 GB of host memory per rank).
HBM_CAP: int = 32 * _GIB
DDR_CAP: int = 128 * _GIB

# Bandwidths, bytes/ms (TorchRec's defaults: NVLink-class inside a host, 100 Gb/s between hosts;
# HBM of a V100/A100-class GPU; DDR4 of a server socket).
INTRA_NODE_BANDWIDTH: float = 600 * _GIB / 1000
CROSS_NODE_BANDWIDTH: float = 12.5 * _GIB / 1000
HBM_MEM_BW: float = 897 * _GIB / 1000
DDR_MEM_BW: float = 51 * _GIB / 1000
# TorchRec's SSD and HBM<->DDR (UVM) bandwidths; shardkit has neither kind of table.
SSD_MEM_BW: float = 100 * 1024**2 / 1000
HBM_TO_DDR_MEM_BW: float = 32 * _GIB / 1000

# Per-rank batch size and input statistics when the constraints give none (TorchRec's).
BATCH_SIZE: int = 512
POOLING_FACTOR: float = 1.0
NUM_POOLINGS: float = 1.0

# Ids travel as int64 (the kernel converts int32 anyway); per-sample weights as float32.
BIGINT_DTYPE: int = 8
PER_SAMPLE_WEIGHT_DTYPE: int = 4
# Optimizer state is kept in float32 whatever the table's dtype (shardkit.optim does so).
OPTIMIZER_STATE_DTYPE_SIZE: int = 4

# Column-wise shards are at least this wide unless `ParameterConstraints.min_partition` says
# otherwise. TorchRec 1.8 uses 128 (FBGEMM's full thread block); shardkit's kernel is plain torch
# with no block size, and 32 keeps shards wide enough to amortise their per-lookup overhead. It
# is also what TorchRec used when the seed tutorial's plans (64 columns -> 2 x 32) were printed.
MIN_CW_DIM: int = 32

# Backward reads and writes about twice what forward reads (TorchRec's empirical factor);
# weighted features add no extra backward work in TorchRec's model.
BWD_COMPUTE_MULTIPLIER: float = 2.0
WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER: float = 1.0
# The DENSE kernel (autograd through a plain lookup, then a dense optimizer step) runs at about
# half the bandwidth of the FUSED one (TorchRec's kernel bandwidth table).
DENSE_KERNEL_BW_FACTOR: float = 0.5
# Row-wise backward copies the gathered output gradient into per-rank buffers (TorchRec's
# empirical factor, in multiples of the output gradient's bytes over the memory bandwidth).
BATCHED_COPY_PERF_FACTOR: float = 2.455
# A data-parallel table's backward runs element-wise kernels over the whole table (zeroing,
# scaling, the optimizer step): TorchRec's empirical factor, in passes over the table's bytes.
DENSE_UPDATE_PERF_FACTOR: float = 9.22

# Storage reservation (TorchRec's HeuristicalStorageReservation): a safety margin of each
# rank's memory, the dense part of the model at 6x its parameter bytes (parameters, optimizer
# state ~2x, gradients and DDP buckets ~3x), and input KJTs at 20 copies (2 pipelined batches
# x 10 internal copies).
STORAGE_RESERVE_PERCENTAGE: float = 0.15
DENSE_PARAMETER_MULTIPLIER: float = 6.0
KJT_BUFFER_COPIES: int = 20
