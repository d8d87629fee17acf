// kernels/matmul.cu on the CPU (run.sh): fast GEMV against plain, fused launches against separate ones.
#include "../../kernels/matmul.cu"
#include <cstdio>
#include <random>
static std::mt19937 rng(11);
static float U(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
static int fails = 0;
static void same(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
  size_t bad = 0; for (size_t i = 0; i < a.size(); ++i) if (std::memcmp(&a[i], &b[i], 4)) bad++;
  printf("%-40s %s (%zu differ)\n", what, bad ? "DIFFER" : "bit-identical", bad); if (bad) fails++;
}
static void close_(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0; for (size_t i = 0; i < a.size(); ++i) { double d = (double)a[i] - b[i]; num += d * d; den += (double)b[i] * b[i]; }
  double e = std::sqrt(num / den); printf("%-40s rel %.2e\n", what, e); if (!(e < 1e-5)) fails++;
}
static std::vector<unsigned char> weight(int kind, int rows, int cols) {
  std::vector<unsigned char> w;
  if (kind <= 1) { for (int i = 0; i < rows * cols; ++i) { uint16_t b; if (kind == 0) { __half h = __float2half_rn(U(-1, 1)); b = __half_as_ushort(h); } else { float f = U(-1, 1); uint32_t u; std::memcpy(&u, &f, 4); b = u >> 16; } w.push_back(b & 0xff); w.push_back(b >> 8); } }
  else { int nq = kind == 2 ? 32 : 16; for (int i = 0; i < rows * cols / 32; ++i) { __half d = __float2half_rn(U(0.002f, 0.05f)); w.push_back(__half_as_ushort(d) & 0xff); w.push_back(__half_as_ushort(d) >> 8); for (int j = 0; j < nq; ++j) w.push_back(rng() & 0xff); } }
  return w;
}
typedef void (*K)(const unsigned char*, const float*, float*, int, int, int);
int main() {
  const char* names[] = {"f16", "bf16", "q8_0", "q4_0"};
  for (int kind = 0; kind < 4; ++kind) {
    for (auto [rows, cols, n] : std::vector<std::tuple<int, int, int>>{{9, 512, 1}, {6, 4096, 3}, {5, 256, 11}}) {
      auto w = weight(kind, rows, cols), wk = weight(kind, rows, cols), wv = weight(kind, rows / 2 + 1, cols);
      std::vector<float> x(n * cols); for (auto& v : x) v = U(-1, 1);
      std::vector<float> plain(n * rows), fast(n * rows);
      dim3e g{(unsigned)(rows + 3) / 4, 1, 1}, b{128};
      auto run_plain = [&](const std::vector<unsigned char>& W, int r, std::vector<float>& y) {
        dim3e gg{(unsigned)(r + 3) / 4, 1, 1};
        if (kind == 0) launch(gg, b, [&] { gemv_f16_f32((const __half*)W.data(), x.data(), y.data(), r, cols, n); });
        if (kind == 1) launch(gg, b, [&] { gemv_bf16_f32((const unsigned short*)W.data(), x.data(), y.data(), r, cols, n); });
        if (kind == 2) launch(gg, b, [&] { gemv_q8_0_f32(W.data(), x.data(), y.data(), r, cols, n); });
        if (kind == 3) launch(gg, b, [&] { gemv_q4_0_f32(W.data(), x.data(), y.data(), r, cols, n); });
      };
      auto run_fast = [&](const std::vector<unsigned char>& W, int r, std::vector<float>& y) {
        dim3e gg{(unsigned)(r + 3) / 4, 1, 1};
        if (kind == 0) launch(gg, b, [&] { gemv_fast_f16_f32((const __half*)W.data(), x.data(), y.data(), r, cols, n); });
        if (kind == 1) launch(gg, b, [&] { gemv_fast_bf16_f32((const unsigned short*)W.data(), x.data(), y.data(), r, cols, n); });
        if (kind == 2) launch(gg, b, [&] { gemv_fast_q8_0_f32(W.data(), x.data(), y.data(), r, cols, n); });
        if (kind == 3) launch(gg, b, [&] { gemv_fast_q4_0_f32(W.data(), x.data(), y.data(), r, cols, n); });
      };
      run_plain(w, rows, plain); run_fast(w, rows, fast);
      char what[128]; snprintf(what, sizeof what, "fast vs plain %s %dx%d n=%d", names[kind], rows, cols, n);
      if (kind <= 1) same(what, fast, plain); else close_(what, fast, plain);
      // gemv3 vs fast separate
      int rk = rows, rv = rows / 2 + 1;
      std::vector<float> fq(n * rows), fk(n * rk), fv(n * rv), sq(n * rows), sk(n * rk), sv(n * rv);
      run_fast(w, rows, sq); run_fast(wk, rk, sk); run_fast(wv, rv, sv);
      dim3e g3{(unsigned)(rows + rk + rv + 3) / 4, 1, 1};
      auto k3 = kind == 0 ? gemv3_fast_f16_f32 : kind == 1 ? gemv3_fast_bf16_f32 : kind == 2 ? gemv3_fast_q8_0_f32 : gemv3_fast_q4_0_f32;
      launch(g3, b, [&] { k3(w.data(), wk.data(), wv.data(), x.data(), fq.data(), fk.data(), fv.data(), rows, rk, rv, cols, n); });
      snprintf(what, sizeof what, "gemv3 vs separate %s %dx%d n=%d", names[kind], rows, cols, n);
      std::vector<float> a3 = fq, b3 = sq; a3.insert(a3.end(), fk.begin(), fk.end()); a3.insert(a3.end(), fv.begin(), fv.end());
      b3.insert(b3.end(), sk.begin(), sk.end()); b3.insert(b3.end(), sv.begin(), sv.end());
      same(what, a3, b3);
      // swiglu fused vs separate + formula
      std::vector<float> gsep(n * rows), usep(n * rows), y(n * rows);
      run_fast(w, rows, gsep); run_fast(wk, rows, usep);
      auto ks = kind == 0 ? gemv_swiglu_fast_f16_f32 : kind == 1 ? gemv_swiglu_fast_bf16_f32 : kind == 2 ? gemv_swiglu_fast_q8_0_f32 : gemv_swiglu_fast_q4_0_f32;
      launch(g, b, [&] { ks(w.data(), wk.data(), x.data(), y.data(), rows, cols, n); });
      for (size_t i = 0; i < gsep.size(); ++i) { float a = gsep[i]; gsep[i] = a / (1.0f + expf(-a)) * usep[i]; }
      snprintf(what, sizeof what, "swiglu fused vs separate %s %dx%d n=%d", names[kind], rows, cols, n);
      same(what, y, gsep);
    }
  }
  printf("%s\n", fails ? "FAIL" : "ok"); return fails;
}
