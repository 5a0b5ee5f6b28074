// shardkit's CPU backward fused with the optimizer rule: one pass over the grouped unique rows
// (or, for plain fp32 SGD on one thread, one pass over the bags with no grouping at all).
//
// See [Note: compiled kernel] in shardkit/kernels/__init__.py. The arithmetic of every rule
// follows shardkit/optim/_rules.py (the spec) operation by operation, in fp32, so that the two
// paths agree to rounding.
#include <type_traits>

#include "common.h"
#include "grouping.h"

namespace shardkit {
namespace detail {
namespace {

// ---- backward: sum each row's gradient, apply the rule in place ------------------------------

// Rows whose row-wise Adagrad scales are computed together: see [Note: row-wise Adagrad by
// blocks of rows].
constexpr int kBlockRows = 16;

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
  } else if (kRule == Rule::kAdam) {  // (row-wise Adagrad: rowwise_adagrad_block)
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

// [Note: two prefetch distances]
// The grouped update walks the occurrences in row order and prefetches two things ahead of use:
// the table row (and its state) of the occurrence `ahead.table` further on (rows_ahead: 4 KiB of
// rows, 4-64 occurrences), and the gradient row of the occurrence `ahead.grad` further on, a
// quarter as far (grad_rows_ahead: 1 KiB of rows, 2-16 occurrences). The table rows are the
// DRAM misses (26-200 MB of rows, in ascending order); the gradient rows ([bags, dim], 0.5-4 MB)
// are L2 or L3 hits, which a short distance covers. Both once used the table's distance. On a
// Zen 3 EPYC (AVX2), 4 x 100k rows, batch 2048, 134k unique rows, one thread, loaded machine,
// the old and new loops taking turns: the update (row-wise Adagrad or SGD) at dims 16-32 takes
// 0.83-0.87x that time in benchmarks/ebc_phases.cpp (median of rounds; dim 16 row-wise ~21 ->
// ~18 ns per unique row), 0.72-0.84x timed alone; dims 64-128 the same within noise (there the
// table rows' traffic sets the time: touching the unique rows alone takes about as long); see
// benchmarks/results/ebc_phases_prefetch_zen3.md. (That VM has no counters to say
// why; gradient lines fetched 64 occurrences early likely hold L1 miss buffers that the
// table's misses need.) The table row is prefetched at every occurrence, not only at a row's
// first: a repeated row's prefetch finds its line already on the way, and the test for a row's
// first occurrence was a branch that uniform ids mispredict (timed alike or slightly faster,
// power-law ids too).
// Always inlined: see [Note: prefetches are inlined] in common.h.
template <typename W, Rule kRule, int kDim>
__attribute__((always_inline)) inline void prefetch_table_row(const Context& c, int64_t row) {
  const Table& t = c.table;
  const int64_t dim = kDim > 0 ? kDim : t.dim;
  prefetch_row(static_cast<const W*>(t.data) + row * dim, dim * int64_t(sizeof(W)), true);
  const Update& u = c.update;
  if (kRule == Rule::kRowwiseAdagrad) {
    __builtin_prefetch(u.state1 + row, 1, 3);
  } else if (kRule == Rule::kAdagrad || kRule == Rule::kAdam) {
    prefetch_row(u.state1 + row * dim, dim * 4, true);
    if (kRule == Rule::kAdam) prefetch_row(u.state2 + row * dim, dim * 4, true);
  }
}

// How far ahead `prefetch_ahead` looks, in occurrences.
struct Ahead {
  int64_t table, grad;
  explicit Ahead(int64_t row_bytes, int64_t grad_row_bytes)
      : table(rows_ahead(row_bytes)), grad(grad_rows_ahead(grad_row_bytes)) {}
};

// Prefetches for occurrence i's successors: the table row of i + ahead.table and the gradient row
// of i + ahead.grad, those before `hi`.
template <typename W, Rule kRule, int kDim>
__attribute__((always_inline)) inline void prefetch_ahead(const Context& c, const uint64_t* sorted,
                                                          int64_t i, const Ahead& ahead,
                                                          int64_t hi) {
  const int64_t dim = kDim > 0 ? kDim : c.table.dim;
  if (i + ahead.table < hi)
    prefetch_table_row<W, kRule, kDim>(c, static_cast<int64_t>(sorted[i + ahead.table] >> 32));
  if (i + ahead.grad < hi) {
    const int64_t source = static_cast<int64_t>(sorted[i + ahead.grad] & 0xffffffffu);
    const int64_t grad_row = c.bag_of ? c.bag_of[source] : source;
    prefetch_row(c.grad_out + grad_row * dim, dim * 4, false);
  }
}

// w += g * scale for one row, rounded as the eager rule rounds. Not inlined, for the reason
// `dot` is not: the compiler vectorizes it alone, with the rows known not to overlap.
template <typename W, int kDim>
__attribute__((noinline)) void add_scaled(W* __restrict w, const float* __restrict g, float scale,
                                          int64_t dim) {
  if (kDim > 0) dim = kDim;
  for (int64_t d = 0; d < dim; ++d) add_step(w[d], g[d] * scale);
}

// [Note: row-wise Adagrad by blocks of rows]
// Row-wise Adagrad's scale of a row is a chain of dependent operations: the squared norm (a
// reduction), a square root, the state's add, a square root, a division; about 80 cycles, and
// row by row nothing else can run beside it (the next row's loads wait behind it once the
// reorder buffer is full). So the update sums up to kBlockRows rows' gradients first, then
// computes their scales one after the other (independent chains that overlap), then steps the
// rows. Measured with benchmarks/ebc_phases.cpp on a Zen 3 EPYC (AVX2), 4 x 100k rows, batch
// 2048, thread CPU time: the update 0.6x its row-by-row time at dim 16, 0.75x at dim 64, 0.85x
// at dim 256 (blocks of 8 rows: 0.7x, 0.8x, 0.9x). That row-by-row loop called dot() and
// add_scaled() per row through a buffer; fp32 rows at a dim compiled in now keep the gradient in
// registers instead (see [Note: a row's gradient in registers]), faster than these blocks.
template <typename W, int kDim>
void rowwise_adagrad_block(const Context& c, const int64_t* rows, float* grads, int count) {
  const int64_t dim = kDim > 0 ? kDim : c.table.dim;
  const Update& u = c.update;
  W* weight = static_cast<W*>(c.table.data);
  float scale[kBlockRows];
  if (u.weight_decay != 0.0f)
    for (int k = 0; k < count; ++k) {
      const W* __restrict w = weight + rows[k] * dim;
      float* __restrict g = grads + k * dim;
      for (int64_t d = 0; d < dim; ++d) g[d] = g[d] + u.weight_decay * to_float(w[d]);
    }
  for (int k = 0; k < count; ++k) scale[k] = dot(grads + k * dim, grads + k * dim, dim);
  for (int k = 0; k < count; ++k) {
    const float norm = std::sqrt(scale[k]);
    const float sum = u.state1[rows[k]] + (1.0f / static_cast<float>(dim)) * norm * norm;
    u.state1[rows[k]] = sum;
    scale[k] = (1.0f / (std::sqrt(sum) + u.eps)) * -u.lr;
  }
  for (int k = 0; k < count; ++k)
    add_scaled<W, kDim>(weight + rows[k] * dim, grads + k * dim, scale[k], dim);
}

// Rows of sorted occurrences [lo, hi); lo and hi fall on row boundaries. The gradients of up to
// kBlockRows rows are summed into `block`, then the rule runs on them (see [Note: row-wise
// Adagrad by blocks of rows]; the other rules run row by row). fp16 and bf16 rows, and fp32 rows
// at a dim not compiled in; fp32 rows at a dim compiled in take `update_rows_lanes`.
template <typename W, Rule kRule, bool kWeighted, int kDim>
void update_rows(const Context& c, const uint64_t* sorted, int64_t lo, int64_t hi) {
  const int64_t dim = kDim > 0 ? kDim : c.table.dim;
  const W* weight = static_cast<const W*>(c.table.data);
  alignas(64) float local[kDim > 0 ? kBlockRows * kDim : 1];
  float* __restrict block = kDim > 0 ? local : scratch_row(kBlockRows * dim);
  int64_t rows[kBlockRows];
  const Ahead ahead(dim * int64_t(sizeof(W)), dim * 4);
  int64_t i = lo;
  while (i < hi) {
    int count = 0;
    for (; count < kBlockRows && i < hi; ++count) {
      const uint64_t row = sorted[i] >> 32;
      const W* __restrict w = weight + row * dim;
      float* __restrict g = block + count * dim;
      rows[count] = static_cast<int64_t>(row);
      for (int64_t d = 0; d < dim; ++d) g[d] = 0.0f;
      do {
        prefetch_ahead<W, kRule, kDim>(c, sorted, i, ahead, hi);
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
    }
    if (kRule == Rule::kRowwiseAdagrad) {
      rowwise_adagrad_block<W, kDim>(c, rows, block, count);
    } else {  // elementwise rules: no chain across a row, each row as it comes
      for (int k = 0; k < count; ++k) apply_rule<W, kRule, kDim>(c, rows[k], block + k * dim);
    }
  }
}

// [Note: a row's gradient in registers]
// On fp32 rows at a dim compiled in (16-256) a row's summed gradient is kDim / kLanes values
// of `Lanes` (eight fp32 lanes, sixteen on AVX-512, see [Note: AVX-512 lanes]: GCC's generic
// vector, one register or two of a narrower target's), kept in registers while the row's occurrences are added; the rule is
// applied straight from them, row by row, everything inlined into one loop: no buffer written and
// read back per occurrence, no call per row. The out-of-order core overlaps one row's chain
// (row-wise Adagrad's norm -> sqrt -> state -> sqrt -> divide) with the next rows' loads by
// itself, which the blocks of rows did by hand. Every rule's arithmetic is `update_rows`'s
// (`apply_rule`, `rowwise_adagrad_block`) operation by operation, the squared norm in dot()'s
// lane order, so the two agree bit for bit (checked byte for byte: GCC 12, -march=native, Zen 3;
// the tests compare both with the eager spec). Measured with benchmarks/ebc_phases.cpp (4 x 100k
// rows, batch 2048, Zen 3, thread CPU time, loaded machine): row-wise Adagrad's update 0.69-0.83x
// the block loop's time at dims 16-128 (dim 16: 3.64 -> 2.80 ms, dim 64: 9.03 -> 7.50 ms on 2 MiB
// pages); see benchmarks/results/ebc_phases_update_zen3.md.
//
// [Note: AVX-512 lanes]
// Built with AVX-512 (the build passes -march=native and, on a CPU with avx512f,
// -mprefer-vector-width=512: see _cflags in shardkit/kernels/_build.py), `Lanes` is sixteen fp32
// lanes, one zmm register; else eight (one ymm). GCC widens no generic vector by itself, so with
// eight lanes the update stayed at ymm on every AVX-512 target while the forward and the SGD
// scatter went to zmm (checked with objdump: benchmarks/results/avx512_codegen_zen3_gcc12.md).
// Row-wise Adagrad's squared norm keeps dot()'s lane order either way: lane k of block j sums
// into lane k (sixteen lanes) or into the even (k < 8) or odd vector (eight lanes), then the
// same tree 16 -> 8 -> 4 -> 2 -> 1.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float Lanes __attribute__((vector_size(kLanes * 4), aligned(4)));  // aligned(4): any row
static_assert(sizeof(Lanes) == kLanes * sizeof(float), "Lanes is kLanes fp32 lanes");

__attribute__((always_inline)) inline Lanes load_lanes(const float* p) {
  return *reinterpret_cast<const Lanes*>(p);
}
__attribute__((always_inline)) inline void store_lanes(float* p, const Lanes& v) {
  *reinterpret_cast<Lanes*>(p) = v;
}
__attribute__((always_inline)) inline Lanes sqrt_lanes(const Lanes& x) {
  Lanes r;
  for (int j = 0; j < kLanes; ++j) r[j] = std::sqrt(x[j]);  // one vector sqrt (GCC's SLP)
  return r;
}

// The rule on fp32 row `row`, whose gradient is g[0 .. kDim / kLanes); as apply_rule and
// rowwise_adagrad_block do it.
template <Rule kRule, int kDim>
__attribute__((always_inline)) inline void apply_rule_lanes(const Context& c, int64_t row,
                                                            Lanes* g) {
  constexpr int kVectors = kDim / kLanes;
  static_assert(kDim % 16 == 0, "dot()'s lane order needs whole blocks of 16");
  const Update& u = c.update;
  float* __restrict w = static_cast<float*>(c.table.data) + row * kDim;
  if (kRule == Rule::kDense) {
    float* __restrict out = static_cast<float*>(u.dense_grad) + row * kDim;
    for (int k = 0; k < kVectors; ++k) store_lanes(out + kLanes * k, g[k]);
    return;
  }
  if (u.weight_decay != 0.0f)
    for (int k = 0; k < kVectors; ++k) g[k] = g[k] + u.weight_decay * load_lanes(w + kLanes * k);
  if (kRule == Rule::kSgd) {
    const float scale = -u.lr;
    for (int k = 0; k < kVectors; ++k)
      store_lanes(w + kLanes * k, load_lanes(w + kLanes * k) + g[k] * scale);
  } else if (kRule == Rule::kAdagrad) {
    float* __restrict acc = u.state1 + row * kDim;
    for (int k = 0; k < kVectors; ++k) {
      const Lanes sum = load_lanes(acc + kLanes * k) + g[k] * g[k];
      store_lanes(acc + kLanes * k, sum);
      store_lanes(w + kLanes * k, load_lanes(w + kLanes * k) + (g[k] / (sqrt_lanes(sum) + u.eps)) * -u.lr);
    }
  } else if (kRule == Rule::kAdam) {
    float* __restrict avg = u.state1 + row * kDim;
    float* __restrict avg_sq = u.state2 + row * kDim;
    const float keep1 = float(u.beta1), keep2 = float(u.beta2), one_minus1 = float(1.0 - u.beta1);
    const float one_minus2 = float(1.0 - u.beta2), scale = -c.step_size;
    for (int k = 0; k < kVectors; ++k) {
      const Lanes m = load_lanes(avg + kLanes * k) * keep1 + one_minus1 * g[k];
      const Lanes v = load_lanes(avg_sq + kLanes * k) * keep2 + one_minus2 * g[k] * g[k];
      store_lanes(avg + kLanes * k, m);
      store_lanes(avg_sq + kLanes * k, v);
      store_lanes(w + kLanes * k, load_lanes(w + kLanes * k) + (m / (sqrt_lanes(v) + u.eps)) * scale);
    }
  } else if (kRule == Rule::kRowwiseAdagrad) {
    float lanes[8];  // dot()'s tree, 16 -> 8 lanes; then 8 -> 4 -> 2 -> 1 below
    if constexpr (kLanes == 16) {
      Lanes all = {};  // dot()'s sixteen lanes
      for (int k = 0; k < kVectors; ++k) all += g[k] * g[k];
      for (int j = 0; j < 8; ++j) lanes[j] = all[j] + all[j + 8];
    } else {
      Lanes even = {}, odd = {};  // dot()'s lanes 0-7 and 8-15
      for (int k = 0; k < kVectors; k += 2) {
        even += g[k] * g[k];
        odd += g[k + 1] * g[k + 1];
      }
      const Lanes sum = even + odd;
      for (int j = 0; j < 8; ++j) lanes[j] = sum[j];
    }
    const float l0 = lanes[0] + lanes[4], l1 = lanes[1] + lanes[5], l2 = lanes[2] + lanes[6],
                l3 = lanes[3] + lanes[7];
    const float norm = std::sqrt((l0 + l2) + (l1 + l3));
    const float sum = u.state1[row] + (1.0f / static_cast<float>(kDim)) * norm * norm;
    u.state1[row] = sum;
    const float scale = (1.0f / (std::sqrt(sum) + u.eps)) * -u.lr;
    for (int k = 0; k < kVectors; ++k)
      store_lanes(w + kLanes * k, load_lanes(w + kLanes * k) + g[k] * scale);
  }
}

// Rows of sorted occurrences [lo, hi) of an fp32 table at a dim compiled in: see [Note: a row's
// gradient in registers]; lo and hi fall on row boundaries. Not inlined, so that
// tests/kernels/test_build.py finds each loop in the library.
template <Rule kRule, bool kWeighted, int kDim>
__attribute__((noinline)) void update_rows_lanes(const Context& c, const uint64_t* sorted, int64_t lo, int64_t hi) {
  constexpr int kVectors = kDim / kLanes;
  const float* weight = static_cast<const float*>(c.table.data);
  const Ahead ahead(kDim * 4, kDim * 4);
  int64_t i = lo;
  while (i < hi) {
    const uint64_t row = sorted[i] >> 32;
    const float* __restrict w = weight + row * kDim;
    Lanes g[kVectors];
    for (int k = 0; k < kVectors; ++k) g[k] = Lanes{};
    do {
      prefetch_ahead<float, kRule, kDim>(c, sorted, i, ahead, hi);
      const int64_t source = static_cast<int64_t>(sorted[i] & 0xffffffffu);
      const int64_t grad_row = c.bag_of ? c.bag_of[source] : source;
      const float* __restrict go = c.grad_out + grad_row * kDim;
      if (kWeighted) {
        const float scale = c.weights[source];
        for (int k = 0; k < kVectors; ++k) g[k] += scale * load_lanes(go + kLanes * k);
      } else {
        for (int k = 0; k < kVectors; ++k) g[k] += load_lanes(go + kLanes * k);
      }
      if (c.grad_weights) c.grad_weights[source] = dot(go, w, kDim);
      ++i;
    } while (i < hi && (sorted[i] >> 32) == row);
    apply_rule_lanes<kRule, kDim>(c, static_cast<int64_t>(row), g);
  }
}

template <typename W, Rule kRule, bool kWeighted>
void update_dim(const Context& c, const uint64_t* sorted, int64_t lo, int64_t hi) {
  if constexpr (std::is_same<W, float>::value) {
    switch (c.table.dim) {
      case 16: return update_rows_lanes<kRule, kWeighted, 16>(c, sorted, lo, hi);
      case 32: return update_rows_lanes<kRule, kWeighted, 32>(c, sorted, lo, hi);
      case 64: return update_rows_lanes<kRule, kWeighted, 64>(c, sorted, lo, hi);
      case 128: return update_rows_lanes<kRule, kWeighted, 128>(c, sorted, lo, hi);
      case 256: return update_rows_lanes<kRule, kWeighted, 256>(c, sorted, lo, hi);
      default: return update_rows<W, kRule, kWeighted, 0>(c, sorted, lo, hi);
    }
  } else {
    switch (c.table.dim) {
      case 16: return update_rows<W, kRule, kWeighted, 16>(c, sorted, lo, hi);
      case 32: return update_rows<W, kRule, kWeighted, 32>(c, sorted, lo, hi);
      case 64: return update_rows<W, kRule, kWeighted, 64>(c, sorted, lo, hi);
      case 128: return update_rows<W, kRule, kWeighted, 128>(c, sorted, lo, hi);
      case 256: return update_rows<W, kRule, kWeighted, 256>(c, sorted, lo, hi);
      default: return update_rows<W, kRule, kWeighted, 0>(c, sorted, lo, hi);
    }
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

void update_grouped(const Table& table, const Batch& batch, const float* grad_out,
                    const Update& update, const Groups& g, float* grad_weights, int num_threads) {
  double step_size = 0.0;
  if (update.rule == Rule::kAdam) {
    const double step = static_cast<double>(update.step);
    step_size = update.lr_double * std::sqrt(1.0 - std::pow(update.beta2, step)) /
                (1.0 - std::pow(update.beta1, step));
  }
  const bool pooled_by_position = groups_by_position(batch, grad_weights) && batch.offsets;
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

}  // namespace detail

void backward(const Table& table, const Batch& batch, const float* grad_out, const Update& update,
              float* grad_weights, int num_threads) {
  using namespace detail;
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
  Groups& g = groups_scratch();
  group(table, batch, groups_by_position(batch, grad_weights), g);
  update_grouped(table, batch, grad_out, update, g, grad_weights, num_threads);
}

}  // namespace shardkit
