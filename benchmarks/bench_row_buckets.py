"""Row bucketing of a row-wise input dist: compiled, the counting partition, bucketize + sort.

    python benchmarks/bench_row_buckets.py            # 20k ids (1024 bags of ~20), 1 thread

One feature's ids grouped by the shard that holds their row, as `sharding._dist._input` does per
row-sharded feature per step (see [Note: row bucketing without a sort]), for 1-16 shards: the
compiled operator ([Note: compiled row bucketing]; "n/a" where it does not build) and the two
eager paths, all checked equal first. Prints the best of ``--reps`` calls of each (ms) and the
ratios to the sort.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from shardkit import kernels
from shardkit.bench import machine_line
from shardkit.sharding import bucket_rows

PATHS = ("compiled", "partition", "sort")


def _bucket(lengths, values, starts, *, path: str):
    """`bucket_rows` forced down one path: ``(shard_lengths, rebased, order)``."""
    limit = len(starts) if path == "partition" else 0  # the most shards that take the partition
    kernel = "compiled" if path == "compiled" else "eager"
    out = bucket_rows(values, lengths=lengths, weights=None, row_starts=starts,
                      max_partition_shards=limit, kernel=kernel)  # fmt: skip
    return out[0], out[1], out[3]


def _compiled_builds() -> bool:
    try:
        with kernels.use_kernel("compiled"):
            return True
    except RuntimeError as error:
        print(f"the compiled kernel is unavailable: {error}")
        return False


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
    print(f"Machine: {machine_line()}")
    print(f"{values.numel()} ids in {args.bags} bags, {args.threads} thread(s)")
    paths = PATHS if _compiled_builds() else PATHS[1:]
    print("shards  compiled ms  partition ms  sort ms  compiled/sort  partition/sort")
    for shards in args.shards:
        starts = [args.rows * k // shards for k in range(shards)]
        fns = {p: functools.partial(_bucket, lengths, values, starts, path=p) for p in paths}
        want = fns["sort"]()
        for path in paths:
            for got, expected in zip(fns[path](), want):
                torch.testing.assert_close(got, expected)
        ms = {path: _best_ms(fn, args.reps) for path, fn in fns.items()}
        compiled = ms.get("compiled", float("nan"))
        print(
            f"{shards:6d}  {compiled:11.3f}  {ms['partition']:12.3f}  {ms['sort']:7.3f}  "
            f"{compiled / ms['sort']:13.2f}  {ms['partition'] / ms['sort']:14.2f}"
        )


if __name__ == "__main__":
    main()
