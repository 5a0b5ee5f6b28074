// Grouping a batch's ids by row for the fused backward: a counting sort on the row where the
// table has few rows for the batch, an LSD radix sort otherwise.
//
// See [Note: compiled kernel] in shardkit/kernels/__init__.py.
#include "grouping.h"

#include "common.h"

namespace shardkit {
namespace detail {
namespace {

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

}  // namespace

Groups& groups_scratch() {
  thread_local Groups groups;
  return groups;
}

// LSD radix sort on the row (the high 32 bits), as few passes as the number of rows needs; or
// a counting sort where the rows are few (see [Note: grouping by counting]); `rows_per_id`
// moves that threshold (for benchmarks of either sort).
void group(const Table& t, const Batch& b, bool by_position, Groups& g, int64_t rows_per_id) {
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

}  // namespace detail
}  // namespace shardkit
