// kernels/norm.cu on the CPU (run.sh): add_rmsnorm against add then rmsnorm.
#include "../../kernels/norm.cu"
#include <cstdio>
#include <random>
static std::mt19937 rng(3);
static float U(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
int main() {
  int fails = 0;
  for (auto [rows, n] : std::vector<std::pair<int, int>>{{3, 77}, {2, 4096}, {4, 16}}) {
    std::vector<float> x(rows * n), d(rows * n), w(n);
    for (auto& v : x) v = U(-2, 2); for (auto& v : d) v = U(-2, 2); for (auto& v : w) v = U(0.5, 1.5);
    unsigned t = std::min(1024, std::max(32, ((n + 3) / 4 + 31) / 32 * 32));
    std::vector<float> xf = x, yf(rows * n), xs = x, ys(rows * n);
    launch({(unsigned)rows, 1, 1}, {t}, [&] { add_rmsnorm_f32(xf.data(), d.data(), w.data(), yf.data(), rows, n, 1e-5f); });
    for (size_t i = 0; i < xs.size(); ++i) xs[i] += d[i];
    launch({(unsigned)rows, 1, 1}, {t}, [&] { rmsnorm_f32(xs.data(), w.data(), ys.data(), rows, n, 1e-5f); });
    bool ok = !std::memcmp(xf.data(), xs.data(), 4 * xs.size()) && !std::memcmp(yf.data(), ys.data(), 4 * ys.size());
    printf("add_rmsnorm rows=%d n=%d: %s\n", rows, n, ok ? "bit-identical" : "DIFFER"); fails += !ok;
  }
  printf("%s\n", fails ? "FAIL" : "ok"); return fails;
}
