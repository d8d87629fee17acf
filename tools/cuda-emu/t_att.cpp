// kernels/attention.cu on the CPU (run.sh): split-KV and tiled prefill attention against attention_f32.
#include "../../kernels/attention.cu"
#include <cstdio>
#include <random>
static std::mt19937 rng(7);
static float U(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
static double rel(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  double num = 0, den = 0; for (size_t i = 0; i < n; ++i) { double d = (double)a[i] - b[i]; num += d * d; den += (double)b[i] * b[i]; }
  return std::sqrt(num / std::max(den, 1e-30));
}
int main() {
  int fails = 0;
  struct S { int nh, nkv, hd; } shapes[] = {{8, 2, 32}, {4, 1, 128}, {6, 3, 80}, {32, 4, 64}, {2, 2, 256}};
  for (auto sh : shapes) {
    int n_layers = 2, layer = 1, n_blocks = 40, max_blocks = 20, kvd = sh.nkv * sh.hd, qd = sh.nh * sh.hd;
    size_t be = (size_t)n_layers * 2 * 16 * kvd;
    std::vector<__half> kv(be * n_blocks); for (auto& h : kv) h = __float2half_rn(U(-1, 1));
    // two sequences: lens 37 and 300; block tables shuffled
    std::vector<unsigned> ids(n_blocks); for (int i = 0; i < n_blocks; ++i) ids[i] = i; std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<unsigned> bt(2 * max_blocks, 0); int nx = 0;
    for (int b = 0; b < 3; ++b) bt[b] = ids[nx++];
    for (int b = 0; b < 19; ++b) bt[max_blocks + b] = ids[nx++];
    // decode tokens
    std::vector<unsigned> seq = {0, 1, 1, 0}, pos = {36, 299, 150, 0};
    int n = seq.size();
    std::vector<float> q(n * qd); for (auto& v : q) v = U(-2, 2);
    std::vector<float> ref(n * qd), sp(n * qd, NAN);
    launch({(unsigned)n, (unsigned)sh.nh, 1}, {128}, [&] { attention_f32(q.data(), kv.data(), seq.data(), pos.data(), bt.data(), ref.data(), n, sh.nh, sh.nkv, sh.hd, n_layers, layer, n_blocks, max_blocks, 2, 1.0f / std::sqrt((float)sh.hd)); });
    int split_len = 32, ns = (max_blocks * 16 + 31) / 32;
    std::vector<float> po((size_t)n * sh.nh * ns * sh.hd, NAN), pm((size_t)n * sh.nh * ns * 2, NAN);
    launch({(unsigned)n, (unsigned)sh.nkv, (unsigned)ns}, {128}, [&] { attention_split_f32(q.data(), kv.data(), seq.data(), pos.data(), bt.data(), po.data(), pm.data(), n, sh.nh, sh.nkv, sh.hd, n_layers, layer, n_blocks, max_blocks, 2, ns, split_len, 1.0f / std::sqrt((float)sh.hd)); });
    launch({(unsigned)n, (unsigned)sh.nh, 1}, {128}, [&] { attention_merge_f32(po.data(), pm.data(), sp.data(), n, sh.nh, sh.hd, ns); });
    double e = rel(sp, ref, n * qd);
    printf("split  %d/%d/%d: rel %.2e\n", sh.nh, sh.nkv, sh.hd, e); if (!(e < 1e-5)) fails++;
    // prefill: seq 0 tokens at positions 0..36 (3 tiles), seq 1 at 280..299 (2 tiles)
    std::vector<unsigned> pseq, ppos, tiles;
    for (int i = 0; i < 37; ++i) { pseq.push_back(0); ppos.push_back(i); }
    for (int i = 0; i < 20; ++i) { pseq.push_back(1); ppos.push_back(280 + i); }
    tiles = {0, 16, 16, 16, 32, 5, 37, 16, 53, 4};
    int pn = pseq.size();
    std::vector<float> pq(pn * qd); for (auto& v : pq) v = U(-2, 2);
    std::vector<float> pref(pn * qd), pt(pn * qd, NAN);
    launch({(unsigned)pn, (unsigned)sh.nh, 1}, {128}, [&] { attention_f32(pq.data(), kv.data(), pseq.data(), ppos.data(), bt.data(), pref.data(), pn, sh.nh, sh.nkv, sh.hd, n_layers, layer, n_blocks, max_blocks, 2, 1.0f / std::sqrt((float)sh.hd)); });
    if (sh.hd % 8 == 0) {
      launch({5, (unsigned)sh.nh, 1}, {128}, [&] { attention_prefill_f32(pq.data(), kv.data(), pseq.data(), ppos.data(), bt.data(), tiles.data(), pt.data(), 5, pn, sh.nh, sh.nkv, sh.hd, n_layers, layer, n_blocks, max_blocks, 2, 1.0f / std::sqrt((float)sh.hd)); });
      double e2 = rel(pt, pref, pn * qd);
      printf("prefill %d/%d/%d: rel %.2e\n", sh.nh, sh.nkv, sh.hd, e2); if (!(e2 < 1e-5)) fails++;
    }
  }
  printf("%s\n", fails ? "FAIL" : "ok"); return fails;
}
