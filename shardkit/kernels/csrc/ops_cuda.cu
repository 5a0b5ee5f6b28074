// CUDA implementations of the shardkit:: operators (schemas in ops_cpu.cpp), built beside the CPU
// ones where torch sees a GPU and nvcc is installed. See [Note: compiled kernel].
//
// NOT RUN on the project's development machine (it has no GPU): tests/kernels runs them, marked
// `gpu`, against the eager kernel on any machine with CUDA.
//
// Forward: one warp per bag, lanes across the dim. Backward: the ids grouped by row with torch's
// own sort (stable) and unique_consecutive, then one warp per unique row sums the row's gradient
// from its occurrences (per-sample weights applied) in registers and applies the rule in place,
// with the eager rule's arithmetic (shardkit/optim/_rules.py) in fp32.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>

namespace shardkit_cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kMaxPerLane = 32;  // dim <= 1024

enum Rule : int { kDense = 0, kSgd = 1, kAdagrad = 2, kRowwiseAdagrad = 3, kAdam = 4 };

struct Hyper {
  float lr, eps, weight_decay, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size;
};

template <typename W>
__device__ __forceinline__ float to_float(W x) {
  return static_cast<float>(x);
}
template <typename W>
__device__ __forceinline__ W from_float(float x) {
  return static_cast<W>(x);
}
// `w += delta` as the eager rule: the step rounded to the weight's dtype, then added.
template <typename W>
__device__ __forceinline__ void add_step(W* w, float delta) {
  *w = from_float<W>(to_float(*w) + to_float(from_float<W>(delta)));
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// bad[0]: 1 = an id out of range, 2 = offsets that do not cover the ids in order.
template <typename W, typename Id>
__global__ void pooled_forward_kernel(const W* __restrict__ weight, int64_t num_rows, int64_t dim,
                                      const Id* __restrict__ ids, int64_t num_ids,
                                      const int64_t* __restrict__ offsets,
                                      const float* __restrict__ psw, int64_t num_bags,
                                      int64_t batch_size, W* __restrict__ out,
                                      int* __restrict__ bad) {
  const int64_t bag = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (bag >= num_bags) return;
  const int64_t lo = offsets[bag], hi = offsets[bag + 1];
  if (hi < lo || (bag == 0 && lo != 0) || (bag == num_bags - 1 && hi != num_ids)) {
    *bad = 2;
    return;
  }
  for (int64_t d = lane; d < dim; d += kWarp) {
    float acc = 0.0f;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t id = static_cast<int64_t>(ids[i]);
      if (id < 0 || id >= num_rows) {
        *bad = 1;
        continue;
      }
      acc += (psw ? psw[i] : 1.0f) * to_float(weight[id * dim + d]);
    }
    const int64_t row = batch_size > 0
                            ? (bag % batch_size) * (num_bags / batch_size) + bag / batch_size
                            : bag;
    out[row * dim + d] = from_float<W>(acc);
  }
}

