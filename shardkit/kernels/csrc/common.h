// What every kernel source shares: element types (fp32 math on fp32, fp16 and bf16 storage),
// prefetching, the pooled row of a bag, id and offset checks, and the thread split.
//
// See [Note: compiled kernel] in shardkit/kernels/__init__.py. Header-only (inline and templates)
// so that forward.cpp, grouping.cpp and backward.cpp each inline what they use.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"

namespace shardkit {
namespace detail {


// Rows fetched ahead of use: about 4 KiB in flight, so that short rows (one cache line at dim 16)
// keep as many misses outstanding as long ones, and far enough to hide a DRAM miss behind the
// work on the rows between; near enough that the lines are still in L1/L2 when used.
constexpr int64_t kLine = 64;
constexpr int64_t kBytesInFlight = 4096;
inline int64_t rows_ahead(int64_t row_bytes) {
  return std::min<int64_t>(64, std::max<int64_t>(4, kBytesInFlight / std::max<int64_t>(row_bytes, 1)));
}

// Gradient rows fetched ahead by the grouped update: a quarter of the table rows' distance (see
// [Note: two prefetch distances] in backward.cpp).
constexpr int64_t kGradBytesInFlight = 1024;
inline int64_t grad_rows_ahead(int64_t row_bytes) {
  const int64_t rows = kGradBytesInFlight / std::max<int64_t>(row_bytes, 1);
  return std::min<int64_t>(16, std::max<int64_t>(2, rows));
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

// sum(x[d] * y[d]) in 16 independent lanes (lane k sums the d = k mod 16), then the lanes added
// as a tree: a vectorizable order (a single running sum is a chain of dependent adds the
// compiler may not reorder, 3-4 cycles each), with a short chain at the end (4 adds, not 16).
// Not inlined: inlined into the update loop, GCC 12 turned it (and the loop) into scalar code,
// 1.6x the update's time at dim 16.
template <typename W>
__attribute__((noinline)) float dot(const float* __restrict x, const W* __restrict y,
                                    int64_t dim) {
  float lanes[16] = {};
  const int64_t full = dim / 16 * 16;
  for (int64_t d = 0; d < full; d += 16)
    for (int k = 0; k < 16; ++k) lanes[k] += x[d + k] * to_float(y[d + k]);
  for (int64_t k = 0; k < dim - full; ++k) lanes[k] += x[full + k] * to_float(y[full + k]);
  for (int k = 0; k < 8; ++k) lanes[k] += lanes[k + 8];
  for (int k = 0; k < 4; ++k) lanes[k] += lanes[k + 4];
  for (int k = 0; k < 2; ++k) lanes[k] += lanes[k + 2];
  return lanes[0] + lanes[1];
}

// [Note: prefetches are inlined]
// A function whose only effect is __builtin_prefetch is, to GCC, a function with no effect:
// GCC 12 -O3 marks it const and deletes every call to it that it has not inlined. The grouped
// update called `prefetch_occurrence` (a plain template) and so ran with no prefetch at all
// (no prefetch instruction in any update_rows); with both helpers always inlined the
// prefetches stay. Measured with benchmarks/ebc_phases.cpp on a Zen 3 EPYC (AVX2), 4 x 100k
// rows, batch 2048, dim 16, thread CPU time: the row-wise update 4.3 -> 3.6 ms in sorted row
// order, 11.6 -> 4.0 ms in a shuffled row order. tests/kernels/test_build.py checks the built
// library's update loops for prefetch instructions.
__attribute__((always_inline)) inline void prefetch_row(const void* row, int64_t bytes,
                                                        bool for_write) {
  const char* p = static_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += kLine) {
    if (for_write)
      __builtin_prefetch(p + off, 1, 3);
    else
      __builtin_prefetch(p + off, 0, 3);
  }
}

// One fp32 row of scratch per thread, reused across calls (fresh pages cost more than the math).
inline float* scratch_row(int64_t dim) {
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

[[noreturn]] inline void bad_id(int64_t id, int64_t position, int64_t num_rows) {
  throw std::out_of_range("id " + std::to_string(id) + " at position " + std::to_string(position) +
                          " is out of range: ids must satisfy 0 <= id < num_rows = " +
                          std::to_string(num_rows));
}

inline void check_offsets(const Batch& b) {
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

}  // namespace detail
}  // namespace shardkit
