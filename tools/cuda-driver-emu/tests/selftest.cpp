// Tests of the emulated driver itself: every strictness rule is tripped by a
// deliberately broken kernel or launch (tests/kernels/emu_selftest.cu), and the
// emulator must answer with the code the real driver gives and say why. Each case
// runs in its own process (a device fault makes the context unusable, as on a GPU).
//   usage: selftest [case ...]   (no argument: every case)
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

typedef int R;
typedef unsigned long long P;
extern "C" {
R cuInit(unsigned);
R cuDevicePrimaryCtxRetain(void**, int);
R cuCtxSetCurrent(void*);
R cuMemAlloc_v2(P*, size_t);
R cuMemAllocAsync(P*, size_t, void*);
R cuMemFree_v2(P);
R cuMemFreeAsync(P, void*);
R cuMemsetD8Async(P, unsigned char, size_t, void*);
R cuMemcpyHtoDAsync_v2(P, const void*, size_t, void*);
R cuMemcpyDtoHAsync_v2(void*, P, size_t, void*);
R cuModuleLoadData(void**, const void*);
R cuModuleGetFunction(void**, void*, const char*);
R cuFuncSetAttribute(void*, int, int);
R cuLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**, void**);
R cuStreamCreate(void**, unsigned);
R cuStreamSynchronize(void*);
R cuCtxSynchronize();
R cuStreamBeginCapture_v2(void*, int);
R cuStreamEndCapture(void*, void**);
R cuGraphInstantiateWithFlags(void**, void*, unsigned long long);
R cuGraphLaunch(void*, void*);
R cuGetErrorString(R, const char**);
}

