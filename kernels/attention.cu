// Causal attention over the paged KV pool (f16), f32 math.
//
// Twins: src/backend/cpu/ops/attention.rs (CPU), src/backend/cuda/ops/attention.rs (launchers);
// tests: attention_* in tests/cuda_kernels.rs.
//
// For token t (sequence seq[t], position pos[t]) and query head h: attends over
// positions lo(t)..=pos[t] of KV head h / (n_heads / n_kv_heads) in layer `layer`, position
// p read from block block_tables[seq[t] * max_blocks + p / 16], slot p % 16:
//   out[t][h] = sum_p softmax_p(cap(scale * dot(q[t][h], K[p]))) * V[p]
// with cap(s) = softcap * tanh(s / softcap) when softcap > 0 (gemma2; softcap_score in
// common.cuh), else s; lo(t) = max(0, pos[t] + 1 - window) for a sliding window > 0
// (transformers' p - window < k <= p), else 0. Only the blocks holding lo(t)..=pos[t]
// are read (and checked).
// q, out: [n_tokens][n_heads * head_dim] f32.
// kv: [n_blocks][n_layers][K=0|V=1][16 slots][kv_dim] f16, kv_dim = n_kv_heads * head_dim.
// block_tables: [n_seqs][max_blocks] u32.
// Online softmax over chunks of ATT_CHUNK positions: a warp per position computes the
// scaled score (lanes over head dims, shuffle reduction) into shared memory; then every
// thread rescales its running output by exp(m_old - m_new) and adds the chunk's
// exp-weighted V rows for the head dims it owns (dims tid and tid + 128). Shared memory
// is fixed: q (ATT_MAX_HD floats) and one chunk of scores.
// Guards (the host checks these; a bad entry gives a NaN row, never an out-of-bounds
// read): seq[t] >= n_seqs, pos[t] >= max_blocks * 16, or a block id >= n_blocks.
// Needs head_dim <= ATT_MAX_HD (256) and n_heads % n_kv_heads == 0 (checked by the launcher).
// Launch: grid = (n_tokens, n_heads), block = (ATT_THREADS) exactly.
#include "common.cuh"

