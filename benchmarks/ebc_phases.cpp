// Phases of the compiled EBC kernel, timed alone in thread CPU time (so that a shared machine's
// other processes do not count): forward, grouping, the grouped update, whole backward (row-wise
// Adagrad, SGD). Synthetic batch as bench_ebc.py's: T tables x R rows x D, batch B, 10-30 ids per
// bag, uniform or power-law ("p"). One command, from the repository root:
//
//   g++ -O3 -std=c++17 -march=native -fopenmp -fno-math-errno -Ishardkit/kernels/csrc \
//       benchmarks/ebc_phases.cpp -o /tmp/ebc_phases && /tmp/ebc_phases 4 100000 64 16384 [p]
#include "kernels.cpp"  // the kernel's own source, its internals (grouping) included
#include <chrono>
#include <cstdio>
#include <random>
#include <cstdlib>
using namespace shardkit;
static double now() { timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6; }
template <class F> double best(F f, int reps = 7) { std::vector<double> t; for (int r = 0; r < reps; ++r) { double s = now(); f(); t.push_back(now() - s);} std::sort(t.begin(), t.end()); return t[reps/2]; }
int main(int argc, char** argv) {
  int64_t tables = atoi(argv[1]), rows_per = atoi(argv[2]), dim = atoi(argv[3]), batch = atoi(argv[4]);
  bool power = argc > 5 && argv[5][0] == 'p';
  int64_t R = tables * rows_per, bags = tables * batch;
  std::mt19937_64 rng(0);
  std::vector<int64_t> offsets{0}; std::vector<int64_t> ids;
  for (int64_t t = 0; t < tables; ++t) for (int64_t b = 0; b < batch; ++b) {
    int len = 10 + rng() % 21;
    for (int k = 0; k < len; ++k) {
      int64_t id;
      if (!power) id = rng() % rows_per; else { double u = (rng() >> 11) * (1.0/9007199254740992.0); id = (int64_t)std::floor(std::pow(rows_per + 1.0, u)) - 1; id = (id * 2654435761LL) % rows_per; }
      ids.push_back(id + t * rows_per);
    }
    offsets.push_back(ids.size());
  }
  int64_t n = ids.size();
  std::vector<float> weight(R * dim, 0.01f), state(R, 0.0f), grad(bags * dim, 0.001f), out(bags * dim);
  Table table{weight.data(), DType::kFloat, R, dim};
  Batch batch_{ids.data(), true, n, offsets.data(), bags, nullptr, batch};
  Update upd{Rule::kRowwiseAdagrad, 0.01f, 1e-8f, 0.0f, 0.01, 0.9, 0.999, 1, state.data(), nullptr, nullptr};
  Update sgd{Rule::kSgd, 0.01f, 1e-8f, 0.0f, 0.01, 0.9, 0.999, 1, nullptr, nullptr, nullptr};
  Groups& g = groups_scratch();
  group(table, batch_, false, g);
  int64_t unique = 1; for (int64_t i = 1; i < n; ++i) unique += (g.sorted[i] >> 32) != (g.sorted[i-1] >> 32);
  printf("ids %ld unique %ld rows %ld dim %ld\n", n, unique, R, dim);
  double fwd = best([&]{ pooled_forward(table, batch_, out.data(), 1); });
  double grp = best([&]{ group(table, batch_, false, g); });
  Context c{table, upd, grad.data(), nullptr, nullptr, nullptr, 0.0f};
  double upd_t = best([&]{ backward_typed<float>(c, g.sorted, n, 1); });
  double bwd = best([&]{ backward(table, batch_, grad.data(), upd, nullptr, 1); });
  double bsgd = best([&]{ backward(table, batch_, grad.data(), sgd, nullptr, 1); });
  std::vector<float> big(64 << 20, 1.0f), big2(64 << 20);
  double cp = best([&]{ std::memcpy(big2.data(), big.data(), big.size() * 4); });
  double bw = 2.0 * big.size() * 4 / (cp / 1e3) / 1e9;
  double floor_b = 2.0 * 8 * n + 3.0 * unique * dim * 4 + 2.0 * unique * 4 + 2.0 * bags * dim * 4;
  printf("copy %.1f GB/s floor %.2f ms\n", bw, floor_b / bw / 1e6);
  printf("forward %.2f  group %.2f  update(rowwise) %.2f  backward(rowwise) %.2f  backward(sgd) %.2f ms\n", fwd, grp, upd_t, bwd, bsgd);
}