template <typename W, int kRule, int kPerLane>
__global__ void update_kernel(W* __restrict__ weight, int64_t dim,
                              const int64_t* __restrict__ unique_rows,
                              const int64_t* __restrict__ run_starts, int64_t num_unique,
                              const int64_t* __restrict__ order,
                              const int64_t* __restrict__ grad_rows,
                              const float* __restrict__ psw, const float* __restrict__ grad_out,
                              float* __restrict__ state1, float* __restrict__ state2, Hyper h,
                              W* __restrict__ dense_grad, float* __restrict__ grad_weights) {
  const int64_t u = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (u >= num_unique) return;  // the same for every lane of the warp
  const int64_t row = unique_rows[u];
  W* w = weight + row * dim;
  float g[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) g[k] = 0.0f;
  for (int64_t j = run_starts[u]; j < run_starts[u + 1]; ++j) {
    const int64_t position = order[j];
    const float* go = grad_out + grad_rows[j] * dim;
    const float scale = psw ? psw[position] : 1.0f;
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t d = lane + int64_t(k) * kWarp;
      if (d < dim) {
        g[k] += scale * go[d];
        if (grad_weights) dot += go[d] * to_float(w[d]);
      }
    }
    if (grad_weights) {
      dot = warp_sum(dot);
      if (lane == 0) grad_weights[position] = dot;
    }
  }
  if constexpr (kRule == kDense) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t d = lane + int64_t(k) * kWarp;
      if (d < dim) dense_grad[row * dim + d] = from_float<W>(g[k]);
    }
    return;
  }
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + int64_t(k) * kWarp;
    if (d < dim) {
      if (h.weight_decay != 0.0f) g[k] = g[k] + h.weight_decay * to_float(w[d]);
      squares += g[k] * g[k];
    }
  }
  float row_scale = 0.0f;
  if (kRule == kRowwiseAdagrad) {
    const float norm = sqrtf(warp_sum(squares));
    const float sum = state1[row] + (1.0f / static_cast<float>(dim)) * norm * norm;
    __syncwarp();
    if (lane == 0) state1[row] = sum;
    row_scale = (1.0f / (sqrtf(sum) + h.eps)) * -h.lr;
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + int64_t(k) * kWarp;
    if (d >= dim) continue;
    if (kRule == kSgd) {
      add_step(w + d, g[k] * -h.lr);
    } else if (kRule == kAdagrad) {
      const float sum = state1[row * dim + d] + g[k] * g[k];
      state1[row * dim + d] = sum;
      add_step(w + d, (g[k] / (sqrtf(sum) + h.eps)) * -h.lr);
    } else if (kRule == kRowwiseAdagrad) {
      add_step(w + d, g[k] * row_scale);
    } else if (kRule == kAdam) {
      const float m = state1[row * dim + d] * h.beta1 + h.one_minus_beta1 * g[k];
      const float v = state2[row * dim + d] * h.beta2 + h.one_minus_beta2 * g[k] * g[k];
      state1[row * dim + d] = m;
      state2[row * dim + d] = v;
      add_step(w + d, (m / (sqrtf(v) + h.eps)) * -h.step_size);
    }
  }
}

void check_bad(const at::Tensor& bad) {
  const int code = bad.item<int>();
  TORCH_CHECK_INDEX(code != 1, "an id is out of range: ids must satisfy 0 <= id < num_rows");
  TORCH_CHECK_VALUE(code != 2, "offsets must start at 0, not decrease, and end at the number of ids");
}

int blocks_for(int64_t warps) { return static_cast<int>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// The CPU operators' checks (ops_cpu.cpp), plus one the CPU never needs: every tensor on the
// table's GPU. A kernel handed a host pointer or another GPU's memory would fault or, worse,
// read whatever lies there, so nothing reaches a launch unchecked.
void check_on(const at::Tensor& weight, const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device() == weight.device(), what, " must be on the table's device ",
              weight.device(), ", got ", t.device());
}

void check_batch(const at::Tensor& weight, const at::Tensor& ids,
                 const std::optional<at::Tensor>& offsets,
                 const std::optional<at::Tensor>& per_sample_weights, int64_t batch_size) {
  TORCH_CHECK(weight.is_cuda() && weight.dim() == 2 && weight.is_contiguous(),
              "weight must be a contiguous 2-D CUDA tensor, got ", weight.sizes());
  check_on(weight, ids, "ids");
  TORCH_CHECK(ids.dim() == 1 && ids.is_contiguous() &&
                  (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt),
              "ids must be a contiguous 1-D int32 or int64 tensor");
  if (offsets.has_value()) {
    check_on(weight, *offsets, "offsets");
    TORCH_CHECK(offsets->dim() == 1 && offsets->numel() >= 1 && offsets->is_contiguous() &&
                    offsets->scalar_type() == at::kLong,
                "offsets must be a contiguous 1-D int64 tensor of num_bags + 1 entries");
    const int64_t num_bags = offsets->numel() - 1;
    TORCH_CHECK(batch_size >= 0 && (batch_size == 0 || num_bags % batch_size == 0),
                "batch_size (", batch_size, ") must divide the number of bags (", num_bags, ")");
  }
  if (per_sample_weights.has_value()) {
    check_on(weight, *per_sample_weights, "per_sample_weights");
    TORCH_CHECK(per_sample_weights->numel() == ids.numel() && per_sample_weights->is_contiguous() &&
                    per_sample_weights->scalar_type() == at::kFloat,
                "per_sample_weights must be contiguous fp32 with one weight per id");
  }
}