#define ATT_THREADS 128
#define ATT_CHUNK 64  // <= ATT_THREADS
#define ATT_MAX_HD 256
#define ATT_DPT (ATT_MAX_HD / ATT_THREADS)  // output dims per thread

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_f32(const float* __restrict__ q, const __half* __restrict__ kv, const unsigned int* __restrict__ seq,
                  const unsigned int* __restrict__ pos, const unsigned int* __restrict__ block_tables,
                  float* __restrict__ out, int n_tokens, int n_heads, int n_kv_heads, int head_dim, int n_layers,
                  int layer, int n_blocks, int max_blocks, int n_seqs, float scale, float softcap, int window) {
    __shared__ float qs[ATT_MAX_HD];
    __shared__ float sc[ATT_CHUNK];
    const int t = blockIdx.x;
    const int h = blockIdx.y;
    if (t >= n_tokens || h >= n_heads) return;  // uniform over the block
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int nwarps = ATT_THREADS / 32;
    const int q_dim = n_heads * head_dim;
    const int kv_dim = n_kv_heads * head_dim;
    const int kvh = h / (n_heads / n_kv_heads);
    float* o = out + (size_t)t * q_dim + (size_t)h * head_dim;

    const unsigned int s = seq[t];
    const unsigned int p_last = pos[t];
    int bad = (s >= (unsigned int)n_seqs) || ((unsigned long long)p_last >= (unsigned long long)max_blocks * BLOCK_POSITIONS);
    const unsigned int* bt = block_tables + (size_t)(bad ? 0u : s) * max_blocks;
    const int n_blk = bad ? 0 : (int)(p_last / BLOCK_POSITIONS) + 1;
    const int p_lo = (!bad && window > 0 && (int)p_last + 1 > window) ? (int)p_last + 1 - window : 0;
    for (int i = p_lo / BLOCK_POSITIONS + tid; i < n_blk; i += ATT_THREADS) {
        if (bt[i] >= (unsigned int)n_blocks) bad = 1;
    }
    if (__syncthreads_or(bad)) {
        for (int d = tid; d < head_dim; d += ATT_THREADS) o[d] = __int_as_float(0x7fc00000);
        return;
    }

    const float* qh = q + (size_t)t * q_dim + (size_t)h * head_dim;
    for (int d = tid; d < head_dim; d += ATT_THREADS) qs[d] = qh[d];
    __syncthreads();

    const size_t block_elems = (size_t)n_layers * 2 * BLOCK_POSITIONS * kv_dim;
    const size_t k_off = (size_t)layer * 2 * BLOCK_POSITIONS * kv_dim + (size_t)kvh * head_dim;
    const size_t v_off = k_off + (size_t)BLOCK_POSITIONS * kv_dim;

    float m = __int_as_float(0xff800000);  // running max, -inf
    float l = 0.0f;                        // running sum of exp
    float acc[ATT_DPT];
#pragma unroll
    for (int j = 0; j < ATT_DPT; ++j) acc[j] = 0.0f;

    const int n_pos = (int)p_last + 1;
    for (int c0 = p_lo; c0 < n_pos; c0 += ATT_CHUNK) {
        const int clen = min(ATT_CHUNK, n_pos - c0);
        for (int i = warp; i < clen; i += nwarps) {
            const int p = c0 + i;
            const __half* kr = kv + (size_t)bt[p / BLOCK_POSITIONS] * block_elems + k_off +
                               (size_t)(p % BLOCK_POSITIONS) * kv_dim;
            float dot = 0.0f;
            for (int d = lane; d < head_dim; d += 32) dot = fmaf(qs[d], __half2float(kr[d]), dot);
            dot = warp_sum(dot);
            if (lane == 0) sc[i] = softcap_score(dot * scale, softcap);
        }
        __syncthreads();
        float cmax = __int_as_float(0xff800000);
        for (int i = 0; i < clen; ++i) cmax = fmaxf(cmax, sc[i]);
        const float m_new = fmaxf(m, cmax);
        const float alpha = expf(m - m_new);  // 0 on the first chunk (m = -inf)
        __syncthreads();                      // every thread has read the raw scores
        if (tid < clen) sc[tid] = expf(sc[tid] - m_new);
        __syncthreads();
        float csum = 0.0f;
        for (int i = 0; i < clen; ++i) csum += sc[i];
        l = l * alpha + csum;
#pragma unroll
        for (int j = 0; j < ATT_DPT; ++j) acc[j] *= alpha;
        for (int i = 0; i < clen; ++i) {
            const int p = c0 + i;
            const __half* vr = kv + (size_t)bt[p / BLOCK_POSITIONS] * block_elems + v_off +
                               (size_t)(p % BLOCK_POSITIONS) * kv_dim;
            const float e = sc[i];
#pragma unroll
            for (int j = 0; j < ATT_DPT; ++j) {
                const int d = tid + j * ATT_THREADS;
                if (d < head_dim) acc[j] = fmaf(e, __half2float(vr[d]), acc[j]);
            }
        }
        m = m_new;
        __syncthreads();  // sc is rewritten by the next chunk
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int j = 0; j < ATT_DPT; ++j) {
        const int d = tid + j * ATT_THREADS;
        if (d < head_dim) o[d] = acc[j] * inv;
    }
}

