"""The sharded collections' exchanges, by concern, in the order a batch meets them:

- `_source`: this rank's KJT, checked and split per feature, ready to send;
- `_input`: the input dist (ids to the shards' ranks), [Note: input exchange]; `_header` its
  header (sizes, the ranks' status and tag), `_unpack` what a rank receives, `_row_buckets`
  the row-wise bucketing of ids by shard;
- `_output`: the output dist (looked-up rows back), `_qcomm` its compressed codecs,
  `_sequence` the sequence collections' output, `_assemble` the pooled output in one pass.
"""
