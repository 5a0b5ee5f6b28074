// shardkit's CPU embedding kernels: pooled forward, and backward fused with the optimizer rule.
//
// See [Note: compiled kernel] in shardkit/kernels/__init__.py. The arithmetic of every rule
// follows shardkit/optim/_rules.py (the spec) operation by operation, in fp32, so that the two
// paths agree to rounding.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace shardkit {
namespace {

// Rows fetched ahead of use: about 4 KiB in flight, so that short rows (one cache line at dim 16)
// keep as many misses outstanding as long ones, and far enough to hide a DRAM miss behind the
// work on the rows between; near enough that the lines are still in L1/L2 when used.
constexpr int64_t kLine = 64;
constexpr int64_t kBytesInFlight = 4096;
inline int64_t rows_ahead(int64_t row_bytes) {
  return std::min<int64_t>(64, std::max<int64_t>(4, kBytesInFlight / std::max<int64_t>(row_bytes, 1)));
}

// ---- element types: fp32 math on fp32, fp16 and bf16 storage ------------------------------------

struct BFloat16 {
  uint16_t bits;
};

#if defined(__FLT16_MAX__)
using Half = _Float16;
inline float to_float(Half x) { return static_cast<float>(x); }
inline Half from_float(float x, Half*) { return static_cast<Half>(x); }
#else
struct Half {
  uint16_t bits;
};
inline float to_float(Half x) {
  uint32_t sign = uint32_t(x.bits & 0x8000u) << 16, e = (x.bits >> 10) & 0x1fu, m = x.bits & 0x3ffu;
  uint32_t u;
  if (e == 0) {
    float f = std::ldexp(static_cast<float>(m), -24);
    return sign ? -f : f;
  }
  u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline Half from_float(float f, Half*) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return {uint16_t(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u))};
  if (x >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // rounds to infinity
  if (x < 0x38800000u) return {uint16_t(sign | uint16_t(std::nearbyint(std::fabs(f) * 16777216.0f)))};
  uint32_t r = x - (112u << 23);
  r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  return {uint16_t(sign | r)};
}
#endif

inline float to_float(float x) { return x; }
inline float to_float(BFloat16 x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float from_float(float x, float*) { return x; }
inline BFloat16 from_float(float x, BFloat16*) {  // round to nearest even, as torch does
  if (std::isnan(x)) return {0x7fc0};
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return {uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
template <typename W>
inline W to(float x) {
  return from_float(x, static_cast<W*>(nullptr));
}

// `w += delta` as the eager rule does it: the step rounded to the weight's dtype, then added.
template <typename W>
inline void add_step(W& w, float delta) {
  w = to<W>(to_float(w) + to_float(to<W>(delta)));
}
template <>
inline void add_step(float& w, float delta) {
  w = w + delta;
}

// sum(x[d] * y[d]) in 16 independent lanes: a vectorizable order (a single running sum is a
// chain of dependent adds the compiler may not reorder, 4 cycles each).
template <typename W>
inline float dot(const float* __restrict x, const W* __restrict y, int64_t dim) {
  float lanes[16] = {};
  const int64_t full = dim / 16 * 16;
  for (int64_t d = 0; d < full; d += 16)
    for (int k = 0; k < 16; ++k) lanes[k] += x[d + k] * to_float(y[d + k]);
  for (int64_t k = 0; k < dim - full; ++k) lanes[k] += x[full + k] * to_float(y[full + k]);
  float sum = 0.0f;
  for (int k = 0; k < 16; ++k) sum += lanes[k];
  return sum;
}

inline void prefetch_row(const void* row, int64_t bytes, bool for_write) {
  const char* p = static_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += kLine) {
    if (for_write)
      __builtin_prefetch(p + off, 1, 3);
    else
      __builtin_prefetch(p + off, 0, 3);
  }
}

// One fp32 row of scratch per thread, reused across calls (fresh pages cost more than the math).
float* scratch_row(int64_t dim) {
  thread_local std::vector<float> row;
  if (static_cast<int64_t>(row.size()) < dim) row.resize(dim);
  return row.data();
}

// The pooled output's row (and its gradient's) of each bag, walking the bags in order: bag
// (k, b) of a key-major batch is row b * num_keys + k when the batch asks for example-major rows
// (Batch::batch_size > 0), row k * batch_size + b otherwise; no division per bag.
class PooledRows {
 public:
  PooledRows(const Batch& b, int64_t bag)
      : per_key_(b.batch_size > 0 ? b.batch_size : 0),
        num_keys_(per_key_ ? b.num_bags / per_key_ : 1),
        key_(per_key_ ? bag / per_key_ : 0),
        example_(per_key_ ? bag % per_key_ : bag) {}
  int64_t row() const { return per_key_ ? example_ * num_keys_ + key_ : example_; }
  void next() {
    if (++example_ == per_key_) {
      example_ = 0;
      ++key_;
    }
  }

 private:
  int64_t per_key_, num_keys_, key_, example_;
};

[[noreturn]] void bad_id(int64_t id, int64_t position, int64_t num_rows) {
  throw std::out_of_range("id " + std::to_string(id) + " at position " + std::to_string(position) +
                          " is out of range: ids must satisfy 0 <= id < num_rows = " +
                          std::to_string(num_rows));
}

void check_offsets(const Batch& b) {
  if (b.offsets[0] != 0 || b.offsets[b.num_bags] != b.num_ids)
    throw std::invalid_argument("offsets must start at 0 and end at the number of ids (" +
                                std::to_string(b.num_ids) + "), got " +
                                std::to_string(b.offsets[0]) + " and " +
                                std::to_string(b.offsets[b.num_bags]));
  for (int64_t bag = 0; bag < b.num_bags; ++bag)
    if (b.offsets[bag + 1] < b.offsets[bag])
      throw std::invalid_argument("offsets must not decrease; bag " + std::to_string(bag) +
                                  " ends before it starts");
}

// Runs fn(begin, end) over [0, n) split into one range per thread (ranges come from `split`,
// which may move a boundary); exceptions from any thread are rethrown here.
template <typename Split, typename Fn>
void parallel_ranges(int64_t n, int num_threads, Split split, Fn fn) {
#ifdef _OPENMP
  if (num_threads > 1 && n >= 4096 && !omp_in_parallel()) {
    std::exception_ptr error;
    std::mutex mutex;
#pragma omp parallel
    {
      int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
      int64_t lo = split(n * part / parts), hi = split(n * (part + 1) / parts);
      try {
        if (lo < hi) fn(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
#endif
  (void)num_threads;
  (void)split;
  fn(int64_t{0}, n);
}

// ---- forward --------------------------------------------------------------------------------

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

// ---- grouping: the batch's ids sorted by row -------------------------------------------------

// Occurrences as (row << 32 | source), sorted by row, stable; `source` is the occurrence's
// position, or its bag's gradient row when that is all backward needs (pooled, unweighted).
struct Groups {
  std::vector<uint64_t> keys, spare;
  std::vector<int32_t> bag_of;  // [num_ids] pooled row of each id, when sources are positions
  std::vector<uint32_t> counts;
  const uint64_t* sorted = nullptr;
};

Groups& groups_scratch() {
  thread_local Groups groups;
  return groups;
}

// Pass 0 of the sort: pack (row, source), check ids, count every digit of every pass.
template <typename Id>
void pack(const Table& t, const Batch& b, bool by_position, int passes, int bits, Groups& g) {
  const Id* ids = static_cast<const Id*>(b.ids);
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  uint64_t* keys = g.keys.data();
  uint32_t* counts = g.counts.data();
  const int64_t buckets = int64_t{1} << bits;
  const int64_t num_bags = b.offsets ? b.num_bags : b.num_ids;
  PooledRows rows(b, 0);  // per id (no offsets): batch_size is 0, so row() is the id's position
  for (int64_t bag = 0; bag < num_bags; ++bag, rows.next()) {
    const int64_t lo = b.offsets ? b.offsets[bag] : bag, hi = b.offsets ? b.offsets[bag + 1] : bag + 1;
    const int64_t grad_row = rows.row();
    for (int64_t i = lo; i < hi; ++i) {
      const uint64_t row = static_cast<uint64_t>(static_cast<int64_t>(ids[i]));
      if (row >= static_cast<uint64_t>(t.num_rows)) bad_id(static_cast<int64_t>(ids[i]), i, t.num_rows);
      keys[i] = (row << 32) | static_cast<uint64_t>(by_position ? i : grad_row);
      if (by_position && b.offsets) g.bag_of[i] = static_cast<int32_t>(grad_row);
      for (int p = 0; p < passes; ++p) ++counts[p * buckets + ((row >> (p * bits)) & mask)];
    }
  }
}

// [Note: grouping by counting]
// Where the table has few rows for the batch (num_rows <= kCountingRowsPerId * num_ids), the
// occurrences are grouped by a counting sort on the row itself: one pass counts every row's
// occurrences (and checks the ids), a scan of the counts turns them into each row's first slot,
// one pass writes every key into its row's next slot. Two passes over the ids instead of the
// radix sort's three (pack + two 10-11 bit passes at 100k-2M rows), and the same stable result,
// so the update loop cannot tell them apart. Where the rows far outnumber the ids (10M rows, 40k
// ids), zeroing and scanning one count per row would cost more than the sort: radix there.
constexpr int64_t kCountingRowsPerId = 2;

template <typename Id>
void count_rows(const Table& t, const Batch& b, uint32_t* counts) {
  const Id* ids = static_cast<const Id*>(b.ids);
  for (int64_t i = 0; i < b.num_ids; ++i) {
    const uint64_t row = static_cast<uint64_t>(static_cast<int64_t>(ids[i]));
    if (row >= static_cast<uint64_t>(t.num_rows)) bad_id(static_cast<int64_t>(ids[i]), i, t.num_rows);
    ++counts[row];
  }
  uint32_t sum = 0;
  for (int64_t r = 0; r < t.num_rows; ++r) {
    const uint32_t c = counts[r];
    counts[r] = sum;
    sum += c;
  }
}

// Keys (row << 32 | source) into the slots `count_rows` made: counts[row] is the row's next slot.
// The slots are scattered over n * 8 bytes (10 MB at 1.3M ids, beyond L2): each write's line is
// prefetched kSlotsAhead ids early, which halves this pass (13 -> 6.4 ms at 1.3M ids, 400k rows).
constexpr int64_t kSlotsAhead = 16;
template <typename Id>
void place_keys(const Batch& b, bool by_position, uint32_t* next, Groups& g) {
  const Id* ids = static_cast<const Id*>(b.ids);
  uint64_t* keys = g.keys.data();
  const bool with_bag = by_position && b.offsets;
  const int64_t num_bags = b.offsets ? b.num_bags : b.num_ids;
  PooledRows rows(b, 0);
  for (int64_t bag = 0; bag < num_bags; ++bag, rows.next()) {
    const int64_t lo = b.offsets ? b.offsets[bag] : bag, hi = b.offsets ? b.offsets[bag + 1] : bag + 1;
    const int64_t grad_row = rows.row();
    for (int64_t i = lo; i < hi; ++i) {
      if (i + kSlotsAhead < b.num_ids)  // (every id was checked by count_rows)
        __builtin_prefetch(keys + next[static_cast<int64_t>(ids[i + kSlotsAhead])], 1, 3);
      const uint64_t row = static_cast<uint64_t>(static_cast<int64_t>(ids[i]));
      keys[next[row]++] = (row << 32) | static_cast<uint64_t>(by_position ? i : grad_row);
      if (with_bag) g.bag_of[i] = static_cast<int32_t>(grad_row);
    }
  }
}

template <typename Id>
void group_by_counting(const Table& t, const Batch& b, bool by_position, Groups& g) {
  g.counts.assign(t.num_rows, 0);
  count_rows<Id>(t, b, g.counts.data());
  g.keys.resize(b.num_ids);
  if (by_position && b.offsets) g.bag_of.resize(b.num_ids);
  place_keys<Id>(b, by_position, g.counts.data(), g);
  g.sorted = g.keys.data();
}

// LSD radix sort on the row (the high 32 bits), as few passes as the number of rows needs; or
// a counting sort where the rows are few (see [Note: grouping by counting]); `rows_per_id`
// moves that threshold (for benchmarks of either sort).
void group(const Table& t, const Batch& b, bool by_position, Groups& g,
           int64_t rows_per_id = kCountingRowsPerId) {
  const int64_t n = b.num_ids;
  if (t.num_rows <= rows_per_id * n) {
    if (b.ids_are_int64) return group_by_counting<int64_t>(t, b, by_position, g);
    return group_by_counting<int32_t>(t, b, by_position, g);
  }
  int row_bits = 1;
  while (row_bits < 32 && (int64_t{1} << row_bits) < t.num_rows) ++row_bits;
  const int passes = (row_bits + 10) / 11, bits = (row_bits + passes - 1) / passes;
  const int64_t buckets = int64_t{1} << bits;
  g.keys.resize(n);
  g.spare.resize(n);
  g.counts.assign(passes * buckets, 0);
  if (by_position && b.offsets) g.bag_of.resize(n);
  if (b.ids_are_int64)
    pack<int64_t>(t, b, by_position, passes, bits, g);
  else
    pack<int32_t>(t, b, by_position, passes, bits, g);
  uint64_t *src = g.keys.data(), *dst = g.spare.data();
  for (int p = 0; p < passes; ++p) {
    uint32_t* count = g.counts.data() + p * buckets;
    const int shift = 32 + p * bits;
    if (count[(src[0] >> shift) & (buckets - 1)] == static_cast<uint32_t>(n)) continue;
    uint32_t sum = 0;
    for (int64_t k = 0; k < buckets; ++k) {
      uint32_t c = count[k];
      count[k] = sum;
      sum += c;
    }
    for (int64_t i = 0; i < n; ++i) dst[count[(src[i] >> shift) & (buckets - 1)]++] = src[i];
    std::swap(src, dst);
  }
  g.sorted = src;
}

// ---- backward: sum each row's gradient, apply the rule in place ------------------------------

struct Context {
  const Table& table;
  const Update& update;
  const float* grad_out;
  const float* weights;  // per-sample, indexed by position
  const int32_t* bag_of;  // position -> bag, or null when the source is the gradient row
  float* grad_weights;
  float step_size;  // Adam's bias-corrected step size
};

template <typename W, Rule kRule, int kDim>
__attribute__((always_inline)) inline void apply_rule(const Context& c, int64_t row, float* __restrict g) {
  const int64_t dim = kDim > 0 ? kDim : c.table.dim;
  const Update& u = c.update;
  W* __restrict w = static_cast<W*>(c.table.data) + row * dim;
  if (kRule == Rule::kDense) {
    W* __restrict out = static_cast<W*>(u.dense_grad) + row * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = to<W>(g[d]);
    return;
  }
  if (u.weight_decay != 0.0f)
    for (int64_t d = 0; d < dim; ++d) g[d] = g[d] + u.weight_decay * to_float(w[d]);
  if (kRule == Rule::kSgd) {
    const float scale = -u.lr;
    for (int64_t d = 0; d < dim; ++d) add_step(w[d], g[d] * scale);
  } else if (kRule == Rule::kAdagrad) {
    float* __restrict acc = u.state1 + row * dim;
    for (int64_t d = 0; d < dim; ++d) {
      const float sum = acc[d] + g[d] * g[d];
      acc[d] = sum;
      add_step(w[d], (g[d] / (std::sqrt(sum) + u.eps)) * -u.lr);
    }
  } else if (kRule == Rule::kRowwiseAdagrad) {
    const float norm = std::sqrt(dot(g, g, dim));
    const float sum = u.state1[row] + (1.0f / static_cast<float>(dim)) * norm * norm;
    u.state1[row] = sum;
    const float scale = (1.0f / (std::sqrt(sum) + u.eps)) * -u.lr;
    for (int64_t d = 0; d < dim; ++d) add_step(w[d], g[d] * scale);
  } else if (kRule == Rule::kAdam) {
    float* __restrict avg = u.state1 + row * dim;
    float* __restrict avg_sq = u.state2 + row * dim;
    // As the eager rule: each constant computed in double, then rounded to fp32.
    const float keep1 = float(u.beta1), keep2 = float(u.beta2), one_minus1 = float(1.0 - u.beta1);
    const float one_minus2 = float(1.0 - u.beta2), scale = -c.step_size;
    for (int64_t d = 0; d < dim; ++d) {
      const float m = avg[d] * keep1 + one_minus1 * g[d];
      const float v = avg_sq[d] * keep2 + one_minus2 * g[d] * g[d];
      avg[d] = m;
      avg_sq[d] = v;
      add_step(w[d], (m / (std::sqrt(v) + u.eps)) * scale);
    }
  }
}

// The gradient row of the occurrence `key`; and, when it starts a run (`first`), its table row
// and state: once per unique row, not once per occurrence (a hot row has thousands).
template <typename W>
void prefetch_occurrence(const Context& c, uint64_t key, bool first) {
  const Table& t = c.table;
  const int64_t dim = t.dim, row = static_cast<int64_t>(key >> 32);
  const int64_t source = static_cast<int64_t>(key & 0xffffffffu);
  const int64_t grad_row = c.bag_of ? c.bag_of[source] : source;
  prefetch_row(c.grad_out + grad_row * dim, dim * 4, false);
  if (!first) return;
  prefetch_row(static_cast<const W*>(t.data) + row * dim, dim * int64_t(sizeof(W)), true);
  const Update& u = c.update;
  if (u.rule == Rule::kRowwiseAdagrad) {
    __builtin_prefetch(u.state1 + row, 1, 3);
  } else if (u.state1) {
    prefetch_row(u.state1 + row * dim, dim * 4, true);
    if (u.state2) prefetch_row(u.state2 + row * dim, dim * 4, true);
  }
}

// Rows of sorted occurrences [lo, hi); lo and hi fall on row boundaries.
template <typename W, Rule kRule, bool kWeighted, int kDim>
void update_rows(const Context& c, const uint64_t* sorted, int64_t lo, int64_t hi) {
  const int64_t dim = kDim > 0 ? kDim : c.table.dim;
  const W* weight = static_cast<const W*>(c.table.data);
  alignas(64) float local[kDim > 0 ? kDim : 1];
  float* __restrict g = kDim > 0 ? local : scratch_row(dim);
  const int64_t ahead_by = rows_ahead(dim * int64_t(sizeof(W)));
  int64_t i = lo;
  while (i < hi) {
    const uint64_t row = sorted[i] >> 32;
    const W* __restrict w = weight + row * dim;
    for (int64_t d = 0; d < dim; ++d) g[d] = 0.0f;
    do {
      if (i + ahead_by < hi) {
        const uint64_t ahead = sorted[i + ahead_by];
        prefetch_occurrence<W>(c, ahead, (ahead >> 32) != (sorted[i + ahead_by - 1] >> 32));
      }
      const int64_t source = static_cast<int64_t>(sorted[i] & 0xffffffffu);
      const int64_t grad_row = c.bag_of ? c.bag_of[source] : source;
      const float* __restrict go = c.grad_out + grad_row * dim;
      if (kWeighted) {
        const float scale = c.weights[source];
        for (int64_t d = 0; d < dim; ++d) g[d] += scale * go[d];
      } else {
        for (int64_t d = 0; d < dim; ++d) g[d] += go[d];
      }
      if (c.grad_weights) c.grad_weights[source] = dot(go, w, dim);
      ++i;
    } while (i < hi && (sorted[i] >> 32) == row);
    apply_rule<W, kRule, kDim>(c, static_cast<int64_t>(row), g);
  }
}

template <typename W, Rule kRule, bool kWeighted>
void update_dim(const Context& c, const uint64_t* sorted, int64_t lo, int64_t hi) {
  switch (c.table.dim) {
    case 16: return update_rows<W, kRule, kWeighted, 16>(c, sorted, lo, hi);
    case 32: return update_rows<W, kRule, kWeighted, 32>(c, sorted, lo, hi);
    case 64: return update_rows<W, kRule, kWeighted, 64>(c, sorted, lo, hi);
    case 128: return update_rows<W, kRule, kWeighted, 128>(c, sorted, lo, hi);
    case 256: return update_rows<W, kRule, kWeighted, 256>(c, sorted, lo, hi);
    default: return update_rows<W, kRule, kWeighted, 0>(c, sorted, lo, hi);
  }
}

template <typename W, Rule kRule>
void backward_rule(const Context& c, const uint64_t* sorted, int64_t n, int num_threads) {
  auto at_row_start = [sorted, n](int64_t k) {
    while (k > 0 && k < n && (sorted[k] >> 32) == (sorted[k - 1] >> 32)) ++k;
    return k;
  };
  auto run = [&](int64_t lo, int64_t hi) {
    if (c.weights)
      update_dim<W, kRule, true>(c, sorted, lo, hi);
    else
      update_dim<W, kRule, false>(c, sorted, lo, hi);
  };
  parallel_ranges(n, num_threads, at_row_start, run);
}

template <typename W>
void backward_typed(const Context& c, const uint64_t* sorted, int64_t n, int num_threads) {
  switch (c.update.rule) {
    case Rule::kDense: return backward_rule<W, Rule::kDense>(c, sorted, n, num_threads);
    case Rule::kSgd: return backward_rule<W, Rule::kSgd>(c, sorted, n, num_threads);
    case Rule::kAdagrad: return backward_rule<W, Rule::kAdagrad>(c, sorted, n, num_threads);
    case Rule::kRowwiseAdagrad:
      return backward_rule<W, Rule::kRowwiseAdagrad>(c, sorted, n, num_threads);
    case Rule::kAdam: return backward_rule<W, Rule::kAdam>(c, sorted, n, num_threads);
  }
  throw std::invalid_argument("unknown update rule " + std::to_string(int(c.update.rule)));
}

// ---- SGD without grouping ---------------------------------------------------------------------

// [Note: SGD without a sort]
// Plain SGD (no weight decay) on fp32 rows is linear in the gradient: adding each occurrence's
// step as it comes gives the row the same total step as adding the summed gradient once (up to
// the order of rounding). So this backward needs no grouping at all: one pass over the bags in
// input order, each bag's gradient row scaled once and added to the rows of its ids, like a
// forward that writes. Single-threaded only (two threads could update one row at once); fp16 and
// bf16 rows round at every add, so they take the grouped path, which rounds once as eager does.
template <typename Id>
void check_ids(const Table& t, const Batch& b) {
  const Id* ids = static_cast<const Id*>(b.ids);
  for (int64_t i = 0; i < b.num_ids; ++i)
    if (static_cast<uint64_t>(static_cast<int64_t>(ids[i])) >= static_cast<uint64_t>(t.num_rows))
      bad_id(static_cast<int64_t>(ids[i]), i, t.num_rows);
}

template <typename Id, int kDim>
void sgd_scatter(const Table& t, const Batch& b, const float* grad_out, float lr,
                 float* grad_weights) {
  const int64_t dim = kDim > 0 ? kDim : t.dim, row_bytes = dim * 4;
  const int64_t ahead_by = rows_ahead(row_bytes);
  float* weight = static_cast<float*>(t.data);
  const Id* ids = static_cast<const Id*>(b.ids);
  const int64_t num_bags = b.offsets ? b.num_bags : b.num_ids, n = b.num_ids;
  auto lo_of = [&](int64_t bag) { return b.offsets ? b.offsets[bag] : bag; };
  if (grad_weights) {  // from the rows as they were: before any update
    PooledRows rows(b, 0);
    for (int64_t bag = 0; bag < num_bags; ++bag, rows.next())
      for (int64_t i = lo_of(bag); i < lo_of(bag + 1); ++i)
        grad_weights[i] = dot(grad_out + rows.row() * dim,
                              weight + static_cast<int64_t>(ids[i]) * dim, dim);
  }
  alignas(64) float local[kDim > 0 ? kDim : 1];
  float* __restrict step = kDim > 0 ? local : scratch_row(dim);
  PooledRows rows(b, 0);
  for (int64_t bag = 0; bag < num_bags; ++bag, rows.next()) {
    const int64_t lo = lo_of(bag), hi = lo_of(bag + 1);
    if (lo == hi) continue;
    const float* __restrict go = grad_out + rows.row() * dim;
    for (int64_t d = 0; d < dim; ++d) step[d] = go[d] * -lr;
    for (int64_t i = lo; i < hi; ++i) {
      if (i + ahead_by < n)
        prefetch_row(weight + static_cast<int64_t>(ids[i + ahead_by]) * dim, row_bytes, true);
      float* __restrict w = weight + static_cast<int64_t>(ids[i]) * dim;
      if (b.weights) {
        const float scale = b.weights[i];
        for (int64_t d = 0; d < dim; ++d) w[d] += scale * step[d];
      } else {
        for (int64_t d = 0; d < dim; ++d) w[d] += step[d];
      }
    }
  }
}

template <typename Id>
void sgd_without_sort(const Table& t, const Batch& b, const float* grad_out, float lr,
                      float* grad_weights) {
  check_ids<Id>(t, b);
  switch (t.dim) {
    case 16: return sgd_scatter<Id, 16>(t, b, grad_out, lr, grad_weights);
    case 32: return sgd_scatter<Id, 32>(t, b, grad_out, lr, grad_weights);
    case 64: return sgd_scatter<Id, 64>(t, b, grad_out, lr, grad_weights);
    case 128: return sgd_scatter<Id, 128>(t, b, grad_out, lr, grad_weights);
    case 256: return sgd_scatter<Id, 256>(t, b, grad_out, lr, grad_weights);
    default: return sgd_scatter<Id, 0>(t, b, grad_out, lr, grad_weights);
  }
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

void backward(const Table& table, const Batch& batch, const float* grad_out, const Update& update,
              float* grad_weights, int num_threads) {
  if (batch.offsets) check_offsets(batch);
  if (batch.num_ids == 0 || table.dim == 0) return;
  if (table.num_rows > (int64_t{1} << 32) || batch.num_ids > (int64_t{1} << 31))
    throw std::invalid_argument("the compiled kernel takes < 2^32 rows and < 2^31 ids per call");
  if (update.rule == Rule::kSgd && update.weight_decay == 0.0f && table.dtype == DType::kFloat &&
      num_threads <= 1) {  // See [Note: SGD without a sort]
    if (batch.ids_are_int64)
      return sgd_without_sort<int64_t>(table, batch, grad_out, update.lr, grad_weights);
    return sgd_without_sort<int32_t>(table, batch, grad_out, update.lr, grad_weights);
  }
  const bool by_position = batch.weights != nullptr || grad_weights != nullptr || !batch.offsets;
  Groups& g = groups_scratch();
  group(table, batch, by_position, g);
  double step_size = 0.0;
  if (update.rule == Rule::kAdam) {
    const double step = static_cast<double>(update.step);
    step_size = update.lr_double * std::sqrt(1.0 - std::pow(update.beta2, step)) /
                (1.0 - std::pow(update.beta1, step));
  }
  const bool pooled_by_position = by_position && batch.offsets;
  Context c{table,        update,
            grad_out,     batch.weights,
            pooled_by_position ? g.bag_of.data() : nullptr,
            grad_weights, static_cast<float>(step_size)};
  switch (table.dtype) {
    case DType::kFloat: return backward_typed<float>(c, g.sorted, batch.num_ids, num_threads);
    case DType::kHalf: return backward_typed<Half>(c, g.sorted, batch.num_ids, num_threads);
    case DType::kBFloat16: return backward_typed<BFloat16>(c, g.sorted, batch.num_ids, num_threads);
  }
  throw std::invalid_argument("unknown dtype");
}

}  // namespace shardkit
