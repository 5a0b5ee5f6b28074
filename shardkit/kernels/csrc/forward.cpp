// shardkit's CPU pooled forward: one loop over bags summing rows in fp32, prefetching ahead.
//
// See [Note: compiled kernel] in shardkit/kernels/__init__.py.
#include "common.h"

namespace shardkit {
namespace {

using namespace detail;

// kDim > 0: the row length known at compile time, so the sum stays in registers (16-256: at
// dim 256 that is 0.78x the forward's time and 0.87x row-wise Adagrad's update of a runtime dim).
template <typename W, typename Id, bool kWeighted, int kDim>
void forward_bags(const Table& t, const Batch& b, W* out, int64_t bag_lo, int64_t bag_hi) {
  const int64_t dim = kDim > 0 ? kDim : t.dim, row_bytes = dim * int64_t(sizeof(W));
  const W* weight = static_cast<const W*>(t.data);
  const Id* ids = static_cast<const Id*>(b.ids);
  float local[kDim > 0 ? kDim : 1];
  float* __restrict acc = kDim > 0 ? local : scratch_row(dim);
  const int64_t stop = b.offsets[bag_hi], ahead_by = rows_ahead(row_bytes);
  PooledRows rows(b, bag_lo);
  for (int64_t bag = bag_lo; bag < bag_hi; ++bag, rows.next()) {
    for (int64_t d = 0; d < dim; ++d) acc[d] = 0.0f;
    for (int64_t i = b.offsets[bag]; i < b.offsets[bag + 1]; ++i) {
      if (i + ahead_by < stop) {
        uint64_t ahead = static_cast<uint64_t>(ids[i + ahead_by]);
        if (ahead < static_cast<uint64_t>(t.num_rows))
          prefetch_row(weight + ahead * dim, row_bytes, false);
      }
      const int64_t id = static_cast<int64_t>(ids[i]);
      if (static_cast<uint64_t>(id) >= static_cast<uint64_t>(t.num_rows)) bad_id(id, i, t.num_rows);
      const W* __restrict row = weight + id * dim;
      if (kWeighted) {
        const float scale = b.weights[i];
        for (int64_t d = 0; d < dim; ++d) acc[d] += scale * to_float(row[d]);
      } else {
        for (int64_t d = 0; d < dim; ++d) acc[d] += to_float(row[d]);
      }
    }
    W* __restrict dst = out + rows.row() * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] = to<W>(acc[d]);
  }
}

template <typename W, typename Id, bool kWeighted>
void forward_dim(const Table& t, const Batch& b, W* out, int64_t lo, int64_t hi) {
  switch (t.dim) {
    case 16: return forward_bags<W, Id, kWeighted, 16>(t, b, out, lo, hi);
    case 32: return forward_bags<W, Id, kWeighted, 32>(t, b, out, lo, hi);
    case 64: return forward_bags<W, Id, kWeighted, 64>(t, b, out, lo, hi);
    case 128: return forward_bags<W, Id, kWeighted, 128>(t, b, out, lo, hi);
    case 256: return forward_bags<W, Id, kWeighted, 256>(t, b, out, lo, hi);
    default: return forward_bags<W, Id, kWeighted, 0>(t, b, out, lo, hi);
  }
}

template <typename W, typename Id>
void forward_typed(const Table& t, const Batch& b, void* out, int num_threads) {
  auto no_split = [](int64_t k) { return k; };
  auto run = [&](int64_t lo, int64_t hi) {
    if (b.weights)
      forward_dim<W, Id, true>(t, b, static_cast<W*>(out), lo, hi);
    else
      forward_dim<W, Id, false>(t, b, static_cast<W*>(out), lo, hi);
  };
  parallel_ranges(b.num_bags, b.num_ids >= 4096 ? num_threads : 1, no_split, run);
}

template <typename W>
void forward_ids(const Table& t, const Batch& b, void* out, int num_threads) {
  if (b.ids_are_int64)
    forward_typed<W, int64_t>(t, b, out, num_threads);
  else
    forward_typed<W, int32_t>(t, b, out, num_threads);
}

}  // namespace

void pooled_forward(const Table& table, const Batch& batch, void* out, int num_threads) {
  check_offsets(batch);
  switch (table.dtype) {
    case DType::kFloat: return forward_ids<float>(table, batch, out, num_threads);
    case DType::kHalf: return forward_ids<Half>(table, batch, out, num_threads);
    case DType::kBFloat16: return forward_ids<BFloat16>(table, batch, out, num_threads);
  }
  throw std::invalid_argument("unknown dtype");
}

}  // namespace shardkit
