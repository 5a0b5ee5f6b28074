"""The few FBGEMM names TorchRec programs import, at FBGEMM's paths under ``shardkit.fbgemm_gpu``
(the README's import rewrite maps ``fbgemm_gpu`` to ``shardkit.fbgemm_gpu``).

shardkit has no FBGEMM: its enums are here as values that work where shardkit takes them
(`EmbOptimType` picks the fused optimizer; `PoolingMode`, `SparseType` name what TorchRec's configs
name), and FBGEMM's kernels are refused by name with what to use instead.
"""

__all__: list[str] = []