namespace {

std::string why(R code) {
  const char* s = nullptr;
  cuGetErrorString(code, &s);
  return s ? s : "?";
}

#define CHECK(cond, ...)                             \
  do {                                               \
    if (!(cond)) {                                   \
      fprintf(stderr, "  check failed: %s: ", #cond); \
      fprintf(stderr, __VA_ARGS__);                  \
      fprintf(stderr, "\n");                         \
      return 1;                                      \
    }                                                \
  } while (0)
#define OK(call)                                                                 \
  do {                                                                           \
    R r_ = (call);                                                               \
    CHECK(r_ == 0, "%s returned %d: %s", #call, r_, why(r_).c_str());            \
  } while (0)
// `call` returns `want` and the emulator's reason mentions `text`.
#define EXPECT(call, want, text)                                                                            \
  do {                                                                                                      \
    R r_ = (call);                                                                                          \
    std::string w_ = why(r_);                                                                               \
    CHECK(r_ == (want), "%s returned %d (%s), expected %d", #call, r_, w_.c_str(), (int)(want));             \
    CHECK(w_.find(text) != std::string::npos, "%s: reason \"%s\" does not mention \"%s\"", #call, w_.c_str(), \
          text);                                                                                            \
    printf("  %s -> %d: %s\n", #call, r_, w_.c_str());                                                      \
  } while (0)

void* g_mod = nullptr;

void* setup() {
  void* ctx = nullptr;
  if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) return nullptr;
  const char* ptx =
      ".version 9.0\n.target sm_90\n.address_size 64\n"
      ".visible .entry emu_copy_off(\n)\n.visible .entry emu_load_float4(\n)\n"
      ".visible .entry emu_shfl_after_exit(\n)\n.visible .entry emu_deadlock(\n)\n"
      ".visible .entry emu_block_sum(\n)\n.visible .entry emu_increment(\n)\n"
      ".visible .entry emu_reverse_dyn(\n)\n";
  if (cuModuleLoadData(&g_mod, ptx)) return nullptr;
  return ctx;
}

void* fn(const char* name) {
  void* f = nullptr;
  cuModuleGetFunction(&f, g_mod, name);
  return f;
}

P upload(const std::vector<float>& v) {
  P d = 0;
  cuMemAllocAsync(&d, v.size() * 4, nullptr);
  cuMemcpyHtoDAsync_v2(d, v.data(), v.size() * 4, nullptr);
  return d;
}

// ---- the cases --------------------------------------------------------------------------

int oob_read_past_end() {
  CHECK(setup(), "setup");
  int n = 64;  // 256 bytes: the buffer ends at the guard page
  P x = upload(std::vector<float>(n, 1.0f)), y = 0;
  OK(cuMemAllocAsync(&y, n * 4, nullptr));
  int off = 1;
  void* args[] = {&x, &y, &n, &off};
  OK(cuLaunchKernel(fn("emu_copy_off"), 1, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr));
  EXPECT(cuStreamSynchronize(nullptr), 700, "0 bytes past the end of device buffer");
  EXPECT(cuMemAllocAsync(&y, 4, nullptr), 700, "emu_copy_off");  // the context stays broken (sticky)
  return 0;
}

int oob_read_before_start() {
  CHECK(setup(), "setup");
  int n = 2048;  // 8 KiB: the buffer starts at a page boundary, after the leading guard page
  P x = upload(std::vector<float>(n, 1.0f)), y = 0;
  OK(cuMemAllocAsync(&y, n * 4, nullptr));
  int off = -1;
  void* args[] = {&x, &y, &n, &off};
  OK(cuLaunchKernel(fn("emu_copy_off"), n / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  EXPECT(cuStreamSynchronize(nullptr), 700, "before the start of device buffer");
  return 0;
}

int poison_reads_as_nan() {
  CHECK(setup(), "setup");
  int n = 100, off = 0;
  P x = 0, y = 0;
  OK(cuMemAllocAsync(&x, n * 4, nullptr));  // never written
  OK(cuMemAllocAsync(&y, n * 4, nullptr));
  void* args[] = {&x, &y, &n, &off};
  OK(cuLaunchKernel(fn("emu_copy_off"), 1, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
  std::vector<float> out(n, 0.0f);
  OK(cuMemcpyDtoHAsync_v2(out.data(), y, n * 4, nullptr));
  for (int i = 0; i < n; ++i) CHECK(std::isnan(out[i]), "element %d is %g, not NaN", i, out[i]);
  // A zeroed buffer reads as zeros.
  OK(cuMemsetD8Async(x, 0, n * 4, nullptr));
  OK(cuLaunchKernel(fn("emu_copy_off"), 1, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
  OK(cuMemcpyDtoHAsync_v2(out.data(), y, n * 4, nullptr));
  for (int i = 0; i < n; ++i) CHECK(out[i] == 0.0f, "element %d is %g after memset 0", i, out[i]);
  printf("  never-written device memory read as NaN; zeroed memory as 0\n");
  return 0;
}

int too_many_threads() {
  CHECK(setup(), "setup");
  P y = 0;
  OK(cuMemAllocAsync(&y, 4096 * 4, nullptr));
  void* args[] = {&y};
  EXPECT(cuLaunchKernel(fn("emu_deadlock"), 1, 1, 1, 1025, 1, 1, 0, nullptr, args, nullptr), 1, "1024 threads");
  EXPECT(cuLaunchKernel(fn("emu_deadlock"), 1, 1, 1, 32, 32, 2, 0, nullptr, args, nullptr), 1, "1024 threads");
  EXPECT(cuLaunchKernel(fn("emu_deadlock"), 1, 65536, 1, 32, 1, 1, 0, nullptr, args, nullptr), 1, "grid");
  EXPECT(cuLaunchKernel(fn("emu_deadlock"), 0, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr), 1, "zero");
  P x = upload(std::vector<float>(256, 1.0f));
  void* a2[] = {&x, &y};
  EXPECT(cuLaunchKernel(fn("emu_block_sum"), 1, 1, 1, 256, 1, 1, 0, nullptr, a2, nullptr), 701,
         "__launch_bounds__(128)");
  return 0;
}

int dynamic_smem_needs_attribute() {
  CHECK(setup(), "setup");
  P x = upload(std::vector<float>(128, 1.0f)), y = 0;
  OK(cuMemAllocAsync(&y, 4, nullptr));
  void* args[] = {&x, &y};
  void* f = fn("emu_block_sum");
  OK(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 48 * 1024, nullptr, args, nullptr));
  EXPECT(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 64 * 1024, nullptr, args, nullptr), 1,
         "MAX_DYNAMIC_SHARED_SIZE_BYTES");
  EXPECT(cuFuncSetAttribute(f, 8, 228 * 1024), 1, "MAX_DYNAMIC_SHARED_SIZE_BYTES");
  OK(cuFuncSetAttribute(f, 8, 64 * 1024));
  OK(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 64 * 1024, nullptr, args, nullptr));
  OK(cuStreamSynchronize(nullptr));
  float s = 0;
  OK(cuMemcpyDtoHAsync_v2(&s, y, 4, nullptr));
  CHECK(s == 128.0f, "block sum %g != 128", s);
  return 0;
}

int dynamic_shared_memory_works() {
  CHECK(setup(), "setup");
  std::vector<float> h(512);
  for (int i = 0; i < 512; ++i) h[i] = (float)i;
  P x = upload(h), y = 0;
  OK(cuMemAllocAsync(&y, 512 * 4, nullptr));
  void* args[] = {&x, &y};
  OK(cuLaunchKernel(fn("emu_reverse_dyn"), 2, 1, 1, 256, 1, 1, 256 * 4, nullptr, args, nullptr));
  std::vector<float> out(512);
  OK(cuMemcpyDtoHAsync_v2(out.data(), y, 512 * 4, nullptr));
  for (int i = 0; i < 512; ++i) {
    float want = (float)((i / 256) * 256 + 255 - i % 256);
    CHECK(out[i] == want, "y[%d] = %g, want %g", i, out[i], want);
  }
  printf("  extern __shared__ buffer reversed two blocks of 256\n");
  return 0;
}

int misaligned_vector_load() {
  CHECK(setup(), "setup");
  P x = upload(std::vector<float>(64, 1.0f)), y = 0;
  OK(cuMemAllocAsync(&y, 4, nullptr));
  int off = 0;
  void* args[] = {&x, &y, &off};
  OK(cuLaunchKernel(fn("emu_load_float4"), 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  OK(cuStreamSynchronize(nullptr));
  off = 1;
  OK(cuLaunchKernel(fn("emu_load_float4"), 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  EXPECT(cuStreamSynchronize(nullptr), 716, "misaligned float4");
  return 0;
}

int use_after_free() {
  CHECK(setup(), "setup");
  int n = 64, off = 0;
  P x = upload(std::vector<float>(n, 1.0f)), y = 0;
  OK(cuMemAllocAsync(&y, n * 4, nullptr));
  OK(cuMemFreeAsync(x, nullptr));
  EXPECT(cuMemFreeAsync(x, nullptr), 1, "");  // double free is refused at the call... or when it runs
  void* args[] = {&x, &y, &n, &off};
  OK(cuLaunchKernel(fn("emu_copy_off"), 1, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr));
  EXPECT(cuStreamSynchronize(nullptr), 700, "use after free");
  return 0;
}

int double_free() {
  CHECK(setup(), "setup");
  P x = 0;
  OK(cuMemAlloc_v2(&x, 1000));
  OK(cuMemFree_v2(x));
  EXPECT(cuMemFree_v2(x), 1, "already freed");
  EXPECT(cuMemFree_v2(x + 4), 1, "not the start of a device allocation");
  return 0;
}

int sync_calls_during_capture() {
  CHECK(setup(), "setup");
  void* s = nullptr;
  OK(cuStreamCreate(&s, 1));
  P y = 0, z = 0;
  OK(cuMemAllocAsync(&y, 256, s));
  // Global mode: cuMemAlloc is a "potentially unsafe" call; it invalidates the capture.
  OK(cuStreamBeginCapture_v2(s, 0));
  EXPECT(cuMemAlloc_v2(&z, 256), 900, "captures a graph");
  void* g = nullptr;
  EXPECT(cuStreamEndCapture(s, &g), 901, "invalidated");
  // Relaxed mode allows cuMemAlloc, but synchronizing the capturing stream fails.
  OK(cuStreamBeginCapture_v2(s, 2));
  OK(cuMemAlloc_v2(&z, 256));
  EXPECT(cuStreamSynchronize(s), 900, "captures a graph");
  EXPECT(cuStreamEndCapture(s, &g), 901, "invalidated");
  OK(cuStreamBeginCapture_v2(s, 2));
  EXPECT(cuCtxSynchronize(), 900, "captures a graph");
  EXPECT(cuStreamEndCapture(s, &g), 901, "invalidated");
  // The legacy stream cannot capture.
  EXPECT(cuStreamBeginCapture_v2(nullptr, 2), 900, "legacy");
  return 0;
}

int graph_replays_its_launches() {
  CHECK(setup(), "setup");
  void* s = nullptr;
  OK(cuStreamCreate(&s, 1));
  int n = 300;
  P y = 0;
  OK(cuMemAllocAsync(&y, n * 4, s));
  OK(cuMemsetD8Async(y, 0, n * 4, s));
  OK(cuStreamBeginCapture_v2(s, 2));
  void* args[] = {&y, &n};
  OK(cuLaunchKernel(fn("emu_increment"), 2, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  n = 1;  // the graph keeps the arguments of the captured launch
  OK(cuLaunchKernel(fn("emu_increment"), 2, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  void* g = nullptr;
  void* e = nullptr;
  OK(cuStreamEndCapture(s, &g));
  OK(cuGraphInstantiateWithFlags(&e, g, 0));
  std::vector<float> out(300, -1.0f);
  OK(cuMemcpyDtoHAsync_v2(out.data(), y, 300 * 4, s));
  CHECK(out[0] == 0.0f, "capture ran the work (%g)", out[0]);
  for (int k = 0; k < 3; ++k) OK(cuGraphLaunch(e, s));
  OK(cuMemcpyDtoHAsync_v2(out.data(), y, 300 * 4, s));
  CHECK(out[0] == 6.0f && out[299] == 3.0f, "after 3 replays: %g %g (want 6 3)", out[0], out[299]);
  printf("  3 replays of a 2-launch graph: y[0] = %g, y[299] = %g\n", out[0], out[299]);
  return 0;
}

int no_current_context() {
  void* ctx = nullptr;
  OK(cuInit(0));
  OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  P x = 0;
  EXPECT(cuMemAlloc_v2(&x, 256), 201, "no current context");
  OK(cuCtxSetCurrent(ctx));
  OK(cuMemAlloc_v2(&x, 256));
  R other = 0;
  std::thread t([&] { other = cuMemAlloc_v2(&x, 256); });
  t.join();
  CHECK(other == 201, "another thread without cuCtxSetCurrent got %d", other);
  printf("  cuMemAlloc on a thread with no current context -> 201\n");
  return 0;
}

int bad_warp_collective() {
  CHECK(setup(), "setup");
  P y = 0;
  OK(cuMemAllocAsync(&y, 32 * 4, nullptr));
  void* args[] = {&y};
  OK(cuLaunchKernel(fn("emu_shfl_after_exit"), 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  EXPECT(cuStreamSynchronize(nullptr), 715, "exited");
  return 0;
}

int deadlock_is_reported() {
  CHECK(setup(), "setup");
  P y = 0;
  OK(cuMemAllocAsync(&y, 64 * 4, nullptr));
  void* args[] = {&y};
  OK(cuLaunchKernel(fn("emu_deadlock"), 1, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr));
  EXPECT(cuStreamSynchronize(nullptr), 719, "deadlock");
  return 0;
}

int ptx_version_and_target() {
  void* ctx = setup();
  CHECK(ctx, "setup");
  void* m = nullptr;
  EXPECT(cuModuleLoadData(&m, ".version 9.1\n.target sm_90\n.entry emu_increment(\n"), 222, "9.1");
  EXPECT(cuModuleLoadData(&m, ".version 9.0\n.target sm_100\n.entry emu_increment(\n"), 209, "sm_100");
  EXPECT(cuModuleLoadData(&m, ".version 9.0\n.target sm_90\n.entry no_such_kernel(\n"), 200, "no_such_kernel");
  return 0;
}

int copies_are_bounds_checked() {
  CHECK(setup(), "setup");
  P x = 0;
  OK(cuMemAllocAsync(&x, 1000, nullptr));
  std::vector<char> h(2000);
  EXPECT(cuMemcpyHtoDAsync_v2(x, h.data(), 1001, nullptr), 1, "past the end");
  EXPECT(cuMemcpyDtoHAsync_v2(h.data(), x + 8, 1000, nullptr), 1, "past the end");
  EXPECT(cuMemsetD8Async(x, 0, 1001, nullptr), 1, "past the end");
  return 0;
}

int cublas_oob_is_an_illegal_address() {
  void* lib = dlopen("libcublas.so", RTLD_NOW);
  CHECK(lib, "dlopen libcublas.so: %s", dlerror());
  auto create = (int (*)(void**))dlsym(lib, "cublasCreate_v2");
  auto gemm = (int (*)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                       const void*, void*, int, int, int, int))dlsym(lib, "cublasGemmEx");
  CHECK(create && gemm, "cuBLAS symbols");
  CHECK(setup(), "setup");
  void* h = nullptr;
  CHECK(create(&h) == 0, "cublasCreate");
  // C (4x3) = A^T (4x5)^T... A stored 5x4 (lda 5), B 5x3 (ldb 5), f32.
  int m = 4, n = 3, k = 5;
  std::vector<float> a(20), b(15), c(12);
  for (int i = 0; i < 20; ++i) a[i] = (float)(i % 7) - 3.0f;
  for (int i = 0; i < 15; ++i) b[i] = (float)(i % 5) * 0.5f;
  P da = upload(a), db = upload(b), dc = 0;
  OK(cuMemAllocAsync(&dc, 12 * 4, nullptr));
  float alpha = 1.0f, beta = 0.0f;
  CHECK(gemm(h, 1, 0, m, n, k, &alpha, (void*)da, 0, 5, (void*)db, 0, 5, &beta, (void*)dc, 0, 4, 68, -1) == 0,
        "gemm");
  OK(cuMemcpyDtoHAsync_v2(c.data(), dc, 48, nullptr));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float want = 0;
      for (int p = 0; p < k; ++p) want += a[p + i * 5] * b[p + j * 5];
      CHECK(std::fabs(c[i + j * 4] - want) < 1e-5f, "C(%d,%d) = %g, want %g", i, j, c[i + j * 4], want);
    }
  printf("  cublasGemmEx (A transposed, lda 5) matches the CPU\n");
  CHECK(gemm(h, 1, 0, m, n, k, &alpha, (void*)da, 0, 6, (void*)db, 0, 5, &beta, (void*)dc, 0, 4, 68, -1) == 0,
        "gemm with lda 6");
  EXPECT(cuStreamSynchronize(nullptr), 700, "matrix A");
  return 0;
}


int nvrtc_takes_only_the_built_source() {
  void* lib = dlopen("libnvrtc.so", RTLD_NOW);
  CHECK(lib, "dlopen libnvrtc.so: %s", dlerror());
  auto create = (int (*)(void**, const char*, const char*, int, const char* const*, const char* const*))dlsym(
      lib, "nvrtcCreateProgram");
  auto compile = (int (*)(void*, int, const char* const*))dlsym(lib, "nvrtcCompileProgram");
  auto ptx_size = (int (*)(void*, size_t*))dlsym(lib, "nvrtcGetPTXSize");
  auto ptx = (int (*)(void*, char*))dlsym(lib, "nvrtcGetPTX");
  auto log_size = (int (*)(void*, size_t*))dlsym(lib, "nvrtcGetProgramLogSize");
  auto log = (int (*)(void*, char*))dlsym(lib, "nvrtcGetProgramLog");
  CHECK(create && compile && ptx_size && ptx && log_size && log, "NVRTC symbols");
  const char* dir = getenv("EMU_SELFTEST_KERNELS");
  CHECK(dir, "EMU_SELFTEST_KERNELS names tests/kernels");
  std::string path = std::string(dir) + "/emu_selftest.cu";
  FILE* f = fopen(path.c_str(), "rb");
  CHECK(f, "open %s", path.c_str());
  std::string src;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) src.append(buf, n);
  fclose(f);
  const char* opts[] = {"--gpu-architecture=compute_90", "--std=c++17"};
  void* p = nullptr;
  CHECK(create(&p, src.c_str(), "emu_selftest.cu", 0, nullptr, nullptr) == 0, "create");
  CHECK(compile(p, 2, opts) == 0, "the source the emulator was built from compiles");
  size_t len = 0;
  CHECK(ptx_size(p, &len) == 0 && len > 1, "PTX size");
  std::string text(len, '\0');
  CHECK(ptx(p, &text[0]) == 0, "PTX");
  CHECK(text.find(".entry emu_block_sum(") != std::string::npos, "PTX names emu_block_sum: %s", text.c_str());
  void* m = nullptr;
  CHECK(setup(), "setup");
  OK(cuModuleLoadData(&m, text.c_str()));
  std::string changed = src + "\n// one more line\n";
  CHECK(create(&p, changed.c_str(), "emu_selftest.cu", 0, nullptr, nullptr) == 0, "create");
  CHECK(compile(p, 2, opts) == 6, "a changed source is a compilation error (NVRTC_ERROR_COMPILATION)");
  CHECK(log_size(p, &len) == 0, "log size");
  std::string lg(len, '\0');
  log(p, &lg[0]);
  CHECK(lg.find("differs") != std::string::npos, "log: %s", lg.c_str());
  printf("  changed source: %s", lg.c_str());
  return 0;
}

struct Case {
  const char* name;
  int (*run)();
};
const Case kCases[] = {
    {"oob_read_past_end", oob_read_past_end},
    {"oob_read_before_start", oob_read_before_start},
    {"poison_reads_as_nan", poison_reads_as_nan},
    {"too_many_threads", too_many_threads},
    {"dynamic_smem_needs_attribute", dynamic_smem_needs_attribute},
    {"dynamic_shared_memory_works", dynamic_shared_memory_works},
    {"misaligned_vector_load", misaligned_vector_load},
    {"use_after_free", use_after_free},
    {"double_free", double_free},
    {"sync_calls_during_capture", sync_calls_during_capture},
    {"graph_replays_its_launches", graph_replays_its_launches},
    {"no_current_context", no_current_context},
    {"bad_warp_collective", bad_warp_collective},
    {"deadlock_is_reported", deadlock_is_reported},
    {"ptx_version_and_target", ptx_version_and_target},
    {"copies_are_bounds_checked", copies_are_bounds_checked},
    {"cublas_oob_is_an_illegal_address", cublas_oob_is_an_illegal_address},
    {"nvrtc_takes_only_the_built_source", nvrtc_takes_only_the_built_source},
};

}  // namespace

int main(int argc, char** argv) {
  int passed = 0, failed = 0;
  for (const Case& c : kCases) {
    bool want = argc < 2;
    for (int i = 1; i < argc; ++i) want |= std::strcmp(argv[i], c.name) == 0;
    if (!want) continue;
    printf("== %s\n", c.name);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      int r = c.run();
      fflush(stdout);
      fflush(stderr);
      _exit(r);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    printf("%s %s%s\n", ok ? "PASS" : "FAIL", c.name,
           WIFSIGNALED(st) ? (" (killed by signal " + std::to_string(WTERMSIG(st)) + ")").c_str() : "");
    (ok ? passed : failed)++;
  }
  printf("emulator selftest: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
