// The row-wise input dist's row bucketing as one operator, `shardkit::bucket_rows`, and the ids'
// shift to rows of a stack of tables, `shardkit::shift_ids`.
//
// [Note: compiled row bucketing]
// The eager spec is `shardkit.sharding._row_buckets` (a counting partition of a few tensor ops
// per shard, or a sort for many shards). This is the same stable partition in two passes over
// the ids: the first finds each id's shard (the number of later shards' first rows <= the id)
// and counts ids per (shard, bag); a running sum of the shards' totals gives each shard's
// first place; the second pass finds each id's shard again and writes the id, rebased, at its
// shard's next place (see [Note: two passes, no shard per id]). Ids keep
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

// The shard of an id: how many of the shards' first rows after the first are <= it. Up to 8
// shards a branch-free count over starts held in the object; beyond, a binary search.
struct FewShards {
  int64_t later[7];
  int count;
  int32_t operator()(int64_t v) const {
    int32_t s = 0;
    for (int k = 0; k < count; ++k) s += v >= later[k];
    return s;
  }
};
struct ManyShards {
  const std::vector<int64_t>& later;
  int32_t operator()(int64_t v) const {
    return static_cast<int32_t>(std::upper_bound(later.begin(), later.end(), v) - later.begin());
  }
};

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

// [Note: two passes, no shard per id]
// The first pass counts each bag's ids per shard in a small array and writes the bag's
// column of `shard_lengths` (every entry: the tensor needs no zeroing); the second finds each
// id's shard again (a few compares) rather than reading it from an [n] buffer the first pass
// wrote: that buffer's allocation, zeroing, writes and reads cost more than the compares.
// Measured on a Zen 3 EPYC (AVX2), 20k ids in 1,024 bags, 2 shards, one thread, process CPU
// time, loaded machine, old and new in alternate processes: 154-180 -> 111-116 us a call
// (benchmarks/results/dmp_rowwise_sgd_zen3.md).
template <typename Length, typename ShardOf>
void partition(const int64_t* v, const Length* lengths, int64_t num_bags, int64_t n,
               at::IntArrayRef row_starts, ShardOf shard_of, int64_t* per, int64_t* out_rows,
               int64_t* out_order) {
  const int64_t num_shards = static_cast<int64_t>(row_starts.size());
  std::vector<int64_t> count(static_cast<size_t>(num_shards));
  int64_t i = 0;
  for (int64_t b = 0; b < num_bags; ++b) {
    std::fill(count.begin(), count.end(), int64_t{0});
    for (const int64_t end = i + static_cast<int64_t>(lengths[b]); i < end; ++i)
      ++count[shard_of(v[i])];
    for (int64_t s = 0; s < num_shards; ++s) per[s * num_bags + b] = count[s];
  }
  std::vector<int64_t>& place = count;  // next place per shard
  int64_t start = 0;
  for (int64_t s = 0; s < num_shards; ++s) {
    place[s] = start;
    for (int64_t b = 0; b < num_bags; ++b) start += per[s * num_bags + b];
  }
  for (int64_t k = 0; k < n; ++k) {
    const int32_t s = shard_of(v[k]);
    const int64_t at = place[s]++;
    out_rows[at] = v[k] - row_starts[s];
    out_order[at] = k;
  }
}

template <typename Length>
void partition_any(const int64_t* v, const Length* lengths, int64_t num_bags, int64_t n,
                   at::IntArrayRef row_starts, int64_t* per, int64_t* out_rows, int64_t* out_order) {
  check_lengths(lengths, num_bags, n);
  const std::vector<int64_t> later(row_starts.begin() + 1, row_starts.end());
  if (later.size() <= 7) {
    FewShards few{{}, static_cast<int>(later.size())};
    std::copy(later.begin(), later.end(), few.later);
    partition(v, lengths, num_bags, n, row_starts, few, per, out_rows, out_order);
  } else {
    partition(v, lengths, num_bags, n, row_starts, ManyShards{later}, per, out_rows, out_order);
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
  const auto longs = vals.options();
  // every entry written by the first pass (zeros: no bag to write a column for)
  at::Tensor shard_lengths = num_bags ? at::empty({num_shards, num_bags}, longs)
                                      : at::zeros({num_shards, num_bags}, longs);
  at::Tensor rebased = at::empty({n}, longs), order = at::empty({n}, longs);
  int64_t* per = shard_lengths.data_ptr<int64_t>();
  const int64_t* v = vals.data_ptr<int64_t>();
  int64_t* out_rows = rebased.data_ptr<int64_t>();
  int64_t* out_order = order.data_ptr<int64_t>();
  if (lens.scalar_type() == at::kLong)
    partition_any(v, lens.data_ptr<int64_t>(), num_bags, n, row_starts, per, out_rows, out_order);
  else
    partition_any(v, lens.data_ptr<int32_t>(), num_bags, n, row_starts, per, out_rows, out_order);
  return {shard_lengths, rebased, order};
}

// [Note: the ids' shift in one pass]
// The batched kernel looks rows up in a stack of tables, so each table's ids are shifted by the
// table's first row in the stack (`shardkit.modules.kernel_input`, the eager spec: per
// segment, a slice and an add into a new int64 tensor; 16 segments in a row-wise step of 8
// tables on 2 ranks, three torch calls each). This does it as one pass over the ids.
template <typename Id>
void shift_segments(const Id* ids, int64_t n, at::IntArrayRef bases, at::IntArrayRef counts,
                    int64_t* out) {
  int64_t start = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    const int64_t base = bases[k], end = start + counts[k];
    for (int64_t i = start; i < end; ++i) out[i] = static_cast<int64_t>(ids[i]) + base;
    start = end;
  }
  for (int64_t i = start; i < n; ++i) out[i] = static_cast<int64_t>(ids[i]);  // past the segments
}

at::Tensor shift_ids_cpu(const at::Tensor& ids, at::IntArrayRef bases, at::IntArrayRef counts) {
  TORCH_CHECK(ids.dim() == 1 && (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt),
              "shift_ids: ids must be 1-D int64 or int32, got ", ids.scalar_type(), " ",
              ids.sizes());
  TORCH_CHECK(bases.size() == counts.size(), "shift_ids: one base per segment: ", bases.size(),
              " bases for ", counts.size(), " segments");
  int64_t total = 0;
  for (int64_t c : counts) {
    TORCH_CHECK(c >= 0, "shift_ids: a segment of ", c, " ids");
    total += c;
  }
  TORCH_CHECK(total <= ids.numel(), "shift_ids: the segments hold ", total, " ids, more than the ",
              ids.numel(), " given");
  const at::Tensor in = ids.contiguous();
  at::Tensor out = at::empty({in.numel()}, in.options().dtype(at::kLong));
  if (in.scalar_type() == at::kLong)
    shift_segments(in.data_ptr<int64_t>(), in.numel(), bases, counts, out.data_ptr<int64_t>());
  else
    shift_segments(in.data_ptr<int32_t>(), in.numel(), bases, counts, out.data_ptr<int64_t>());
  return out;
}

}  // namespace
}  // namespace shardkit

TORCH_LIBRARY_FRAGMENT(shardkit, m) {
  m.def("bucket_rows(Tensor values, Tensor lengths, int[] row_starts) -> (Tensor, Tensor, Tensor)");
  m.def("shift_ids(Tensor ids, int[] bases, int[] counts) -> Tensor");
}

TORCH_LIBRARY_IMPL(shardkit, CPU, m) {
  m.impl("bucket_rows", &shardkit::bucket_rows_cpu);
  m.impl("shift_ids", &shardkit::shift_ids_cpu);
}
