// The `shardkit::` torch operators and their CPU implementations (see kernels.h).
//
// Schemas take plain tensors and numbers so that the same operators can have a CUDA
// implementation (ops_cuda.cu) and be called from Python as torch.ops.shardkit.<name>.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <iterator>
#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels.h"

namespace shardkit {
namespace {

DType dtype_of(const at::Tensor& weight) {
  switch (weight.scalar_type()) {
    case at::kFloat: return DType::kFloat;
    case at::kHalf: return DType::kHalf;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK_TYPE(false, "shardkit kernels take fp32, fp16 or bf16 tables, got ", weight.scalar_type());
  }
}

// [Note: huge pages for tables]
// A lookup touches rows scattered over the whole table, so with 4 KiB pages nearly every row
// costs a TLB miss and a page walk besides its cache misses (a 100 MB table spans 25,000 pages;
// the TLB holds about 2,000). The first time the kernel sees a table (or optimizer state) of
// 4 MiB or more it asks Linux to back it with 2 MiB pages (MADV_HUGEPAGE for the future,
// MADV_COLLAPSE, Linux >= 6.1, for the pages it already has; the collapse copies the table once,
// about 0.4 ms per MiB here). Measured here (thread CPU time, interleaved, 1 thread), 2 MiB
// pages against 4 KiB ones at 1M-10M rows, dim 64-256: forward 0.55-0.77x, backward 0.65-0.80x
// (benchmarks/results/ebc_huge_pages.md). Only advice: where the OS refuses (THP `never`, an
// old kernel, no free huge page), nothing changes but speed. `set_huge_pages(false)` (Python:
// SHARDKIT_HUGE_PAGES=0) stops the advice for tables not yet seen; `huge_page_stats` says what
// was asked and what the collapse achieved.
struct HugePages {
  std::atomic<bool> enabled{true};
  std::mutex mutex;
  // Ranges advised, each with the storage it was advised for: a table freed and another
  // allocated at the same address (common: glibc hands a freed mapping back) is advised anew.
  std::map<std::pair<uintptr_t, size_t>, c10::weak_intrusive_ptr<c10::StorageImpl>> advised;
  int64_t advised_bytes = 0, collapsed_bytes = 0, refused_bytes = 0;
};

HugePages& huge_pages() {
  static HugePages pages;
  return pages;
}

void advise_huge_pages(const at::Tensor& weight) {
#ifdef MADV_HUGEPAGE
  HugePages& pages = huge_pages();
  if (!pages.enabled.load(std::memory_order_relaxed)) return;
  const size_t huge = size_t{2} << 20, bytes = weight.nbytes();
  if (bytes < 2 * huge) return;
  const uintptr_t start = reinterpret_cast<uintptr_t>(weight.data_ptr());
  const uintptr_t lo = (start + huge - 1) & ~(huge - 1), hi = (start + bytes) & ~(huge - 1);
  if (hi <= lo) return;
  c10::StorageImpl* storage = weight.storage().unsafeGetStorageImpl();
  std::lock_guard<std::mutex> lock(pages.mutex);
  auto seen = pages.advised.find({lo, hi - lo});
  if (seen != pages.advised.end() && !seen->second.expired() &&
      seen->second._unsafe_get_target() == storage)
    return;
  for (auto it = pages.advised.begin(); it != pages.advised.end();)
    it = it->second.expired() ? pages.advised.erase(it) : std::next(it);
  pages.advised.insert_or_assign({lo, hi - lo}, weight.storage().getWeakStorageImpl());
  const int64_t length = static_cast<int64_t>(hi - lo);
  if (madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) != 0) {
    pages.refused_bytes += length;
    return;
  }
  pages.advised_bytes += length;
  if (madvise(reinterpret_cast<void*>(lo), hi - lo, 25 /* MADV_COLLAPSE */) == 0)
    pages.collapsed_bytes += length;
#else
  (void)weight;
#endif
}

// A buffer just allocated, not yet written (a dense gradient): its first writes fault in 2 MiB
// pages. A dense gradient of a table is made anew every step (the optimizer's zero_grad drops
// the last), so without this each step faults in and zeroes every 4 KiB page of it: 114 ms of
// CPU for 205 MB here, 25 ms on 2 MiB pages (8 tables x 100k x 64, a Zen 3 EPYC, loaded).
void advise_fresh(const at::Tensor& buffer) {
#ifdef MADV_HUGEPAGE
  if (!huge_pages().enabled.load(std::memory_order_relaxed)) return;
  const size_t huge = size_t{2} << 20, bytes = buffer.nbytes();
  if (bytes < 2 * huge) return;
  const uintptr_t start = reinterpret_cast<uintptr_t>(buffer.data_ptr());
  const uintptr_t lo = (start + huge - 1) & ~(huge - 1), hi = (start + bytes) & ~(huge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)buffer;
#endif
}

// Python's switch: returns whether the advice was on before.
bool set_huge_pages(bool enabled) { return huge_pages().enabled.exchange(enabled); }

// [enabled, bytes advised, bytes collapsed onto 2 MiB pages, bytes whose advice was refused]
std::vector<int64_t> huge_page_stats() {
  HugePages& pages = huge_pages();
  std::lock_guard<std::mutex> lock(pages.mutex);
  return {int64_t{pages.enabled.load()}, pages.advised_bytes, pages.collapsed_bytes,
          pages.refused_bytes};
}

Table table_of(const at::Tensor& weight) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.is_contiguous(),
              "weight must be a contiguous 2-D CPU tensor, got ", weight.sizes());
  advise_huge_pages(weight);
  return Table{weight.data_ptr(), dtype_of(weight), weight.size(0), weight.size(1)};
}