void check_grad_out(const at::Tensor& weight, const at::Tensor& ids,
                    const std::optional<at::Tensor>& offsets, const at::Tensor& grad_out) {
  check_on(weight, grad_out, "grad_out");
  const int64_t rows = offsets.has_value() ? offsets->numel() - 1 : ids.numel();
  TORCH_CHECK(grad_out.scalar_type() == at::kFloat && grad_out.is_contiguous() &&
                  grad_out.dim() == 2 && grad_out.size(0) == rows &&
                  grad_out.size(1) == weight.size(1),
              "grad_out must be contiguous fp32 [", rows, ", ", weight.size(1), "]");
}

float* state_ptr(const at::Tensor& weight, const std::vector<at::Tensor>& state, size_t index,
                 int64_t numel) {
  if (index >= state.size()) return nullptr;
  const at::Tensor& s = state[index];
  check_on(weight, s, "optimizer state");
  TORCH_CHECK(s.is_contiguous() && s.scalar_type() == at::kFloat && s.numel() == numel,
              "optimizer state ", index, " must be contiguous fp32 with ", numel, " entries");
  return s.data_ptr<float>();
}

template <typename Fn>
void dispatch_weight(const at::Tensor& weight, Fn fn) {
  switch (weight.scalar_type()) {
    case at::kFloat: return fn(float{});
    case at::kHalf: return fn(at::Half{});
    case at::kBFloat16: return fn(at::BFloat16{});
    default: TORCH_CHECK_TYPE(false, "shardkit kernels take fp32, fp16 or bf16 tables, got ", weight.scalar_type());
  }
}

