// kernels/attention.cu on the CPU (run.sh): a stale Inf in K and V at a slot past the tile's last
// position (a freed block's leftovers) must not reach attention_prefill_f32's output, as it
// does not reach attention_f32's.
#include "../../kernels/attention.cu"
#include <cstdio>
#include <random>
static std::mt19937 rng(7);
static float U(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
int main() {
  int nh = 4, nkv = 2, hd = 32, n_layers = 1, layer = 0, n_blocks = 4, max_blocks = 2, kvd = nkv * hd, qd = nh * hd;
  size_t be = (size_t)n_layers * 2 * 16 * kvd;
  std::vector<__half> kv(be * n_blocks); for (auto& h : kv) h = __float2half_rn(U(-1, 1));
  // stale Inf in V (and K) at slot 10 of block 1 (position 26 of the sequence), never written by it
  for (int d = 0; d < kvd; ++d) { kv[1 * be + 16 * kvd + 10 * kvd + d] = __float2half_rn(INFINITY); kv[1 * be + 10 * kvd + d] = __float2half_rn(INFINITY); }
  std::vector<unsigned> bt = {2, 1};
  std::vector<unsigned> seq, pos, tiles = {0, 16, 16, 4};
  for (int i = 0; i < 20; ++i) { seq.push_back(0); pos.push_back(i); }
  int n = 20;
  std::vector<float> q(n * qd); for (auto& v : q) v = U(-2, 2);
  std::vector<float> ref(n * qd), pt(n * qd, NAN);
  launch({(unsigned)n, (unsigned)nh, 1}, {128}, [&] { attention_f32(q.data(), kv.data(), seq.data(), pos.data(), bt.data(), ref.data(), n, nh, nkv, hd, n_layers, layer, n_blocks, max_blocks, 1, 1.0f / std::sqrt((float)hd)); });
  launch({2, (unsigned)nh, 1}, {128}, [&] { attention_prefill_f32(q.data(), kv.data(), seq.data(), pos.data(), bt.data(), tiles.data(), pt.data(), 2, n, nh, nkv, hd, n_layers, layer, n_blocks, max_blocks, 1, 1.0f / std::sqrt((float)hd)); });
  int bad_ref = 0, bad_pt = 0; double md = 0;
  for (int i = 0; i < n * qd; ++i) { bad_ref += !std::isfinite(ref[i]); bad_pt += !std::isfinite(pt[i]); if (std::isfinite(pt[i])) md = std::max(md, (double)std::fabs(pt[i] - ref[i])); }
  printf("non-finite: attention_f32 %d, attention_prefill %d (of %d); max |diff| over finite %.2e\n", bad_ref, bad_pt, n * qd, md);
  return bad_pt ? 1 : 0;
}