Batch batch_of(const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
               const std::optional<at::Tensor>& weights, int64_t batch_size = 0) {
  TORCH_CHECK(ids.dim() == 1 && ids.is_contiguous() &&
                  (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt),
              "ids must be a contiguous 1-D int32 or int64 tensor");
  Batch b{ids.data_ptr(), ids.scalar_type() == at::kLong, ids.numel(), nullptr, 0, nullptr, 0};
  if (offsets.has_value()) {
    TORCH_CHECK(offsets->dim() == 1 && offsets->numel() >= 1 && offsets->is_contiguous() &&
                    offsets->scalar_type() == at::kLong,
                "offsets must be a contiguous 1-D int64 tensor of num_bags + 1 entries");
    b.offsets = offsets->data_ptr<int64_t>();
    b.num_bags = offsets->numel() - 1;
    TORCH_CHECK(batch_size >= 0 && (batch_size == 0 || b.num_bags % batch_size == 0),
                "batch_size (", batch_size, ") must divide the number of bags (", b.num_bags, ")");
    b.batch_size = batch_size;
  }
  if (weights.has_value()) {
    TORCH_CHECK(weights->numel() == ids.numel() && weights->is_contiguous() &&
                    weights->scalar_type() == at::kFloat,
                "per_sample_weights must be contiguous fp32 with one weight per id");
    b.weights = weights->data_ptr<float>();
  }
  return b;
}

