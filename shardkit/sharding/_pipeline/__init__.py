"""The train pipelines (TorchRec's ``TrainPipelineSparseDist`` and its family), by concern:

- `_train`: the pipelines themselves (fetch, step, detach/attach), [Note: pipelined input dist];
- `_agreement`: the ranks agree on data every batch ([Note: deferred agreement]);
- `_feeds`: which KJT of a batch feeds which sharded collection, the prefetch mask and the
  fallback for prefetches no forward uses;
- `_schedule`: whether to overlap, and on which streams;
- `_context`: TorchRec's per-batch context and compile settings;
- `_variants`: TorchRec's other pipelines on top (eval, staged, PT2, gradient accumulation).
"""