at::Tensor pooled_forward_cuda(const at::Tensor& weight, const at::Tensor& ids,
                               const at::Tensor& offsets,
                               const std::optional<at::Tensor>& per_sample_weights,
                               int64_t batch_size) {
  c10::cuda::CUDAGuard guard(weight.device());
  check_batch(weight, ids, offsets, per_sample_weights, batch_size);
  const int64_t num_bags = offsets.numel() - 1, dim = weight.size(1);
  at::Tensor out = at::empty({num_bags, dim}, weight.options());
  if (num_bags <= 0 || dim == 0) return out;
  at::Tensor bad = at::zeros({1}, weight.options().dtype(at::kInt));
  const float* psw = per_sample_weights.has_value() ? per_sample_weights->data_ptr<float>() : nullptr;
  auto stream = at::cuda::getCurrentCUDAStream();
  dispatch_weight(weight, [&](auto w_tag) {
    using W = decltype(w_tag);
    auto launch = [&](auto id_tag) {
      using Id = decltype(id_tag);
      pooled_forward_kernel<W, Id><<<blocks_for(num_bags), kWarpsPerBlock * kWarp, 0, stream>>>(
          weight.data_ptr<W>(), weight.size(0), dim, ids.data_ptr<Id>(), ids.numel(),
          offsets.data_ptr<int64_t>(), psw, num_bags, batch_size, out.data_ptr<W>(),
          bad.data_ptr<int>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (ids.scalar_type() == at::kLong) launch(int64_t{}); else launch(int32_t{});
  });
  check_bad(bad);
  return out;
}

// Occurrences grouped by row: rows [U], run starts [U + 1], positions and gradient rows [N].
struct Runs {
  at::Tensor unique, starts, order, grad_rows;
};

Runs group(const at::Tensor& ids, const std::optional<at::Tensor>& offsets, int64_t num_rows,
           int64_t batch_size) {
  at::Tensor keys = ids.to(at::kLong);
  auto [sorted, order] = at::sort(keys, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  if (sorted.numel() > 0) {
    const bool bad = at::logical_or(sorted[0] < 0, sorted[-1] >= num_rows).item<bool>();
    TORCH_CHECK_INDEX(!bad, "an id is out of range: ids must satisfy 0 <= id < num_rows = ", num_rows);
  }
  auto [unique, inverse, counts] = at::unique_consecutive(sorted, false, true);
  at::Tensor starts = at::zeros({unique.numel() + 1}, keys.options());
  starts.slice(0, 1).copy_(at::cumsum(counts, 0));
  at::Tensor grad_rows = order;
  if (offsets.has_value()) {
    const int64_t num_bags = offsets->numel() - 1;
    at::Tensor lengths = offsets->slice(0, 1) - offsets->slice(0, 0, num_bags);
    at::Tensor rows = at::arange(num_bags, keys.options());
    if (batch_size > 0)  // bag (k, b) -> pooled row b * keys + k
      rows = rows.remainder(batch_size) * (num_bags / batch_size) + rows.div(batch_size, "floor");
    at::Tensor bag_of = at::repeat_interleave(rows, lengths, 0, ids.numel());
    grad_rows = bag_of.index_select(0, order);
  }
  return {unique, starts, order, grad_rows};
}

template <typename W, int kRule>
void launch_update(const at::Tensor& weight, const Runs& runs, const float* psw,
                   const at::Tensor& grad_out, float* state1, float* state2, const Hyper& h,
                   W* dense_grad, float* grad_weights) {
  const int64_t dim = weight.size(1), num_unique = runs.unique.numel();
  if (num_unique == 0) return;
  auto stream = at::cuda::getCurrentCUDAStream();
  auto go = [&](auto per_lane) {
    constexpr int kPerLane = decltype(per_lane)::value;
    update_kernel<W, kRule, kPerLane><<<blocks_for(num_unique), kWarpsPerBlock * kWarp, 0, stream>>>(
        weight.data_ptr<W>(), dim, runs.unique.data_ptr<int64_t>(), runs.starts.data_ptr<int64_t>(),
        num_unique, runs.order.data_ptr<int64_t>(), runs.grad_rows.data_ptr<int64_t>(), psw,
        grad_out.data_ptr<float>(), state1, state2, h, dense_grad, grad_weights);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  TORCH_CHECK(dim <= kWarp * kMaxPerLane, "the CUDA kernel takes dim <= ", kWarp * kMaxPerLane);
  if (dim <= 32) go(std::integral_constant<int, 1>{});
  else if (dim <= 64) go(std::integral_constant<int, 2>{});
  else if (dim <= 128) go(std::integral_constant<int, 4>{});
  else if (dim <= 256) go(std::integral_constant<int, 8>{});
  else if (dim <= 512) go(std::integral_constant<int, 16>{});
  else go(std::integral_constant<int, 32>{});
}

template <typename W>
void update_for_rule(int64_t rule, const at::Tensor& weight, const Runs& runs, const float* psw,
                     const at::Tensor& grad_out, float* s1, float* s2, const Hyper& h, W* dense,
                     float* gw) {
  switch (rule) {
    case kDense: return launch_update<W, kDense>(weight, runs, psw, grad_out, s1, s2, h, dense, gw);
    case kSgd: return launch_update<W, kSgd>(weight, runs, psw, grad_out, s1, s2, h, dense, gw);
    case kAdagrad: return launch_update<W, kAdagrad>(weight, runs, psw, grad_out, s1, s2, h, dense, gw);
    case kRowwiseAdagrad:
      return launch_update<W, kRowwiseAdagrad>(weight, runs, psw, grad_out, s1, s2, h, dense, gw);
    case kAdam: return launch_update<W, kAdam>(weight, runs, psw, grad_out, s1, s2, h, dense, gw);
    default: TORCH_CHECK(false, "unknown rule ", rule);
  }
}

std::optional<at::Tensor> fused_backward_cuda(
    const at::Tensor& weight, const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
    const std::optional<at::Tensor>& per_sample_weights, const at::Tensor& grad_out,
    const std::vector<at::Tensor>& state, int64_t rule, double lr, double eps, double weight_decay,
    double beta1, double beta2, int64_t step, bool grad_per_sample_weights, int64_t batch_size) {
  c10::cuda::CUDAGuard guard(weight.device());
  check_batch(weight, ids, offsets, per_sample_weights, batch_size);
  check_grad_out(weight, ids, offsets, grad_out);
  TORCH_CHECK(rule >= kSgd && rule <= kAdam, "unknown rule ", rule);
  const int64_t per_row = rule == kRowwiseAdagrad ? 1 : weight.size(1);
  float* s1 = state_ptr(weight, state, 0, weight.size(0) * per_row);
  float* s2 = state_ptr(weight, state, 1, weight.size(0) * per_row);
  TORCH_CHECK(rule == kSgd || s1, "the rule needs its optimizer state");
  TORCH_CHECK(rule != kAdam || s2, "Adam needs exp_avg and exp_avg_sq");
  const double step_size = lr * std::sqrt(1.0 - std::pow(beta2, double(step))) / (1.0 - std::pow(beta1, double(step)));
  Hyper h{float(lr), float(eps), float(weight_decay), float(beta1), float(beta2),
          float(1.0 - beta1), float(1.0 - beta2), float(rule == kAdam ? step_size : 0.0)};
  Runs runs = group(ids, offsets, weight.size(0), batch_size);
  std::optional<at::Tensor> grad_weights;
  if (grad_per_sample_weights) grad_weights = at::empty({ids.numel()}, grad_out.options());
  float* gw = grad_weights.has_value() ? grad_weights->data_ptr<float>() : nullptr;
  const float* psw = per_sample_weights.has_value() ? per_sample_weights->data_ptr<float>() : nullptr;
  dispatch_weight(weight, [&](auto w_tag) {
    using W = decltype(w_tag);
    update_for_rule<W>(rule, weight, runs, psw, grad_out, s1, s2, h, nullptr, gw);
  });
  return grad_weights;
}

std::tuple<at::Tensor, std::optional<at::Tensor>> dense_backward_cuda(
    const at::Tensor& weight, const at::Tensor& ids, const std::optional<at::Tensor>& offsets,
    const std::optional<at::Tensor>& per_sample_weights, const at::Tensor& grad_out,
    bool grad_per_sample_weights, int64_t batch_size) {
  c10::cuda::CUDAGuard guard(weight.device());
  check_batch(weight, ids, offsets, per_sample_weights, batch_size);
  check_grad_out(weight, ids, offsets, grad_out);
  at::Tensor grad = at::zeros_like(weight);
  Runs runs = group(ids, offsets, weight.size(0), batch_size);
  std::optional<at::Tensor> grad_weights;
  if (grad_per_sample_weights) grad_weights = at::empty({ids.numel()}, grad_out.options());
  float* gw = grad_weights.has_value() ? grad_weights->data_ptr<float>() : nullptr;
  const float* psw = per_sample_weights.has_value() ? per_sample_weights->data_ptr<float>() : nullptr;
  Hyper h{};
  dispatch_weight(weight, [&](auto w_tag) {
    using W = decltype(w_tag);
    update_for_rule<W>(kDense, weight, runs, psw, grad_out, nullptr, nullptr, h, grad.data_ptr<W>(), gw);
  });
  return {grad, grad_weights};
}

}  // namespace
}  // namespace shardkit_cuda

TORCH_LIBRARY_IMPL(shardkit, CUDA, m) {
  m.impl("pooled_forward", &shardkit_cuda::pooled_forward_cuda);
  m.impl("fused_backward", &shardkit_cuda::fused_backward_cuda);
  m.impl("dense_backward", &shardkit_cuda::dense_backward_cuda);
}
