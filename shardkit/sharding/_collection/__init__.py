"""The sharded embedding collections, by concern:

- `_base`: `ShardedCollection`, what the bag and sequence collections share (layout, shards,
  replicas, the fused optimizer, ``input_dist``); `_embeddingbag` and `_embedding` its two
  kinds (their ``compute_and_output_dist``);
- `_build`: building it (table keys, initialisers, the data-parallel replica, the fused
  optimizer); `_shard_groups` the kernel groups of a rank's shards, `_replicas` the
  data-parallel tables with a fused optimizer, `_grad` the gradient division;
- `_state`: sharded state dicts ([Note: sharded state dicts]) and the fused optimizer's state;
  `_state_hooks` the module's state-dict hooks.
"""
