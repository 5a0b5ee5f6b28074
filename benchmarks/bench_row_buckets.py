"""Row bucketing of a row-wise input dist: the counting partition against bucketize + sort.

    python benchmarks/bench_row_buckets.py            # 20k ids (1024 bags of ~20), 1 thread

One feature's ids grouped by the shard that holds their row, as `_input_dist` does per
row-sharded feature per step (see [Note: row bucketing without a sort]), for 1-16 shards; both
paths are checked equal first. Prints the best of ``--reps`` calls of each (ms) and the ratio.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from shardkit.sharding import bucket_rows


def _bucket(lengths, values, starts, *, partition: bool):
    """`bucket_rows` forced down one path: ``(shard_lengths, rebased, order)``."""
    limit = len(starts) if partition else 0  # the most shards that take the partition
    out = bucket_rows(values, lengths=lengths, weights=None, row_starts=starts,
                      max_partition_shards=limit)  # fmt: skip
    return out[0], out[1], out[3]


def _best_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bags", type=int, default=1024)
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 3, 4, 8, 16])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    spread = args.ids_per_bag // 2
    lengths = torch.randint(
        args.ids_per_bag - spread, args.ids_per_bag + spread + 1, (args.bags,), generator=g
    )
    values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
    print(f"{values.numel()} ids in {args.bags} bags, {args.threads} thread(s)")
    print("shards  partition ms  sort ms  partition/sort")
    for shards in args.shards:
        starts = [args.rows * k // shards for k in range(shards)]
        part_fn = functools.partial(_bucket, lengths, values, starts, partition=True)
        sort_fn = functools.partial(_bucket, lengths, values, starts, partition=False)
        for got, want in zip(part_fn(), sort_fn()):
            torch.testing.assert_close(got, want)
        part, sort = _best_ms(part_fn, args.reps), _best_ms(sort_fn, args.reps)
        print(f"{shards:6d}  {part:12.3f}  {sort:7.3f}  {part / sort:14.2f}")


if __name__ == "__main__":
    main()
