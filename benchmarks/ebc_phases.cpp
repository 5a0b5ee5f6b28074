// Phases of the compiled EBC kernel, timed alone in thread CPU time (so that a shared machine's
// other processes do not count): forward, grouping (counting sort and radix sort), the grouped
// update (row-wise Adagrad, and SGD as weight decay or threads run it: grouped), whole backward
// (row-wise Adagrad, SGD), each on a table (and state) of 4 KiB pages and
// on a copy of it on 2 MiB pages (advised before the first write), taking turns. Synthetic batch
// as bench_ebc.py's: T tables x R rows x D, batch B, 10-30 ids per bag, uniform or power-law
// ("p"). One command, from the repository root:
//
//   g++ -O3 -std=c++17 -march=native -fopenmp -fno-math-errno -Ishardkit/kernels/csrc
//       benchmarks/ebc_phases.cpp shardkit/kernels/csrc/{forward,grouping,backward}.cpp
//       -o /tmp/ebc_phases && /tmp/ebc_phases 4 100000 64 16384 [p] [reps]
//
// (one line; bash's braces name the three kernel sources)
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "grouping.h"  // the kernel's internals: grouping and the grouped update apart
#include "kernels.h"

using namespace shardkit;
using detail::Groups;

static double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// n floats, 2 MiB-aligned, on 2 MiB pages (huge) or kept off them, filled with `value`.
static float* table_memory(size_t n, bool huge, float value) {
  const size_t page = size_t{2} << 20, bytes = (n * 4 + page - 1) / page * page;
  char* raw = static_cast<char*>(mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (raw == MAP_FAILED) { perror("mmap"); exit(1); }
  char* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + page - 1) & ~(page - 1));
  madvise(aligned, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  float* f = reinterpret_cast<float*>(aligned);
  std::fill(f, f + n, value);
  return f;
}

static long huge_kb() {
  FILE* f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %ld", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  if (argc < 5) { fprintf(stderr, "usage: %s tables rows dim batch [p] [reps]\n", argv[0]); return 2; }
  const int64_t tables = atoi(argv[1]), rows_per = atoi(argv[2]), dim = atoi(argv[3]), batch = atoi(argv[4]);
  const bool power = argc > 5 && argv[5][0] == 'p';
  const int reps = argc > 6 ? atoi(argv[6]) : 7;
  const int64_t R = tables * rows_per, bags = tables * batch;
  std::mt19937_64 rng(0);
  std::vector<int64_t> offsets{0}, ids;
  for (int64_t t = 0; t < tables; ++t)
    for (int64_t b = 0; b < batch; ++b) {
      const int len = 10 + rng() % 21;
      for (int k = 0; k < len; ++k) {
        int64_t id;
        if (!power) {
          id = rng() % rows_per;
        } else {  // P(id = k) ~ 1 / (k + 1), hot rows spread by a hash, as bench_ebc.py
          const double u = (rng() >> 11) * (1.0 / 9007199254740992.0);
          id = (int64_t)std::floor(std::pow(rows_per + 1.0, u)) - 1;
          id = (id * 2654435761LL) % rows_per;
        }
        ids.push_back(id + t * rows_per);
      }
      offsets.push_back(ids.size());
    }
  const int64_t n = ids.size();
  std::vector<float> grad(bags * dim, 0.001f), out(bags * dim);
  Batch batch_{ids.data(), true, n, offsets.data(), bags, nullptr, batch};
  Groups& g = detail::groups_scratch();
  detail::group(Table{nullptr, DType::kFloat, R, dim}, batch_, false, g);
  int64_t unique = 1;
  for (int64_t i = 1; i < n; ++i) unique += (g.sorted[i] >> 32) != (g.sorted[i - 1] >> 32);
  printf("ids %ld unique %ld rows %ld dim %ld %s\n", n, unique, R, dim, power ? "power-law" : "uniform");

  float *weight[2], *state[2];
  for (int huge = 0; huge < 2; ++huge) {
    weight[huge] = table_memory(R * dim, huge, 0.01f);
    state[huge] = table_memory(R, huge, 0.0f);
  }
  printf("AnonHugePages %ld kB (tables + state on 2 MiB pages: %ld kB)\n", huge_kb(),
         (R * dim * 4 + R * 4) >> 10);
  const char* names[] = {"forward",          "group (counting)",   "group (radix)",
                         "update (rowwise)", "backward (rowwise)", "backward (sgd)",
                         "update (sgd)"};
  constexpr int kPhases = 7;
  std::vector<double> t[2][kPhases];
  for (int r = 0; r < reps + 1; ++r)
    for (int huge = 0; huge < 2; ++huge) {
      const Table table{weight[huge], DType::kFloat, R, dim};
      const Update rowwise{Rule::kRowwiseAdagrad, 0.01f, 1e-8f, 0.0f, 0.01, 0.9, 0.999, 1,
                           state[huge], nullptr, nullptr};
      const Update sgd{Rule::kSgd, 0.01f, 1e-8f, 0.0f, 0.01, 0.9, 0.999, 1, nullptr, nullptr, nullptr};
      double mark[kPhases + 1];
      mark[0] = now_ms();
      pooled_forward(table, batch_, out.data(), 1);
      mark[1] = now_ms();
      detail::group(table, batch_, false, g, /*rows_per_id=*/int64_t{1} << 40);
      mark[2] = now_ms();
      detail::group(table, batch_, false, g, /*rows_per_id=*/0);
      mark[3] = now_ms();
      detail::update_grouped(table, batch_, grad.data(), rowwise, g, nullptr, 1);
      mark[4] = now_ms();
      backward(table, batch_, grad.data(), rowwise, nullptr, 1);
      mark[5] = now_ms();
      backward(table, batch_, grad.data(), sgd, nullptr, 1);
      mark[6] = now_ms();
      detail::update_grouped(table, batch_, grad.data(), sgd, g, nullptr, 1);
      mark[7] = now_ms();
      if (r > 0)  // the first round warms caches and faults pages in
        for (int p = 0; p < kPhases; ++p) t[huge][p].push_back(mark[p + 1] - mark[p]);
    }
  std::vector<float> big(64 << 20, 1.0f), big2(64 << 20);
  std::vector<double> copies;
  for (int r = 0; r < 5; ++r) {
    const double s = now_ms();
    std::memcpy(big2.data(), big.data(), big.size() * 4);
    copies.push_back(now_ms() - s);
  }
  const double bw = 2.0 * big.size() * 4 / (median(copies) / 1e3) / 1e9;
  const double floor_b = 2.0 * 8 * n + 3.0 * unique * dim * 4 + 2.0 * unique * 4 + 2.0 * bags * dim * 4;
  printf("copy %.1f GB/s; row-wise step's copy floor %.2f ms\n", bw, floor_b / bw / 1e6);
  printf("%-20s %10s %10s %8s %10s %10s   (median ms of %d, thread CPU time; ns per unique row)\n",
         "phase", "4 KiB", "2 MiB", "2M/4K", "ns 4 KiB", "ns 2 MiB", reps);
  for (int p = 0; p < kPhases; ++p) {
    const double small = median(t[0][p]), huge = median(t[1][p]);
    printf("%-20s %10.2f %10.2f %8.2f %10.1f %10.1f\n", names[p], small, huge, huge / small,
           small * 1e6 / unique, huge * 1e6 / unique);
  }
}
