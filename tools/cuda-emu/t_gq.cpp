// The group-quantized types (Q4_1 ... IQ4_XS, kernels/common.cuh) on the CPU (run.sh),
// against the vectors gguf-py wrote (tests/fixtures/quant/dequant/<TYPE>.blocks / .f32:
// raw blocks, and gguf.quants.dequantize of them, crafted edge cases included):
// - embed_<type>_f32 of every block (as a table row, ids in reverse): the f32 values
//   bit for bit (NaN for NaN);
// - dequant_<type>_f16 of all blocks: the f16 of those values bit for bit;
// - gemv_<type>_f32 on rows made of the fixture's finite blocks: within 1e-5 (relative
//   L2) of the f64 dot products of gguf-py's values, and batch-invariant bit for bit
//   (vector 0 alone equals vector 0 in batches of 3 and 11).
#include "../../kernels/matmul.cu"
#include "../../kernels/embed.cu"
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

static int fails = 0;
static std::mt19937 rng(23);

static std::vector<unsigned char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) { printf("cannot read %s\n", path.c_str()); std::exit(2); }
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

static bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, 4) == 0;
}

typedef void (*Embed)(const unsigned char*, const unsigned int*, float*, int, int, int);
typedef void (*Dequant)(const unsigned char*, __half*, int, int);
typedef void (*Gemv)(const unsigned char*, const float*, float*, int, int, int);

template <typename T>
static void check(const char* name, Embed embed, Dequant dequant, Gemv gemv) {
  const std::string base = std::string("../../tests/fixtures/quant/dequant/") + name;
  const auto blocks = slurp(base + ".blocks");
  const auto raw = slurp(base + ".f32");
  const int nblk = (int)(blocks.size() / T::BB);
  if (blocks.size() % T::BB || raw.size() != (size_t)nblk * T::QK * 4) {
    printf("%-8s fixture sizes do not fit the layout (%zu, %zu bytes)\n", name, blocks.size(), raw.size());
    fails++;
    return;
  }
  std::vector<float> want(raw.size() / 4);
  std::memcpy(want.data(), raw.data(), raw.size());

  // embed: every block a table row, gathered in reverse.
  std::vector<unsigned int> ids(nblk);
  for (int i = 0; i < nblk; ++i) ids[i] = nblk - 1 - i;
  std::vector<float> emb((size_t)nblk * T::QK, -7.0f);
  launch({(unsigned)nblk, 1, 1}, {256}, [&] { embed(blocks.data(), ids.data(), emb.data(), nblk, T::QK, nblk); });
  size_t bad = 0;
  for (int i = 0; i < nblk; ++i)
    for (int j = 0; j < T::QK; ++j)
      if (!same_bits(emb[(size_t)i * T::QK + j], want[(size_t)ids[i] * T::QK + j])) bad++;
  printf("%-8s embed   %3d blocks: %s (%zu of %zu differ)\n", name, nblk, bad ? "DIFFER" : "bit-identical", bad, want.size());
  if (bad) fails++;

  // dequant to f16: all blocks as one [nblk][QK] matrix.
  std::vector<__half> deq(want.size(), __ushort_as_half(0x7e00));
  launch({3, 1, 1}, {256}, [&] { dequant(blocks.data(), deq.data(), nblk, T::QK); });
  bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    _Float16 h = (_Float16)want[i];
    uint16_t wb;
    std::memcpy(&wb, &h, 2);
    uint16_t gb;
    std::memcpy(&gb, &deq[i], 2);
    const bool nan = std::isnan(want[i]);
    if (nan ? !std::isnan(__half2float(deq[i])) : gb != wb) bad++;
  }
  printf("%-8s dequant %3d blocks: %s (%zu differ)\n", name, nblk, bad ? "DIFFER" : "bit-identical", bad);
  if (bad) fails++;

  // GEMV on rows of the fixture's finite, moderate blocks.
  std::vector<int> sane;
  for (int i = 0; i < nblk; ++i) {
    bool ok = true;
    for (int j = 0; j < T::QK; ++j) ok = ok && std::isfinite(want[(size_t)i * T::QK + j]) && std::fabs(want[(size_t)i * T::QK + j]) < 1e4f;
    if (ok) sane.push_back(i);
  }
  for (auto [rows, kb] : std::vector<std::pair<int, int>>{{9, 256 / T::QK + 1}, {6, 4096 / T::QK}}) {
    const int cols = kb * T::QK;
    std::vector<unsigned char> W;
    std::vector<double> Wv;
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < kb; ++k) {
        const int b = sane[(r * 7 + k * 3) % sane.size()];
        W.insert(W.end(), blocks.begin() + (size_t)b * T::BB, blocks.begin() + (size_t)(b + 1) * T::BB);
        for (int j = 0; j < T::QK; ++j) Wv.push_back(want[(size_t)b * T::QK + j]);
      }
    for (int n : {1, 3, 11}) {
      std::vector<float> x((size_t)n * cols), y((size_t)n * rows, NAN);
      for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
      launch({(unsigned)(rows + 3) / 4, 1, 1}, {128}, [&] { gemv(W.data(), x.data(), y.data(), rows, cols, n); });
      double num = 0, den = 0;
      for (int b = 0; b < n; ++b)
        for (int r = 0; r < rows; ++r) {
          double s = 0;
          for (int c = 0; c < cols; ++c) s += Wv[(size_t)r * cols + c] * x[(size_t)b * cols + c];
          const double d = y[(size_t)b * rows + r] - s;
          num += d * d;
          den += s * s;
        }
      const double e = std::sqrt(num / den);
      // Vector 0 alone: the same bits as in the batch.
      std::vector<float> y1(rows, NAN);
      launch({(unsigned)(rows + 3) / 4, 1, 1}, {128}, [&] { gemv(W.data(), x.data(), y1.data(), rows, cols, 1); });
      size_t inv = 0;
      for (int r = 0; r < rows; ++r) inv += !same_bits(y1[r], y[r]);
      const bool ok = e < 1e-5 && inv == 0;
      printf("%-8s gemv %dx%d n=%-2d rel %.2e, alone vs batch: %zu differ %s\n", name, rows, cols, n, e, inv, ok ? "" : "FAIL");
      if (!ok) fails++;
    }
  }
}