// ---- split-KV (flash-decoding) attention ------------------------------------------
//
// attention_split_f32: the partial attention of one (token t, KV head kvh, split sp),
// for every query head of the group (G = n_heads / n_kv_heads <= SPLIT_MAX_G heads,
// h = kvh * G + g), over positions [max(sp * split_len, lo(t)), min((sp + 1) * split_len,
// pos[t] + 1)) (lo(t) as attention_f32's: a split wholly before the window is empty):
//   m = max score, l = sum_p exp(score_p - m), o[d] = sum_p exp(score_p - m) * V[p][d]
// (scores cap(scale * dot(q, K[p])) exactly as attention_f32 computes them). K and V of the
// group are read once for all G query heads.
//   part_o:  [n_tokens][n_heads][n_splits][head_dim] f32 (o, not normalised)
//   part_ml: [n_tokens][n_heads][n_splits][2] f32 (m, l)
// A split past pos[t] writes m = -inf, l = 0, o = 0. Guards as attention_f32: a bad seq,
// position or block id gives o = NaN, m = 0, l = 1 (the merge then yields NaN).
// Needs head_dim <= ATT_MAX_HD, G <= SPLIT_MAX_G, split_len a multiple of 16 and
// <= SPLIT_MAX_LEN, n_splits * split_len >= max_blocks * 16 (the launcher checks).
// Launch: grid = (n_tokens, n_kv_heads, n_splits), block = (SPLIT_THREADS) exactly.
//
// attention_merge_f32: out[t][h][d] = sum_s w_s o_s[d] / sum_s w_s l_s with
// w_s = exp(m_s - max_s m_s) (0 for an empty split): the numerically safe merge, in
// parallel over the splits (1024 splits at 32k positions): the block's max of m_s, then
// warp w sums splits w, w + W, ... (W = blockDim.x / 32 warps; lanes over d, an fmaf chain
// per split in ascending order), then thread d adds the W warp sums in warp order. Split s
// always lands in warp s % W at the same place of its chain, and an empty split adds
// exactly 0, so a sequence's result does not depend on how many (empty) splits follow its
// last one: batch-invariant bit for bit.
// Launch: grid = (n_tokens, n_heads), block = (T), T a multiple of 32, 32 <= T <=
// MERGE_THREADS (launcher: MERGE_THREADS).

