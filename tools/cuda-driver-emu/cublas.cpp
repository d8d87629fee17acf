// libcublas.so, emulated: the GEMM entry points the CUDA runner uses (cublasGemmEx,
// cublasGemmStridedBatchedEx, cublasSgemm), computed on the CPU in f32 from f16, bf16
// or f32 inputs, column-major, honouring transposes and leading dimensions, in stream
// order on the handle's stream (and into a graph capture like any other work). Every
// matrix's extent (ld * (cols - 1) + rows elements, plus the batch strides) is checked
// against the device allocation it lies in when the GEMM runs: one past the end is an
// illegal address, as a GPU would fault. beta == 0 never reads C (NaN-poisoned outputs
// stay harmless, as in cuBLAS). CUBLAS_COMPUTE_32F_FAST_TF32 rounds the inputs to TF32;
// the other 32F compute types multiply in f32 (tensor-core internals are not modelled).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#define EXPORT extern "C" __attribute__((visibility("default")))

extern "C" int cuEmuEnqueueHost(void* stream, int (*fn)(const void*, char*, size_t), const void* data, size_t size,
                                const char* what);
extern "C" int cuEmuCheckRange(unsigned long long p, size_t n, char* why, size_t why_len);

namespace {
enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum { R_32F = 0, R_16F = 2, R_16BF = 14 };

struct Handle {
  unsigned magic = 0xB1A5B1A5u;
  void* stream = nullptr;
  int math_mode = 0;
  int ptr_mode = 0;  // 0 host, 1 device
};

bool valid(const Handle* h) { return h && h->magic == 0xB1A5B1A5u; }

struct Gemm {
  int ta, tb, m, n, k;
  float alpha, beta;
  int alpha_dev;  // alpha/beta live in device memory (pointer mode device)
  const void* alpha_p;
  const void* beta_p;
  const void* A;
  int at;
  long long lda, sa;
  const void* B;
  int bt;
  long long ldb, sb;
  void* C;
  int ct;
  long long ldc, sc;
  int batch;
  int compute;
  char name[32];
};

size_t elem(int t) { return t == R_32F ? 4 : 2; }

float load(const void* p, int t, size_t i) {
  if (t == R_32F) {
    float f;
    std::memcpy(&f, (const char*)p + 4 * i, 4);
    return f;
  }
  unsigned short u;
  std::memcpy(&u, (const char*)p + 2 * i, 2);
  if (t == R_16BF) {
    unsigned v = (unsigned)u << 16;
    float f;
    std::memcpy(&f, &v, 4);
    return f;
  }
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return (float)h;
}

void store(void* p, int t, size_t i, float v) {
  if (t == R_32F) {
    std::memcpy((char*)p + 4 * i, &v, 4);
  } else if (t == R_16F) {
    _Float16 h = (_Float16)v;
    std::memcpy((char*)p + 2 * i, &h, 2);
  } else {
    unsigned u;
    std::memcpy(&u, &v, 4);
    unsigned short b = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                                      : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    std::memcpy((char*)p + 2 * i, &b, 2);
  }
}

float tf32(float v) {
  unsigned u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return v;
  u = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
  std::memcpy(&v, &u, 4);
  return v;
}

int check(const char* what, const void* p, int t, long long ld, long long rows, long long cols, long long stride,
          int batch, const char* name, char* msg, size_t len) {
  if (rows == 0 || cols == 0) return 0;
  unsigned long long last = (unsigned long long)(ld * (cols - 1) + rows) +
                            (unsigned long long)(batch > 1 ? stride * (batch - 1) : 0);
  char why[500];
  if (!cuEmuCheckRange((unsigned long long)p, last * elem(t), why, sizeof why)) {
    snprintf(msg, len, "%s: matrix %s (%lld x %lld, ld %lld%s) reaches outside its buffer: %s", name, what, rows,
             cols, ld, batch > 1 ? ", batched" : "", why);
    return 700;
  }
  return 0;
}

int run_gemm(const void* data, char* msg, size_t len) {
  Gemm g;
  std::memcpy(&g, data, sizeof g);
  const long long ar = g.ta ? g.k : g.m, ac = g.ta ? g.m : g.k;
  const long long br = g.tb ? g.n : g.k, bc = g.tb ? g.k : g.n;
  if (int r = check("A", g.A, g.at, g.lda, ar, ac, g.sa, g.batch, g.name, msg, len)) return r;
  if (int r = check("B", g.B, g.bt, g.ldb, br, bc, g.sb, g.batch, g.name, msg, len)) return r;
  if (int r = check("C", g.C, g.ct, g.ldc, g.m, g.n, g.sc, g.batch, g.name, msg, len)) return r;
  float alpha = g.alpha, beta = g.beta;
  if (g.alpha_dev) {
    if (!cuEmuCheckRange((unsigned long long)g.alpha_p, 4, msg, len) ||
        !cuEmuCheckRange((unsigned long long)g.beta_p, 4, msg, len))
      return 700;
    std::memcpy(&alpha, g.alpha_p, 4);
    std::memcpy(&beta, g.beta_p, 4);
  }
  const bool round_tf32 = g.compute == 77;
  std::vector<float> a((size_t)g.m * g.k), b((size_t)g.n * g.k);
  for (int bi = 0; bi < g.batch; ++bi) {
    const char* A = (const char*)g.A + (size_t)(bi * g.sa) * elem(g.at);
    const char* B = (const char*)g.B + (size_t)(bi * g.sb) * elem(g.bt);
    char* C = (char*)g.C + (size_t)(bi * g.sc) * elem(g.ct);
    // op(A) as rows i of k values, op(B) as columns j of k values.
    for (long long i = 0; i < g.m; ++i)
      for (long long p = 0; p < g.k; ++p) {
        float v = load(A, g.at, (size_t)(g.ta ? p + i * g.lda : i + p * g.lda));
        a[(size_t)i * g.k + p] = round_tf32 ? tf32(v) : v;
      }
    for (long long j = 0; j < g.n; ++j)
      for (long long p = 0; p < g.k; ++p) {
        float v = load(B, g.bt, (size_t)(g.tb ? j + p * g.ldb : p + j * g.ldb));
        b[(size_t)j * g.k + p] = round_tf32 ? tf32(v) : v;
      }
    for (long long j = 0; j < g.n; ++j) {
      const float* bj = &b[(size_t)j * g.k];
      for (long long i = 0; i < g.m; ++i) {
        const float* ai = &a[(size_t)i * g.k];
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        long long p = 0;
        for (; p + 8 <= g.k; p += 8)
          for (int l = 0; l < 8; ++l) acc[l] += ai[p + l] * bj[p + l];
        for (; p < g.k; ++p) acc[0] += ai[p] * bj[p];
        const float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        const size_t ci = (size_t)(i + j * g.ldc);
        float out = alpha * dot;
        if (beta != 0.0f) out += beta * load(C, g.ct, ci);
        store(C, g.ct, ci, out);
      }
    }
  }
  return 0;
}

int gemm(Handle* h, int ta, int tb, int m, int n, int k, const void* alpha, const void* A, int at, long long lda,
         long long sa, const void* B, int bt, long long ldb, long long sb, const void* beta, void* C, int ct,
         long long ldc, long long sc, int batch, int compute, const char* name) {
  if (!valid(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (ta < 0 || ta > 2 || tb < 0 || tb > 2) return CUBLAS_STATUS_INVALID_VALUE;
  ta = ta != 0;
  tb = tb != 0;
  if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1))) return CUBLAS_STATUS_INVALID_VALUE;
  if (ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1))) return CUBLAS_STATUS_INVALID_VALUE;
  if (ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  const bool types_ok = (at == R_32F && bt == R_32F && ct == R_32F) ||
                        ((at == R_16F || at == R_16BF) && bt == at && (ct == R_32F || ct == at));
  const bool compute_ok = compute == 68 || compute == 69 || compute == 74 || compute == 75 || compute == 77 ||
                          compute == 0 /* legacy CUDA_R_32F as compute type */;
  if (!types_ok || !compute_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  Gemm g{};
  g.ta = ta; g.tb = tb; g.m = m; g.n = n; g.k = k;
  g.alpha_dev = h->ptr_mode == 1;
  g.alpha_p = alpha;
  g.beta_p = beta;
  if (!g.alpha_dev) {
    std::memcpy(&g.alpha, alpha, 4);
    std::memcpy(&g.beta, beta, 4);
  }
  g.A = A; g.at = at; g.lda = lda; g.sa = sa;
  g.B = B; g.bt = bt; g.ldb = ldb; g.sb = sb;
  g.C = C; g.ct = ct; g.ldc = ldc; g.sc = sc;
  g.batch = batch;
  g.compute = compute;
  snprintf(g.name, sizeof g.name, "%s", name);
  if (!A || !B || !C) return CUBLAS_STATUS_INVALID_VALUE;
  int r = cuEmuEnqueueHost(h->stream, run_gemm, &g, sizeof g, name);
  return r == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
}  // namespace

EXPORT int cublasCreate_v2(void** out) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  *out = new Handle();
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasDestroy_v2(void* h) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  ((Handle*)h)->magic = 0;
  delete (Handle*)h;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasGetVersion_v2(void* h, int* v) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (v) *v = 130000;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasSetStream_v2(void* h, void* s) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  ((Handle*)h)->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasGetStream_v2(void* h, void** s) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (s) *s = ((Handle*)h)->stream;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasSetMathMode(void* h, int mode) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  ((Handle*)h)->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasGetMathMode(void* h, int* mode) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode) *mode = ((Handle*)h)->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasSetPointerMode_v2(void* h, int mode) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != 0 && mode != 1) return CUBLAS_STATUS_INVALID_VALUE;
  ((Handle*)h)->ptr_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasGetPointerMode_v2(void* h, int* mode) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode) *mode = ((Handle*)h)->ptr_mode;
  return CUBLAS_STATUS_SUCCESS;
}
EXPORT int cublasSetWorkspace_v2(void* h, void*, size_t) {
  if (!valid((Handle*)h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT int cublasGemmEx(void* h, int ta, int tb, int m, int n, int k, const void* alpha, const void* A, int at,
                        int lda, const void* B, int bt, int ldb, const void* beta, void* C, int ct, int ldc,
                        int compute, int /*algo*/) {
  return gemm((Handle*)h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, compute,
              "cublasGemmEx");
}

EXPORT int cublasGemmStridedBatchedEx(void* h, int ta, int tb, int m, int n, int k, const void* alpha, const void* A,
                                      int at, int lda, long long sa, const void* B, int bt, int ldb, long long sb,
                                      const void* beta, void* C, int ct, int ldc, long long sc, int batch,
                                      int compute, int /*algo*/) {
  return gemm((Handle*)h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch,
              compute, "cublasGemmStridedBatchedEx");
}

EXPORT int cublasSgemm_v2(void* h, int ta, int tb, int m, int n, int k, const float* alpha, const float* A, int lda,
                          const float* B, int ldb, const float* beta, float* C, int ldc) {
  return gemm((Handle*)h, ta, tb, m, n, k, alpha, A, R_32F, lda, 0, B, R_32F, ldb, 0, beta, C, R_32F, ldc, 0, 1, 68,
              "cublasSgemm");
}

EXPORT const char* cublasGetStatusName(int s) {
  switch (s) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}
EXPORT const char* cublasGetStatusString(int s) { return cublasGetStatusName(s); }
