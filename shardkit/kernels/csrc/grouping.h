// The grouped backward's two halves: the batch's occurrences grouped by row (grouping.cpp),
// then each row's gradient summed and the rule applied (backward.cpp). Separate so that
// benchmarks/ebc_phases.cpp can time them apart.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels.h"

namespace shardkit {
namespace detail {

// Occurrences as (row << 32 | source), sorted by row, stable; `source` is the occurrence's
// position, or its bag's gradient row when that is all backward needs (pooled, unweighted).
struct Groups {
  std::vector<uint64_t> keys, spare;
  std::vector<int32_t> bag_of;  // [num_ids] pooled row of each id, when sources are positions
  std::vector<uint32_t> counts;
  const uint64_t* sorted = nullptr;
};

// This thread's Groups, reused across calls (fresh pages cost more than the sort).
Groups& groups_scratch();

// Where num_rows <= kCountingRowsPerId * num_ids, a counting sort on the row (see [Note:
// grouping by counting] in grouping.cpp); else an LSD radix sort.
constexpr int64_t kCountingRowsPerId = 2;

// Fills `g` with the batch's occurrences (row << 32 | source) sorted by row, stable; checks the
// ids (std::out_of_range). `rows_per_id` moves the counting/radix threshold (for benchmarks).
void group(const Table& t, const Batch& b, bool by_position, Groups& g,
           int64_t rows_per_id = kCountingRowsPerId);

// Sources are positions (not gradient rows) when the batch is weighted, the weights' gradient
// is asked for, or there are no bags (per id).
inline bool groups_by_position(const Batch& b, const float* grad_weights) {
  return b.weights != nullptr || grad_weights != nullptr || !b.offsets;
}

// The grouped update: every row of `g` (grouped as groups_by_position says) gets its summed
// gradient and `update`'s rule, in place.
void update_grouped(const Table& table, const Batch& batch, const float* grad_out,
                    const Update& update, const Groups& g, float* grad_weights, int num_threads);

}  // namespace detail
}  // namespace shardkit