#define SPLIT_THREADS 128
#define SPLIT_WARPS (SPLIT_THREADS / 32)
#define SPLIT_MAX_G 8
#define SPLIT_MAX_LEN 64
#define SPLIT_DPT (ATT_MAX_HD / SPLIT_THREADS)  // V dims per thread

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
    attention_split_f32(const float* __restrict__ q, const __half* __restrict__ kv,
                        const unsigned int* __restrict__ seq, const unsigned int* __restrict__ pos,
                        const unsigned int* __restrict__ block_tables, float* __restrict__ part_o,
                        float* __restrict__ part_ml, int n_tokens, int n_heads, int n_kv_heads, int head_dim,
                        int n_layers, int layer, int n_blocks, int max_blocks, int n_seqs, int n_splits,
                        int split_len, float scale, float softcap, int window) {
    __shared__ float qs[SPLIT_MAX_G][ATT_MAX_HD];
    __shared__ float sc[SPLIT_MAX_G][SPLIT_MAX_LEN];
    const int t = blockIdx.x;
    const int kvh = blockIdx.y;
    const int sp = blockIdx.z;
    if (t >= n_tokens || kvh >= n_kv_heads || sp >= n_splits) return;  // uniform over the block
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int G = n_heads / n_kv_heads;
    const int h0 = kvh * G;
    const int q_dim = n_heads * head_dim;
    const int kv_dim = n_kv_heads * head_dim;

    const unsigned int s = seq[t];
    const unsigned int p_last = pos[t];
    int bad = (s >= (unsigned int)n_seqs) || ((unsigned long long)p_last >= (unsigned long long)max_blocks * BLOCK_POSITIONS);
    const int n_pos = bad ? 0 : (int)p_last + 1;
    const int p_lo = (window > 0 && n_pos > window) ? n_pos - window : 0;
    const int p0 = max(sp * split_len, p_lo);                 // first position of the split
    const int len = min(sp * split_len + split_len, n_pos) - p0;  // <= 0: nothing in this split
    const unsigned int* bt = block_tables + (size_t)(bad ? 0u : s) * max_blocks;
    if (len > 0) {
        const int b0 = p0 / BLOCK_POSITIONS, b1 = (p0 + len - 1) / BLOCK_POSITIONS;
        for (int i = b0 + tid; i <= b1; i += SPLIT_THREADS) {
            if (bt[i] >= (unsigned int)n_blocks) bad = 1;
        }
    }
    bad = __syncthreads_or(bad);
    const size_t part = ((size_t)t * n_heads + h0) * n_splits + sp;  // (t, h0, sp); head g adds g * n_splits
    if (bad || len <= 0) {
        const float o = bad ? __int_as_float(0x7fc00000) : 0.0f;
        for (int g = 0; g < G; ++g) {
            const size_t pg = part + (size_t)g * n_splits;
            for (int d = tid; d < head_dim; d += SPLIT_THREADS) part_o[pg * head_dim + d] = o;
            if (tid == 0) {
                part_ml[pg * 2] = bad ? 0.0f : __int_as_float(0xff800000);
                part_ml[pg * 2 + 1] = bad ? 1.0f : 0.0f;
            }
        }
        return;
    }

    for (int g = 0; g < G; ++g) {
        const float* qh = q + (size_t)t * q_dim + (size_t)(h0 + g) * head_dim;
        for (int d = tid; d < head_dim; d += SPLIT_THREADS) qs[g][d] = qh[d];
    }
    __syncthreads();

    const size_t block_elems = (size_t)n_layers * 2 * BLOCK_POSITIONS * kv_dim;
    const size_t k_off = (size_t)layer * 2 * BLOCK_POSITIONS * kv_dim + (size_t)kvh * head_dim;
    const size_t v_off = k_off + (size_t)BLOCK_POSITIONS * kv_dim;

    // Scores: a warp per position, lanes over head dims (the order of attention_f32).
    for (int i = warp; i < len; i += SPLIT_WARPS) {
        const int p = p0 + i;
        const __half* kr = kv + (size_t)bt[p / BLOCK_POSITIONS] * block_elems + k_off +
                           (size_t)(p % BLOCK_POSITIONS) * kv_dim;
        float dot[SPLIT_MAX_G];
#pragma unroll
        for (int g = 0; g < SPLIT_MAX_G; ++g) dot[g] = 0.0f;
        for (int d = lane; d < head_dim; d += 32) {
            const float kd = __half2float(kr[d]);
#pragma unroll
            for (int g = 0; g < SPLIT_MAX_G; ++g) {
                if (g < G) dot[g] = fmaf(qs[g][d], kd, dot[g]);
            }
        }
#pragma unroll
        for (int g = 0; g < SPLIT_MAX_G; ++g) {
            if (g < G) {
                const float v = warp_sum(dot[g]);
                if (lane == 0) sc[g][i] = softcap_score(v * scale, softcap);
            }
        }
    }
    __syncthreads();

    // Softmax within the split: warp w takes heads w, w + SPLIT_WARPS.
    __shared__ float ms[SPLIT_MAX_G];
    __shared__ float ls[SPLIT_MAX_G];
    for (int g = warp; g < G; g += SPLIT_WARPS) {
        float m = __int_as_float(0xff800000);
        for (int i = lane; i < len; i += 32) m = fmaxf(m, sc[g][i]);
        m = warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < len; i += 32) {
            const float e = expf(sc[g][i] - m);
            sc[g][i] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) {
            ms[g] = m;
            ls[g] = l;
        }
    }
    __syncthreads();

    // V: thread over head dims, every head of the group.
    float acc[SPLIT_MAX_G][SPLIT_DPT];
#pragma unroll
    for (int g = 0; g < SPLIT_MAX_G; ++g)
#pragma unroll
        for (int j = 0; j < SPLIT_DPT; ++j) acc[g][j] = 0.0f;
    for (int i = 0; i < len; ++i) {
        const int p = p0 + i;
        const __half* vr = kv + (size_t)bt[p / BLOCK_POSITIONS] * block_elems + v_off +
                           (size_t)(p % BLOCK_POSITIONS) * kv_dim;
#pragma unroll
        for (int j = 0; j < SPLIT_DPT; ++j) {
            const int d = tid + j * SPLIT_THREADS;
            if (d < head_dim) {
                const float v = __half2float(vr[d]);
#pragma unroll
                for (int g = 0; g < SPLIT_MAX_G; ++g) {
                    if (g < G) acc[g][j] = fmaf(sc[g][i], v, acc[g][j]);
                }
            }
        }
    }