// Kernel errors as torch's: IndexError for a bad id (as F.embedding_bag), ValueError otherwise.
template <typename Fn>
void run_kernel(Fn fn) {
  try {
    fn();
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, e.what());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

at::Tensor pooled_forward_cpu(const at::Tensor& weight, const at::Tensor& ids,
                              const at::Tensor& offsets,
                              const std::optional<at::Tensor>& per_sample_weights,
                              int64_t batch_size) {
  Table table = table_of(weight);
  Batch batch = batch_of(ids, offsets, per_sample_weights, batch_size);
  at::Tensor out = at::empty({batch.num_bags, table.dim}, weight.options());
  run_kernel([&] { pooled_forward(table, batch, out.data_ptr(), at::get_num_threads()); });
  return out;
}

float* state_ptr(const std::vector<at::Tensor>& state, size_t index, int64_t numel) {
  if (index >= state.size()) return nullptr;
  const at::Tensor& s = state[index];
  TORCH_CHECK(s.device().is_cpu() && s.is_contiguous() && s.scalar_type() == at::kFloat &&
                  s.numel() == numel,
              "optimizer state ", index, " must be contiguous fp32 with ", numel, " entries");
  advise_huge_pages(s);  // Adagrad's and Adam's state are as large as the table
  return s.data_ptr<float>();
}

// Updates `weight` (and `state`) in place; returns d loss / d per_sample_weights when asked.
std::optional<at::Tensor> fused_backward_cpu(
    const at::Tensor& weight, const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
    const std::optional<at::Tensor>& per_sample_weights, const at::Tensor& grad_out,
    const std::vector<at::Tensor>& state, int64_t rule, double lr, double eps, double weight_decay,
    double beta1, double beta2, int64_t step, bool grad_per_sample_weights, int64_t batch_size) {
  Table table = table_of(weight);
  Batch batch = batch_of(ids, offsets, per_sample_weights, batch_size);
  const int64_t grad_rows = offsets.has_value() ? batch.num_bags : batch.num_ids;
  TORCH_CHECK(grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.dim() == 2 && grad_out.size(0) == grad_rows &&
                  grad_out.size(1) == table.dim,
              "grad_out must be contiguous fp32 [", grad_rows, ", ", table.dim, "]");
  TORCH_CHECK(rule >= 1 && rule <= 4, "unknown rule ", rule);
  Update update{static_cast<Rule>(rule), float(lr), float(eps), float(weight_decay), lr, beta1,
                beta2, step, nullptr, nullptr, nullptr};
  const int64_t per_row = static_cast<Rule>(rule) == Rule::kRowwiseAdagrad ? 1 : table.dim;
  update.state1 = state_ptr(state, 0, table.num_rows * per_row);
  update.state2 = state_ptr(state, 1, table.num_rows * per_row);
  TORCH_CHECK(update.rule == Rule::kSgd || update.state1, "the rule needs its optimizer state");
  TORCH_CHECK(update.rule != Rule::kAdam || update.state2, "Adam needs exp_avg and exp_avg_sq");
  std::optional<at::Tensor> grad_weights;
  if (grad_per_sample_weights) grad_weights = at::empty({batch.num_ids}, grad_out.options());
  float* gw = grad_weights.has_value() ? grad_weights->data_ptr<float>() : nullptr;
  run_kernel([&] { backward(table, batch, grad_out.data_ptr<float>(), update, gw, at::get_num_threads()); });
  return grad_weights;
}

// The dense gradient [num_rows, dim] (weight's dtype), and d loss / d per_sample_weights if asked.
std::tuple<at::Tensor, std::optional<at::Tensor>> dense_backward_cpu(
    const at::Tensor& weight, const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
    const std::optional<at::Tensor>& per_sample_weights, const at::Tensor& grad_out,
    bool grad_per_sample_weights, int64_t batch_size) {
  Table table = table_of(weight);
  Batch batch = batch_of(ids, offsets, per_sample_weights, batch_size);
  const int64_t grad_rows = offsets.has_value() ? batch.num_bags : batch.num_ids;
  TORCH_CHECK(grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.dim() == 2 && grad_out.size(0) == grad_rows &&
                  grad_out.size(1) == table.dim,
              "grad_out must be contiguous fp32 [", grad_rows, ", ", table.dim, "]");
  at::Tensor grad = at::empty(weight.sizes(), weight.options());
  advise_fresh(grad);
  grad.zero_();
  Update update{Rule::kDense, 0, 0, 0, 0, 0, 0, 0, nullptr, nullptr, grad.data_ptr()};
  std::optional<at::Tensor> grad_weights;
  if (grad_per_sample_weights) grad_weights = at::empty({batch.num_ids}, grad_out.options());
  float* gw = grad_weights.has_value() ? grad_weights->data_ptr<float>() : nullptr;
  run_kernel([&] { backward(table, batch, grad_out.data_ptr<float>(), update, gw, at::get_num_threads()); });
  return {grad, grad_weights};
}

}  // namespace
}  // namespace shardkit

TORCH_LIBRARY(shardkit, m) {
  // batch_size > 0: bags are keys x batch_size examples, key-major, and the pooled rows
  // (output, grad_out) example-major: [batch_size, keys * dim], a KeyedTensor's layout.
  m.def(
      "pooled_forward(Tensor weight, Tensor ids, Tensor offsets, Tensor? per_sample_weights, "
      "int batch_size=0) -> Tensor");
  m.def(
      "fused_backward(Tensor(a!) weight, Tensor ids, Tensor? offsets, Tensor? per_sample_weights, "
      "Tensor grad_out, Tensor(b!)[] state, int rule, float lr, float eps, float weight_decay, "
      "float beta1, float beta2, int step, bool grad_per_sample_weights, int batch_size=0) "
      "-> Tensor?");
  m.def(
      "dense_backward(Tensor weight, Tensor ids, Tensor? offsets, Tensor? per_sample_weights, "
      "Tensor grad_out, bool grad_per_sample_weights, int batch_size=0) -> (Tensor, Tensor?)");
  // See [Note: huge pages for tables]: not per-device, so registered without a dispatch key.
  m.def("set_huge_pages(bool enabled) -> bool", &shardkit::set_huge_pages);
  m.def("huge_page_stats() -> int[]", &shardkit::huge_page_stats);
}

TORCH_LIBRARY_IMPL(shardkit, CPU, m) {
  m.impl("pooled_forward", &shardkit::pooled_forward_cpu);
  m.impl("fused_backward", &shardkit::fused_backward_cpu);
  m.impl("dense_backward", &shardkit::dense_backward_cpu);
}