int main() {
  // Fixture file names are the upper-case type names.
  check<GqQ4_1>("Q4_1", embed_q4_1_f32, dequant_q4_1_f16, gemv_q4_1_f32);
  check<GqQ5_0>("Q5_0", embed_q5_0_f32, dequant_q5_0_f16, gemv_q5_0_f32);
  check<GqQ5_1>("Q5_1", embed_q5_1_f32, dequant_q5_1_f16, gemv_q5_1_f32);
  check<GqIQ4_NL>("IQ4_NL", embed_iq4_nl_f32, dequant_iq4_nl_f16, gemv_iq4_nl_f32);
  check<GqQ2_K>("Q2_K", embed_q2_k_f32, dequant_q2_k_f16, gemv_q2_k_f32);
  check<GqQ3_K>("Q3_K", embed_q3_k_f32, dequant_q3_k_f16, gemv_q3_k_f32);
  check<GqQ4_K>("Q4_K", embed_q4_k_f32, dequant_q4_k_f16, gemv_q4_k_f32);
  check<GqQ5_K>("Q5_K", embed_q5_k_f32, dequant_q5_k_f16, gemv_q5_k_f32);
  check<GqQ6_K>("Q6_K", embed_q6_k_f32, dequant_q6_k_f16, gemv_q6_k_f32);
  check<GqIQ4_XS>("IQ4_XS", embed_iq4_xs_f32, dequant_iq4_xs_f16, gemv_iq4_xs_f32);
  printf("%s\n", fails ? "FAIL" : "ok");
  return fails;
}