#pragma unroll
    for (int g = 0; g < SPLIT_MAX_G; ++g) {
        if (g < G) {
            const size_t pg = part + (size_t)g * n_splits;
#pragma unroll
            for (int j = 0; j < SPLIT_DPT; ++j) {
                const int d = tid + j * SPLIT_THREADS;
                if (d < head_dim) part_o[pg * head_dim + d] = acc[g][j];
            }
            if (tid == 0) {
                part_ml[pg * 2] = ms[g];
                part_ml[pg * 2 + 1] = ls[g];
            }
        }
    }
}

#define MERGE_THREADS 256
#define MERGE_WARPS (MERGE_THREADS / 32)
#define MERGE_DPL (ATT_MAX_HD / 32)  // head dims per lane

extern "C" __global__ void __launch_bounds__(MERGE_THREADS)
    attention_merge_f32(const float* __restrict__ part_o, const float* __restrict__ part_ml, float* __restrict__ out,
                        int n_tokens, int n_heads, int head_dim, int n_splits) {
    __shared__ float wmax[MERGE_WARPS];
    __shared__ float wl[MERGE_WARPS];
    __shared__ float wo[MERGE_WARPS][ATT_MAX_HD];
    const int t = blockIdx.x;
    const int h = blockIdx.y;
    if (t >= n_tokens || h >= n_heads) return;  // uniform over the block
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    const size_t base = ((size_t)t * n_heads + h) * n_splits;
    const float NEG_INF = __int_as_float(0xff800000);

    float m = NEG_INF;
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) m = fmaxf(m, part_ml[(base + s) * 2]);
    m = warp_max(m);
    if (lane == 0) wmax[warp] = m;
    __syncthreads();
    float M = wmax[0];
    for (int w = 1; w < nw; ++w) M = fmaxf(M, wmax[w]);

    float L = 0.0f;
    float acc[MERGE_DPL];
