// shardkit's CPU embedding kernels, free of torch headers (they compile in a few seconds).
//
// See [Note: compiled kernel] in shardkit/kernels/__init__.py. `ops_cpu.cpp` unpacks tensors into
// these plain structs and registers the torch operators.
#pragma once

#include <cstdint>

namespace shardkit {

enum class DType : int { kFloat = 0, kHalf = 1, kBFloat16 = 2 };

// The update applied to each touched row; kDense writes the summed gradient instead.
enum class Rule : int { kDense = 0, kSgd = 1, kAdagrad = 2, kRowwiseAdagrad = 3, kAdam = 4 };

// The stacked tables: [num_rows, dim], row-major, of `dtype`.
struct Table {
  void* data;
  DType dtype;
  int64_t num_rows;
  int64_t dim;
};

// A batch of ids: pooled into bags (offsets given) or one output row per id (offsets null).
struct Batch {
  const void* ids;  // [num_ids] int32 or int64
  bool ids_are_int64;
  int64_t num_ids;
  const int64_t* offsets;  // [num_bags + 1], offsets[0] == 0, offsets[num_bags] == num_ids; or null
  int64_t num_bags;
  const float* weights;  // [num_ids] per-sample weights (MEAN folded in), or null
  // > 0: the bags are num_bags / batch_size keys x batch_size examples (key-major), and pooled
  // rows (out, grad_out) are example-major: bag (k, b) is row b * num_keys + k of [num_bags, dim]
  int64_t batch_size;
};


struct Update {
  Rule rule;
  float lr, eps, weight_decay;
  double lr_double, beta1, beta2;  // Adam's constants, computed in double as the eager rule does
  int64_t step;  // Adam's step count, >= 1
  float* state1;  // momentum1 ([R, D] Adagrad, [R] row-wise) or exp_avg ([R, D] Adam)
  float* state2;  // exp_avg_sq ([R, D] Adam)
  void* dense_grad;  // kDense: [R, D] of the table's dtype, zero-filled by the caller
};

// out [num_bags, dim] (table's dtype) = per-bag weighted sums of the rows. Throws
// std::out_of_range for an id outside [0, num_rows), std::invalid_argument for bad offsets.
void pooled_forward(const Table& table, const Batch& batch, void* out, int num_threads);

// Sums each touched row's gradient from `grad_out` ([num_bags, dim] pooled, [num_ids, dim] per
// id; fp32) and applies `update` to the row in place. `grad_weights` ([num_ids] or null) receives
// d loss / d weights[i] = <grad_out[bag of i], row before the update>.
void backward(const Table& table, const Batch& batch, const float* grad_out, const Update& update,
              float* grad_weights, int num_threads);

}  // namespace shardkit
