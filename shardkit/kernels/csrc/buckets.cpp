// The row-wise input dist's row bucketing as one operator: `shardkit::bucket_rows`.
//
// [Note: compiled row bucketing]
// The eager spec is `shardkit.sharding._row_buckets` (a counting partition of a few tensor ops
// per shard, or a sort for many shards). This is the same stable partition in two passes over
// the ids: the first finds each id's shard (the number of later shards' first rows <= the id)
// and counts ids per (shard, bag); a running sum of the shards' totals gives each shard's
// first place; the second pass writes each id, rebased, at its shard's next place. Ids keep
// their bag-by-bag order within a shard, so the result equals the eager one exactly (tested).
// One thread: the input dist runs per feature, and its ids number in the tens of thousands.
// Registered as a fragment of the `shardkit` library so that ops_cpu.cpp stays as it is.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace shardkit {
namespace {

// The shard of `v`: how many of `later` (the shards' first rows after the first) are <= v.
inline int32_t shard_of(int64_t v, const std::vector<int64_t>& later) {
  if (later.size() <= 8) {
    int32_t s = 0;
    for (int64_t start : later) s += v >= start;
    return s;
  }
  return static_cast<int32_t>(std::upper_bound(later.begin(), later.end(), v) - later.begin());
}

// No negative length, and as many ids as the lengths say.
template <typename Length>
void check_lengths(const Length* lengths, int64_t num_bags, int64_t n) {
  int64_t total = 0;
  for (int64_t b = 0; b < num_bags; ++b) {
    TORCH_CHECK(lengths[b] >= 0, "bucket_rows: bag ", b, " has length ", lengths[b], " < 0");
    total += lengths[b];
  }
  TORCH_CHECK(total == n, "bucket_rows: the lengths sum to ", total, ", not ", n, " ids");
}

template <typename Length>
void count_pass(const int64_t* values, const Length* lengths, int64_t num_bags,
                const std::vector<int64_t>& later, int32_t* shard, int64_t* shard_lengths) {
  int64_t i = 0;
  for (int64_t b = 0; b < num_bags; ++b) {
    const int64_t end = i + static_cast<int64_t>(lengths[b]);
    for (; i < end; ++i) {
      const int32_t s = shard_of(values[i], later);
      shard[i] = s;
      ++shard_lengths[s * num_bags + b];
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bucket_rows_cpu(
    const at::Tensor& values, const at::Tensor& lengths, at::IntArrayRef row_starts) {
  TORCH_CHECK(values.scalar_type() == at::kLong && values.dim() == 1,
              "bucket_rows: values must be 1-D int64, got ", values.scalar_type(), " ",
              values.sizes());
  TORCH_CHECK(lengths.dim() == 1 &&
                  (lengths.scalar_type() == at::kLong || lengths.scalar_type() == at::kInt),
              "bucket_rows: lengths must be 1-D int64 or int32, got ", lengths.scalar_type());
  TORCH_CHECK(!row_starts.empty() && row_starts[0] == 0,
              "bucket_rows: row_starts must start at 0, got ", row_starts);
  for (size_t s = 1; s < row_starts.size(); ++s) {
    TORCH_CHECK(row_starts[s] >= row_starts[s - 1],
                "bucket_rows: row_starts must ascend (one first row per shard), got ", row_starts);
  }
  const at::Tensor vals = values.contiguous(), lens = lengths.contiguous();
  const int64_t n = vals.numel(), num_bags = lens.numel();
  const int64_t num_shards = static_cast<int64_t>(row_starts.size());
  const std::vector<int64_t> later(row_starts.begin() + 1, row_starts.end());
  const auto longs = vals.options();
  at::Tensor shard_lengths = at::zeros({num_shards, num_bags}, longs);
  at::Tensor rebased = at::empty({n}, longs), order = at::empty({n}, longs);
  std::vector<int32_t> shard(static_cast<size_t>(n));
  if (lens.scalar_type() == at::kLong) {
    const int64_t* l = lens.data_ptr<int64_t>();
    check_lengths(l, num_bags, n);
    count_pass(vals.data_ptr<int64_t>(), l, num_bags, later, shard.data(),
               shard_lengths.data_ptr<int64_t>());
  } else {
    const int32_t* l = lens.data_ptr<int32_t>();
    check_lengths(l, num_bags, n);
    count_pass(vals.data_ptr<int64_t>(), l, num_bags, later, shard.data(),
               shard_lengths.data_ptr<int64_t>());
  }
  std::vector<int64_t> place(static_cast<size_t>(num_shards), 0);  // next place per shard
  const int64_t* per = shard_lengths.data_ptr<int64_t>();
  int64_t start = 0;
  for (int64_t s = 0; s < num_shards; ++s) {
    place[s] = start;
    for (int64_t b = 0; b < num_bags; ++b) start += per[s * num_bags + b];
  }
  const int64_t* v = vals.data_ptr<int64_t>();
  int64_t* out_rows = rebased.data_ptr<int64_t>();
  int64_t* out_order = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = shard[i];
    const int64_t at = place[s]++;
    out_rows[at] = v[i] - row_starts[s];
    out_order[at] = i;
  }
  return {shard_lengths, rebased, order};
}

}  // namespace
}  // namespace shardkit

TORCH_LIBRARY_FRAGMENT(shardkit, m) {
  m.def("bucket_rows(Tensor values, Tensor lengths, int[] row_starts) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(shardkit, CPU, m) {
  m.impl("bucket_rows", &shardkit::bucket_rows_cpu);
}