#pragma unroll
    for (int j = 0; j < MERGE_DPL; ++j) acc[j] = 0.0f;
    for (int s = warp; s < n_splits; s += nw) {
        const float ms = part_ml[(base + s) * 2];
        const float w = (ms == NEG_INF) ? 0.0f : expf(ms - M);
        L = fmaf(w, part_ml[(base + s) * 2 + 1], L);
        const float* po = part_o + (base + s) * head_dim;
#pragma unroll
        for (int j = 0; j < MERGE_DPL; ++j) {
            const int d = lane + 32 * j;
            if (d < head_dim) acc[j] = fmaf(w, po[d], acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < MERGE_DPL; ++j) {
        const int d = lane + 32 * j;
        if (d < head_dim) wo[warp][d] = acc[j];
    }
    if (lane == 0) wl[warp] = L;
    __syncthreads();

    float* o = out + ((size_t)t * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = wo[0][d], l = wl[0];
        for (int w = 1; w < nw; ++w) {
            a = __fadd_rn(a, wo[w][d]);
            l = __fadd_rn(l, wl[w]);
        }
        o[d] = a / l;
    }
}

// ---- tiled causal attention for prefill ---------------------------------------------
//
// attention_prefill_f32: the same result as attention_f32 for every token of a tile,
// computed flash-style: a block takes up to PF_BQ consecutive tokens of one sequence
// (tiles[tile] = {first token, count}; the host never lets a tile cross sequences) and
// one query head, walks the sequence's KV blocks 0 ..= last position / 16, stages each
// block's K and V (16 positions, f16) in shared memory with 16-byte loads, and keeps
// per query row the running max, sum and output (online softmax): no score matrix is
// ever stored. Row i of the tile is handled by the PF_SUB threads 8i .. 8i+7; thread
// `sub` holds q and the output for dims sub, sub + 8, ...; the 8 partial dot products
// are summed with xor shuffles, so each of the 8 threads has the row's 16 scores.
// Causal mask: position p > pos[t] or p < lo(t) (the sliding window, as attention_f32's)
// scores -inf, and blocks wholly before lo of the tile's first token are not read; scores
// are cap(scale * dot) as attention_f32's. V rows past the tile's last position are
// staged as zeros (stale slots must not reach the output). Guards as attention_f32 (NaN rows).
// Needs head_dim % 8 == 0, head_dim <= ATT_MAX_HD, tokens of a tile at consecutive
// positions (a sequence's new tokens are). Launch: grid = (n_tiles, n_heads), block =
// (PF_THREADS) exactly.

#define PF_BQ 16
#define PF_SUB 8
#define PF_THREADS (PF_BQ * PF_SUB)
#define PF_DPT (ATT_MAX_HD / PF_SUB)  // dims per thread, at most

extern "C" __global__ void __launch_bounds__(PF_THREADS)
    attention_prefill_f32(const float* __restrict__ q, const __half* __restrict__ kv,
                          const unsigned int* __restrict__ seq, const unsigned int* __restrict__ pos,
                          const unsigned int* __restrict__ block_tables, const unsigned int* __restrict__ tiles,
                          float* __restrict__ out, int n_tiles, int n_tokens, int n_heads, int n_kv_heads,
                          int head_dim, int n_layers, int layer, int n_blocks, int max_blocks, int n_seqs,
                          float scale, float softcap, int window) {
    __shared__ __align__(16) __half ks[BLOCK_POSITIONS][ATT_MAX_HD];
    __shared__ __align__(16) __half vs[BLOCK_POSITIONS][ATT_MAX_HD];
    const int tile = blockIdx.x;
    const int h = blockIdx.y;
    if (tile >= n_tiles || h >= n_heads) return;  // uniform over the block
    const int tid = threadIdx.x;
    const int i = tid / PF_SUB;
    const int sub = tid % PF_SUB;
    const unsigned int first = tiles[2 * tile];
    const unsigned int cnt = tiles[2 * tile + 1];
    const int q_dim = n_heads * head_dim;
    const int kv_dim = n_kv_heads * head_dim;
    const int kvh = h / (n_heads / n_kv_heads);
    const int nd = head_dim / PF_SUB;  // dims per thread

    // Guards (uniform): the tile inside the step, its sequence and last position inside
    // the block table, every block id it reads inside the pool.
    int bad = cnt == 0 || cnt > PF_BQ || (unsigned long long)first + cnt > (unsigned long long)n_tokens;
    const unsigned int s = bad ? 0u : seq[first];
    const unsigned int p_max = bad ? 0u : pos[first + cnt - 1];
    bad = bad || s >= (unsigned int)n_seqs || (unsigned long long)p_max >= (unsigned long long)max_blocks * BLOCK_POSITIONS;
    const unsigned int* bt = block_tables + (size_t)(bad ? 0u : s) * max_blocks;
    const int nb = bad ? 0 : (int)(p_max / BLOCK_POSITIONS) + 1;
    const unsigned int p_min = bad ? 0u : pos[first];  // the tile's positions are consecutive
    const int b_lo = (window > 0 && (int)p_min + 1 > window) ? ((int)p_min + 1 - window) / BLOCK_POSITIONS : 0;
    for (int b = b_lo + tid; b < nb; b += PF_THREADS) {
        if (bt[b] >= (unsigned int)n_blocks) bad = 1;
    }
    bad = __syncthreads_or(bad);
    const bool active = i < (int)cnt;
    const unsigned int t = first + (active ? i : 0);
    if (bad) {
        if (active && first + i < (unsigned int)n_tokens) {
            float* o = out + (size_t)(first + i) * q_dim + (size_t)h * head_dim;
            for (int k = 0; k < nd; ++k) o[sub + PF_SUB * k] = __int_as_float(0x7fc00000);
        }
        return;
    }
    const unsigned int p_row = pos[t];
    const unsigned int p_lo = (window > 0 && p_row + 1 > (unsigned int)window) ? p_row + 1 - (unsigned int)window : 0u;

    float qr[PF_DPT], acc[PF_DPT];
    const float* qh = q + (size_t)t * q_dim + (size_t)h * head_dim;
#pragma unroll
    for (int k = 0; k < PF_DPT; ++k) {
        qr[k] = (k < nd) ? qh[sub + PF_SUB * k] : 0.0f;
        acc[k] = 0.0f;
    }
    float m = __int_as_float(0xff800000);
    float l = 0.0f;

    const size_t block_elems = (size_t)n_layers * 2 * BLOCK_POSITIONS * kv_dim;
    const size_t k_off = (size_t)layer * 2 * BLOCK_POSITIONS * kv_dim + (size_t)kvh * head_dim;
    const size_t v_off = k_off + (size_t)BLOCK_POSITIONS * kv_dim;
    const int vec_per_row = head_dim / 8;  // 16-byte vectors of a K or V row

    for (int b = b_lo; b < nb; ++b) {
        __syncthreads();  // the previous block's K/V reads are done
        const __half* kb = kv + (size_t)bt[b] * block_elems;
        for (int e = tid; e < BLOCK_POSITIONS * vec_per_row; e += PF_THREADS) {
            const int j = e / vec_per_row, c = e % vec_per_row;
            const size_t off = (size_t)j * kv_dim + (size_t)c * 8;
            *reinterpret_cast<uint4*>(&ks[j][c * 8]) = *reinterpret_cast<const uint4*>(kb + k_off + off);
            // Slots past the tile's last position hold stale data (a freed block's, or
            // nothing yet). Their weight is exactly 0, but 0 * Inf or 0 * NaN would poison
            // every row of the tile (attention_f32 never reads them): stage zeros instead.
            // (A stale K is harmless: its score is replaced by -inf, not multiplied.)
            uint4 vv = *reinterpret_cast<const uint4*>(kb + v_off + off);
            if ((unsigned int)(b * BLOCK_POSITIONS + j) > p_max) vv.x = vv.y = vv.z = vv.w = 0u;
            *reinterpret_cast<uint4*>(&vs[j][c * 8]) = vv;
        }
        __syncthreads();

        float sc[BLOCK_POSITIONS];
#pragma unroll
        for (int j = 0; j < BLOCK_POSITIONS; ++j) {
            float d = 0.0f;
#pragma unroll
            for (int k = 0; k < PF_DPT; ++k) {
                if (k < nd) d = fmaf(qr[k], __half2float(ks[j][sub + PF_SUB * k]), d);
            }
            d += __shfl_xor_sync(FULL_MASK, d, 1);
            d += __shfl_xor_sync(FULL_MASK, d, 2);
            d += __shfl_xor_sync(FULL_MASK, d, 4);
            const unsigned int p = (unsigned int)(b * BLOCK_POSITIONS + j);
            sc[j] = (p <= p_row && p >= p_lo) ? softcap_score(d * scale, softcap) : __int_as_float(0xff800000);
        }
        float bmax = sc[0];
#pragma unroll
        for (int j = 1; j < BLOCK_POSITIONS; ++j) bmax = fmaxf(bmax, sc[j]);
        const float m_new = fmaxf(m, bmax);
        if (m_new == __int_as_float(0xff800000)) continue;  // nothing of this row's window in this block
        const float alpha = expf(m - m_new);                 // 0 on the first visible block
        float psum = 0.0f;
#pragma unroll
        for (int j = 0; j < BLOCK_POSITIONS; ++j) {
            sc[j] = expf(sc[j] - m_new);
            psum += sc[j];
        }
        l = l * alpha + psum;
#pragma unroll
        for (int k = 0; k < PF_DPT; ++k) {
            if (k < nd) {
                float a = acc[k] * alpha;
#pragma unroll
                for (int j = 0; j < BLOCK_POSITIONS; ++j) a = fmaf(sc[j], __half2float(vs[j][sub + PF_SUB * k]), a);
                acc[k] = a;
            }
        }
        m = m_new;
    }
    if (active) {
        float* o = out + (size_t)t * q_dim + (size_t)h * head_dim;
        const float inv = 1.0f / l;
#pragma unroll
        for (int k = 0; k < PF_DPT; ++k) {
            if (k < nd) o[sub + PF_SUB * k] = acc[k] * inv;
        }
    }
}
