// libcuda.so, emulated on the CPU (docs/CUDA-EMULATOR.md): the driver entry points the
// CUDA runner reaches through cudarc's dynamic loading, strict like the real driver.
//
// - One emulated H200 (sm_90, 132 SMs, 141 GB, 228 KB shared per SM, 48 KB default /
//   227 KB opt-in dynamic shared memory per block).
// - Device memory: every allocation is its own mapping inside one reserved range, with
//   an inaccessible page before and after, the buffer placed against the trailing guard
//   page (start aligned to 256 bytes); fresh memory is poisoned with 0xFF bytes (NaN as
//   f32/f16); freed memory becomes inaccessible and its addresses are never reused. A
//   kernel touching a guard page or freed memory faults: the launch ends with
//   CUDA_ERROR_ILLEGAL_ADDRESS naming the kernel, block, thread, address and buffer, and
//   the context is unusable from then on (sticky), as on a GPU.
// - Streams: each has an executor thread running its work in order (kernels as fibers,
//   tools/cuda-emu/runtime.cpp); events order streams; the legacy stream synchronises
//   with blocking streams.
// - Graph capture records a stream's work (kernels with a copy of their arguments,
//   copies, memsets, host calls), instantiate copies the record, launch replays it.
//   Synchronous calls during capture fail as the real driver fails them.
// - Modules: cuModuleLoadData reads the `.entry` names of the PTX text and binds each to
//   the C++ build of the kernel of that name (emu_registry.h).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "emu_registry.h"
#include "emu_runtime.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_ILLEGAL_STATE_ = 401,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
  CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
  CUDA_ERROR_CAPTURED_EVENT = 907,
  CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
};

namespace {

// ---- error texts ---------------------------------------------------------------------------

struct ErrName {
  int code;
  const char* name;
  const char* text;
};
const ErrName kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {710, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "operation would make the legacy stream depend on a capturing blocking stream"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capture was not joined"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

// Process-lifetime state is never destroyed: executor threads may still run at exit.
std::mutex& g_detail_mu = *new std::mutex;
std::deque<std::string>& g_texts = *new std::deque<std::string>;  // returned by cuGetErrorString
std::map<int, std::string>& g_detail = *new std::map<int, std::string>;  // last detail per code

bool verbose() {
  static int v = -1;
  if (v < 0) {
    const char* e = getenv("CUDA_EMU_VERBOSE");
    v = e && *e && *e != '0';
  }
  return v;
}

// Returns `code` after remembering why (cuGetErrorString shows the last reason per code).
CUresult fail(CUresult code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
CUresult fail(CUresult code, const char* fmt, ...) {
  char b[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  {
    std::lock_guard<std::mutex> l(g_detail_mu);
    g_detail[code] = b;
  }
  if (verbose()) fprintf(stderr, "cuda-emu: error %d: %s\n", code, b);
  return code;
}

// ---- the device ------------------------------------------------------------------------------

constexpr unsigned long long kTotalMem = 150754820096ull;  // 143771 MiB, as an H200 reports
constexpr size_t kPage = 4096;
constexpr size_t kArena = 1ull << 40;                      // reserved device address space
constexpr int kSmemDefault = 48 * 1024;
constexpr int kSmemOptin = 227 * 1024;

struct Alloc {
  unsigned long long id;
  uintptr_t region;     // first byte of the leading guard page
  size_t region_len;    // guard + data pages + guard
  uintptr_t ptr;        // what the caller got
  size_t size;
  bool freed = false;
  const char* how;
  bool free_pending = false;  // cuMemFreeAsync enqueued
  std::thread::id owner;      // the allocating thread (poisons it before its next work)
};

struct Ctx;
struct Stream;

struct Op {
  std::string what;
  // Returns 0 or a fault code with *msg set.
  std::function<int(std::string* msg)> run;
};

struct Graph {
  std::vector<Op> ops;
};
struct GraphExec {
  std::vector<Op> ops;
};

struct Event {
  Ctx* ctx;
  Stream* stream = nullptr;
  unsigned long long seq = 0;
  bool captured = false;
};

struct Stream {
  Ctx* ctx;
  bool legacy = false;
  bool blocking = false;  // synchronises with the legacy stream
  std::mutex mu;
  std::condition_variable cv, done_cv;
  std::deque<std::pair<unsigned long long, Op>> q;
  unsigned long long submitted = 0, completed = 0;
  bool stop = false;
  std::thread worker;
  // capture
  bool capturing = false;
  bool invalidated = false;
  int capture_mode = 0;
  std::thread::id capture_thread;
  std::unique_ptr<Graph> graph;
  ~Stream();
};

struct Module {
  Ctx* ctx;
  std::map<std::string, const emu::KernelDef*> funcs;
};

struct Function {
  Module* mod;
  const emu::KernelDef* def;
  int max_dyn_smem = kSmemDefault;
};

struct Ctx {
  std::atomic<bool> active{false};
  int retain = 0;
  std::atomic<int> sticky{0};
  std::string sticky_msg;
  std::unique_ptr<Stream> legacy;
  std::set<Stream*> streams;
  std::set<Event*> events;
  std::set<Module*> modules;
  std::set<Function*> functions;
  std::set<Graph*> graphs;
  std::set<GraphExec*> execs;
};

// Everything below is guarded by g_mu unless it is a stream's own queue.
std::mutex& g_mu = *new std::mutex;
bool g_init = false;
int g_devices = 1;
Ctx& g_ctx = *new Ctx;  // the primary context of device 0
thread_local std::vector<Ctx*> t_ctx_stack;
uintptr_t g_arena = 0;
size_t g_arena_used = 0;
unsigned long long g_next_id = 1;
std::map<uintptr_t, Alloc>& g_allocs = *new std::map<uintptr_t, Alloc>;  // by region start
// Fresh allocations not yet poisoned (region start): poisoned before any work that could
// read them is enqueued, unless a memset of the whole buffer comes first (alloc_zeros:
// its pages stay untouched zero pages, so a large KV pool costs no host memory up front).
std::set<uintptr_t>& g_pending_poison = *new std::set<uintptr_t>;
size_t g_live_bytes = 0;
size_t g_limit = 0;

Ctx* current() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

size_t mem_limit() {
  if (g_limit) return g_limit;
  size_t lim = 0;
  if (const char* e = getenv("CUDA_EMU_MEM_LIMIT")) lim = strtoull(e, nullptr, 0);
  // Default: the whole device. Memory costs the host only where it is touched (a
  // buffer zeroed whole right after its allocation stays untouched zero pages).
  if (!lim) lim = kTotalMem;
  g_limit = std::min<size_t>(lim, kTotalMem);
  return g_limit;
}

// The allocation whose region (guards included) holds `a`, or the nearest one before it.
const Alloc* find_alloc(uintptr_t a, bool* inside_region) {
  *inside_region = false;
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  *inside_region = a < it->second.region + it->second.region_len;
  return &it->second;
}

std::string describe_locked(uintptr_t a) {
  char b[400];
  if (!g_arena || a < g_arena || a >= g_arena + kArena) {
    snprintf(b, sizeof b, "0x%llx is not device memory (a host address or garbage)", (unsigned long long)a);
    return b;
  }
  bool in;
  const Alloc* al = find_alloc(a, &in);
  if (!al) return "not inside any device buffer";
  const char* state = al->freed ? "freed " : "";
  if (a >= al->ptr && a < al->ptr + al->size) {
    snprintf(b, sizeof b, "byte %llu of %sdevice buffer #%llu (%zu bytes at 0x%llx, from %s)%s",
             (unsigned long long)(a - al->ptr), state, al->id, al->size, (unsigned long long)al->ptr, al->how,
             al->freed ? ": use after free" : "");
  } else if (a >= al->ptr + al->size) {
    snprintf(b, sizeof b, "%llu bytes past the end of %sdevice buffer #%llu (%zu bytes at 0x%llx, from %s)",
             (unsigned long long)(a - al->ptr - al->size), state, al->id, al->size, (unsigned long long)al->ptr,
             al->how);
  } else {
    snprintf(b, sizeof b, "%llu bytes before the start of %sdevice buffer #%llu (%zu bytes at 0x%llx, from %s)",
             (unsigned long long)(al->ptr - a), state, al->id, al->size, (unsigned long long)al->ptr, al->how);
  }
  return b;
}

std::string describe(uintptr_t a) {
  std::lock_guard<std::mutex> l(g_mu);
  return describe_locked(a);
}

// [p, p+n) lies in one live allocation.
bool range_ok_locked(uintptr_t p, size_t n, std::string* why) {
  if (!g_arena || p < g_arena || p >= g_arena + kArena) {
    *why = describe_locked(p);
    return false;
  }
  bool in;
  const Alloc* al = find_alloc(p, &in);
  if (!al || p < al->ptr || p + n > al->ptr + al->size || al->freed) {
    char b[600];
    snprintf(b, sizeof b, "%zu bytes at 0x%llx: %s", n, (unsigned long long)p,
             describe_locked(al && p >= al->ptr && p < al->ptr + al->size && !al->freed ? al->ptr + al->size : p)
                 .c_str());
    *why = b;
    return false;
  }
  return true;
}

CUresult device_alloc(size_t size, const char* how, CUdeviceptr* out) {
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_arena) {
    void* p = mmap(nullptr, kArena, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuda-emu: cannot reserve the device address range");
    g_arena = (uintptr_t)p;
    emu::set_address_describer(&describe);
  }
  if (size > mem_limit() - std::min(mem_limit(), g_live_bytes))
    return fail(CUDA_ERROR_OUT_OF_MEMORY,
                "%s(%zu bytes): the emulated device lends at most %zu bytes (CUDA_EMU_MEM_LIMIT), %zu in use", how,
                size, mem_limit(), g_live_bytes);
  size_t data = (std::max<size_t>(size, 1) + kPage - 1) / kPage * kPage;
  size_t region_len = kPage + data + kPage;
  if (g_arena_used + region_len > kArena)
    return fail(CUDA_ERROR_OUT_OF_MEMORY, "%s: the emulator's device address range is used up", how);
  uintptr_t region = g_arena + g_arena_used;
  g_arena_used += region_len;
  void* d = mmap((void*)(region + kPage), data, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (d == MAP_FAILED) return fail(CUDA_ERROR_OUT_OF_MEMORY, "%s(%zu bytes): host mmap failed", how, size);
  size_t rounded = (size + 255) / 256 * 256;
  uintptr_t ptr = region + kPage + data - std::max<size_t>(rounded, 256);
  Alloc a{g_next_id++, region, region_len, ptr, size, false, how, false, std::this_thread::get_id()};
  g_allocs[region] = a;
  g_pending_poison.insert(region);  // never-written memory will read as NaN (0xFF bytes)
  g_live_bytes += size;
  *out = ptr;
  return CUDA_SUCCESS;
}

// Poisons the calling thread's fresh allocations (another thread's may be about to get
// their whole-buffer memset, which must find them untouched).
void flush_poison_locked() {
  const std::thread::id me = std::this_thread::get_id();
  for (auto it = g_pending_poison.begin(); it != g_pending_poison.end();) {
    const Alloc& a = g_allocs[*it];
    if (a.owner == me) {
      std::memset((void*)(a.region + kPage), 0xff, a.region_len - 2 * kPage);
      it = g_pending_poison.erase(it);
    } else {
      ++it;
    }
  }
}

void flush_poison() {
  std::lock_guard<std::mutex> l(g_mu);
  flush_poison_locked();
}

// A memset of the whole of a still-pending buffer: to 0 it needs no work at all (the
// pages are fresh zero pages); either way the buffer needs no poison any more.
bool memset_covers_pending(uintptr_t p, size_t n, unsigned char v) {
  std::lock_guard<std::mutex> l(g_mu);
  bool in;
  const Alloc* a = find_alloc(p, &in);
  if (!a || a->ptr != p || a->size != n || !g_pending_poison.count(a->region)) {
    flush_poison_locked();
    return false;
  }
  g_pending_poison.erase(a->region);
  if (v != 0) flush_poison_locked();
  return v == 0;
}

CUresult device_free(CUdeviceptr p, const char* how) {
  std::lock_guard<std::mutex> l(g_mu);
  bool in;
  const Alloc* c = g_arena ? find_alloc((uintptr_t)p, &in) : nullptr;
  if (!c || c->ptr != (uintptr_t)p) {
    return fail(CUDA_ERROR_INVALID_VALUE, "%s(0x%llx): not the start of a device allocation (%s)", how, p,
                describe_locked((uintptr_t)p).c_str());
  }
  Alloc& a = g_allocs[c->region];
  if (a.freed) return fail(CUDA_ERROR_INVALID_VALUE, "%s(0x%llx): buffer #%llu was already freed", how, p, a.id);
  a.freed = true;
  g_live_bytes -= a.size;
  g_pending_poison.erase(a.region);
  // Inaccessible from now on (and its pages go back to the host); the addresses stay reserved.
  mmap((void*)a.region, a.region_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return CUDA_SUCCESS;
}

// Marks a live allocation free-pending (cuMemFreeAsync: checked now, freed in stream order).
CUresult check_free(CUdeviceptr p, const char* how) {
  std::lock_guard<std::mutex> l(g_mu);
  bool in;
  const Alloc* c = g_arena ? find_alloc((uintptr_t)p, &in) : nullptr;
  if (!c || c->ptr != (uintptr_t)p)
    return fail(CUDA_ERROR_INVALID_VALUE, "%s(0x%llx): not the start of a device allocation (%s)", how, p,
                describe_locked((uintptr_t)p).c_str());
  if (c->freed || c->free_pending)
    return fail(CUDA_ERROR_INVALID_VALUE, "%s(0x%llx): buffer #%llu was already freed", how, p, c->id);
  g_allocs[c->region].free_pending = true;
  return CUDA_SUCCESS;
}

// ---- streams -------------------------------------------------------------------------------

void run_ops(Stream* s);

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> l(mu);
    stop = true;
  }
  cv.notify_all();
  if (worker.joinable()) worker.join();
}

void set_sticky(Ctx* c, int code, const std::string& msg) {
  int expected = 0;
  if (c->sticky.compare_exchange_strong(expected, code)) {
    c->sticky_msg = msg;
    fprintf(stderr, "cuda-emu: device fault %d: %s\n", code, msg.c_str());
    std::lock_guard<std::mutex> l(g_detail_mu);
    g_detail[code] = msg;
  }
}

void run_ops(Stream* s) {
  for (;;) {
    std::pair<unsigned long long, Op> item;
    {
      std::unique_lock<std::mutex> l(s->mu);
      s->cv.wait(l, [&] { return s->stop || !s->q.empty(); });
      if (s->q.empty()) return;
      item = std::move(s->q.front());
      s->q.pop_front();
    }
    if (!s->ctx->sticky.load()) {
      std::string msg;
      int r = item.second.run(&msg);
      if (r) set_sticky(s->ctx, r, msg.empty() ? item.second.what : msg);
    }
    {
      std::lock_guard<std::mutex> l(s->mu);
      s->completed = item.first;
    }
    s->done_cv.notify_all();
  }
}

// Appends `op` to the stream's queue (starting its executor), or to its capture.
void flush_poison();
unsigned long long enqueue(Stream* s, Op op, bool flush = true) {
  if (flush) flush_poison();
  std::lock_guard<std::mutex> l(s->mu);
  if (s->capturing) {
    s->graph->ops.push_back(std::move(op));
    return s->submitted;
  }
  if (!s->worker.joinable()) s->worker = std::thread(run_ops, s);
  s->q.emplace_back(++s->submitted, std::move(op));
  s->cv.notify_all();
  return s->submitted;
}

void wait_seq(Stream* s, unsigned long long seq) {
  std::unique_lock<std::mutex> l(s->mu);
  s->done_cv.wait(l, [&] { return s->completed >= seq; });
}

void drain(Stream* s) {
  unsigned long long seq;
  {
    std::lock_guard<std::mutex> l(s->mu);
    seq = s->submitted;
  }
  wait_seq(s, seq);
}

Stream* any_capture_locked(Ctx* c, bool global_only) {
  for (Stream* s : c->streams)
    if (s->capturing && (!global_only || s->capture_mode == 0)) return s;
  return nullptr;
}

// "Potentially unsafe" calls (synchronous copies, cuMemAlloc, cuMemFree, cuCtxSynchronize)
// are refused while this thread captures in global or thread-local mode, or any thread
// captures in global mode.
CUresult unsafe_call_check(Ctx* c, const char* call) {
  std::lock_guard<std::mutex> l(g_mu);
  for (Stream* s : c->streams) {
    if (!s->capturing) continue;
    bool mine = s->capture_thread == std::this_thread::get_id();
    if (s->capture_mode == 0 || (s->capture_mode == 1 && mine)) {
      s->invalidated = true;
      return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  "%s while stream %p captures a graph (mode %s): not permitted (the capture is invalidated)", call,
                  (void*)s, s->capture_mode == 0 ? "global" : "thread-local");
    }
  }
  return CUDA_SUCCESS;
}

// The work a new op on `s` must wait for besides its own stream: the legacy stream waits
// for every blocking stream and blocking streams wait for the legacy stream.
CUresult implicit_deps(Ctx* c, Stream* s, std::vector<std::pair<Stream*, unsigned long long>>* deps) {
  std::lock_guard<std::mutex> l(g_mu);
  if (s->legacy) {
    for (Stream* o : c->streams) {
      if (o == s || !o->blocking) continue;
      if (o->capturing) {
        o->invalidated = true;
        return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                    "work on the legacy stream would wait for blocking stream %p, which captures a graph", (void*)o);
      }
      std::lock_guard<std::mutex> l2(o->mu);
      deps->emplace_back(o, o->submitted);
    }
  } else if (s->blocking && c->legacy) {
    Stream* o = c->legacy.get();
    std::lock_guard<std::mutex> l2(o->mu);
    deps->emplace_back(o, o->submitted);
  }
  return CUDA_SUCCESS;
}

void push_deps(Stream* s, const std::vector<std::pair<Stream*, unsigned long long>>& deps) {
  for (auto& d : deps) {
    if (d.second == 0) continue;
    Stream* o = d.first;
    unsigned long long seq = d.second;
    enqueue(s, Op{"implicit legacy-stream dependency", [o, seq](std::string*) {
                    wait_seq(o, seq);
                    return 0;
                  }});
  }
}

// ---- argument checks --------------------------------------------------------------------

#define NEED_INIT()                                                                   \
  do {                                                                                \
    if (!g_init) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", __func__); \
  } while (0)

// The current context, active and without a sticky error; else returns the error.
#define NEED_CTX(c)                                                                                    \
  NEED_INIT();                                                                                         \
  Ctx* c = current();                                                                                  \
  if (!c || !c->active)                                                                                \
    return fail(CUDA_ERROR_INVALID_CONTEXT, "%s: no current context on this thread (cuCtxSetCurrent)", \
                __func__);                                                                             \
  if (int st_ = c->sticky.load()) return st_;

Stream* resolve_stream(Ctx* c, void* h, CUresult* err, const char* call) {
  uintptr_t v = (uintptr_t)h;
  if (v == 0 || v == 1 || v == 2) {
    std::lock_guard<std::mutex> l(g_mu);
    if (!c->legacy) {
      c->legacy.reset(new Stream());
      c->legacy->ctx = c;
      c->legacy->legacy = true;
    }
    return c->legacy.get();
  }
  std::lock_guard<std::mutex> l(g_mu);
  Stream* s = (Stream*)h;
  if (!c->streams.count(s)) {
    *err = fail(CUDA_ERROR_INVALID_HANDLE, "%s: stream %p is not a live stream of the current context", call, h);
    return nullptr;
  }
  return s;
}

#define NEED_STREAM(s, h)                                   \
  CUresult serr_ = CUDA_SUCCESS;                            \
  Stream* s = resolve_stream(c, (void*)(h), &serr_, __func__); \
  if (!s) return serr_;

void reset_ctx_locked(Ctx* c) {
  // The primary context's last release destroys everything made in it.
  std::vector<Stream*> ss(c->streams.begin(), c->streams.end());
  c->streams.clear();
  g_mu.unlock();
  for (Stream* s : ss) delete s;
  c->legacy.reset();
  g_mu.lock();
  for (auto& kv : g_allocs) {
    Alloc& a = kv.second;
    if (!a.freed) {
      a.freed = true;
      g_live_bytes -= a.size;
      mmap((void*)a.region, a.region_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
  }
  g_pending_poison.clear();
  for (Event* e : c->events) delete e;
  c->events.clear();
  for (Function* f : c->functions) delete f;
  c->functions.clear();
  for (Module* m : c->modules) delete m;
  c->modules.clear();
  for (Graph* g : c->graphs) delete g;
  c->graphs.clear();
  for (GraphExec* g : c->execs) delete g;
  c->execs.clear();
  c->sticky = 0;
  c->sticky_msg.clear();
  c->active = false;
}

std::vector<const emu::ModuleDef*>& registry() {
  static std::vector<const emu::ModuleDef*>* r = new std::vector<const emu::ModuleDef*>;
  return *r;
}

}  // namespace

void emu::register_module(const emu::ModuleDef* m) { registry().push_back(m); }

// ---- emulator-private entry points (libnvrtc.so and libcublas.so of the emulator) --------

// The module whose source is exactly `src` (or, when none is, the one named `stem`).
EXPORT const emu::ModuleDef* cuEmuFindModule(const char* src, size_t len, const char* stem) {
  for (const emu::ModuleDef* m : registry())
    if (m->source_len == len && std::memcmp(m->source, src, len) == 0) return m;
  if (stem)
    for (const emu::ModuleDef* m : registry())
      if (std::strcmp(m->stem, stem) == 0) return m;
  return nullptr;
}

EXPORT int cuEmuCheckRange(CUdeviceptr p, size_t n, char* why, size_t why_len) {
  std::lock_guard<std::mutex> l(g_mu);
  std::string w;
  if (range_ok_locked((uintptr_t)p, n, &w)) return 1;
  snprintf(why, why_len, "%s", w.c_str());
  return 0;
}

// Enqueues fn(data) (a copy of `size` bytes of `data`) on `stream` of the current
// context, in stream order and into a capture like any other work. fn returns 0 or a
// fault code (writing a message into msg).
EXPORT CUresult cuEmuEnqueueHost(void* stream, int (*fn)(const void* data, char* msg, size_t msg_len),
                                 const void* data, size_t size, const char* what) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  std::vector<std::pair<Stream*, unsigned long long>> deps;
  if (CUresult r = implicit_deps(c, s, &deps)) return r;
  push_deps(s, deps);
  auto buf = std::make_shared<std::vector<char>>((const char*)data, (const char*)data + size);
  std::string name = what ? what : "host function";
  enqueue(s, Op{name, [fn, buf, name](std::string* msg) {
                  char m[600] = {0};
                  int r = fn(buf->data(), m, sizeof m);
                  if (r) *msg = name + ": " + m;
                  return r;
                }});
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEmuFail(int code, const char* detail) { return fail(code, "%s", detail); }

// ---- initialisation, devices ----------------------------------------------------------------

EXPORT CUresult cuInit(unsigned flags) {
  if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuInit(%u): flags must be 0", flags);
  std::lock_guard<std::mutex> l(g_mu);
  const char* vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis && (!*vis || vis[0] == '-' || (vis[0] != '0' && strstr(vis, "GPU-") != vis)))
    g_devices = 0;
  g_init = true;
  if (!g_devices) return fail(CUDA_ERROR_NO_DEVICE, "CUDA_VISIBLE_DEVICES=\"%s\" hides the emulated device", vis);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
  if (!v) return fail(CUDA_ERROR_INVALID_VALUE, "cuDriverGetVersion(NULL)");
  *v = 13000;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int* n) {
  NEED_INIT();
  if (!n) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount(NULL)");
  *n = g_devices;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  NEED_INIT();
  if (!d) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet(NULL)");
  if (ordinal < 0 || ordinal >= g_devices)
    return fail(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet(%d): %d device(s)", ordinal, g_devices);
  *d = ordinal;
  return CUDA_SUCCESS;
}

#define NEED_DEV(d)                                                                     \
  NEED_INIT();                                                                          \
  if ((d) < 0 || (d) >= g_devices) return fail(CUDA_ERROR_INVALID_DEVICE, "%s: device %d", __func__, (int)(d));

EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  NEED_DEV(d);
  if (!name || len <= 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName: no buffer");
  snprintf(name, (size_t)len, "%s", "NVIDIA H200 (cuda-emu)");
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  NEED_DEV(d);
  if (!bytes) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem(NULL)");
  *bytes = kTotalMem;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(unsigned char* uuid, CUdevice d) {
  NEED_DEV(d);
  for (int i = 0; i < 16; ++i) uuid[i] = (unsigned char)(0xE0 + i);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(unsigned char* uuid, CUdevice d) { return cuDeviceGetUuid(uuid, d); }

EXPORT CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
  NEED_DEV(d);
  if (!v) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute(NULL)");
  switch (attr) {
    case 1: *v = 1024; break;                 // max threads per block
    case 2: case 3: *v = 1024; break;         // max block dim x, y
    case 4: *v = 64; break;                   // max block dim z
    case 5: *v = 2147483647; break;           // max grid dim x
    case 6: case 7: *v = 65535; break;        // max grid dim y, z
    case 8: *v = kSmemDefault; break;         // shared memory per block
    case 9: *v = 65536; break;                // constant memory
    case 10: *v = 32; break;                  // warp size
    case 11: *v = 2147483647; break;          // max pitch
    case 12: *v = 65536; break;               // registers per block
    case 13: *v = 1980000; break;             // clock rate kHz
    case 14: *v = 512; break;                 // texture alignment
    case 15: *v = 1; break;                   // gpu overlap
    case 16: *v = 132; break;                 // multiprocessors
    case 17: *v = 0; break;                   // kernel exec timeout
    case 18: *v = 0; break;                   // integrated
    case 19: *v = 1; break;                   // can map host memory
    case 20: *v = 0; break;                   // compute mode default
    case 31: *v = 1; break;                   // concurrent kernels
    case 32: *v = 1; break;                   // ECC
    case 33: *v = 0x19; break;                // PCI bus
    case 34: *v = 0; break;
    case 36: *v = 3201000; break;             // memory clock kHz
    case 37: *v = 6144; break;                // bus width
    case 38: *v = 60 * 1024 * 1024; break;    // L2
    case 39: *v = 2048; break;                // threads per SM
    case 40: *v = 4; break;                   // async engines
    case 41: *v = 1; break;                   // unified addressing
    case 50: *v = 0; break;
    case 75: *v = 9; break;                   // compute capability major
    case 76: *v = 0; break;                   // minor
    case 78: *v = 1; break;                   // stream priorities
    case 79: case 80: *v = 1; break;
    case 81: *v = 228 * 1024; break;          // shared memory per SM
    case 82: *v = 65536; break;               // registers per SM
    case 83: *v = 1; break;                   // managed memory
    case 95: *v = 1; break;                   // cooperative launch
    case 97: *v = kSmemOptin; break;          // opt-in shared memory per block
    case 106: *v = 32; break;                 // blocks per SM
    case 111: *v = 1024; break;               // reserved shared memory per block
    case 115: *v = 1; break;                  // memory pools supported
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}

// ---- contexts -----------------------------------------------------------------------------------

EXPORT CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice d) {
  NEED_DEV(d);
  if (!ctx) return fail(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain(NULL)");
  std::lock_guard<std::mutex> l(g_mu);
  g_ctx.retain++;
  g_ctx.active = true;
  *ctx = &g_ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  NEED_DEV(d);
  std::lock_guard<std::mutex> l(g_mu);
  if (g_ctx.retain <= 0)
    return fail(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease: the primary context is not retained");
  if (--g_ctx.retain == 0) reset_ctx_locked(&g_ctx);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
  NEED_DEV(d);
  std::lock_guard<std::mutex> l(g_mu);
  reset_ctx_locked(&g_ctx);
  g_ctx.retain = 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned* flags, int* active) {
  NEED_DEV(d);
  if (flags) *flags = 0;
  if (active) *active = g_ctx.active ? 1 : 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(void** ctx) {
  NEED_INIT();
  if (!ctx) return fail(CUDA_ERROR_INVALID_VALUE, "cuCtxGetCurrent(NULL)");
  *ctx = current();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(void* ctx) {
  NEED_INIT();
  if (ctx && ctx != &g_ctx) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent(%p): not a context", ctx);
  if (ctx && !g_ctx.active) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent: the context was destroyed");
  if (t_ctx_stack.empty()) {
    if (ctx) t_ctx_stack.push_back((Ctx*)ctx);
  } else if (ctx) {
    t_ctx_stack.back() = (Ctx*)ctx;
  } else {
    t_ctx_stack.pop_back();
  }
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(void* ctx) {
  NEED_INIT();
  if (ctx != &g_ctx || !g_ctx.active) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPushCurrent(%p)", ctx);
  t_ctx_stack.push_back((Ctx*)ctx);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(void** ctx) {
  NEED_INIT();
  if (t_ctx_stack.empty()) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent: no current context");
  if (ctx) *ctx = t_ctx_stack.back();
  t_ctx_stack.pop_back();
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  NEED_CTX(c);
  (void)c;
  *d = 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize() {
  NEED_CTX(c);
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (Stream* s = any_capture_locked(c, false)) {
      s->invalidated = true;
      return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  "cuCtxSynchronize while stream %p captures a graph (the capture is invalidated)", (void*)s);
    }
  }
  std::vector<Stream*> ss;
  {
    std::lock_guard<std::mutex> l(g_mu);
    ss.assign(c->streams.begin(), c->streams.end());
  }
  if (c->legacy) ss.push_back(c->legacy.get());
  for (Stream* s : ss) drain(s);
  return c->sticky.load();
}

EXPORT CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  NEED_CTX(c);
  (void)c;
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetApiVersion(void*, unsigned* v) {
  if (v) *v = 13000;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetFlags(unsigned* f) {
  NEED_CTX(c);
  (void)c;
  if (f) *f = 0;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetFlags(unsigned) {
  NEED_CTX(c);
  (void)c;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetLimit(size_t* v, int limit) {
  NEED_CTX(c);
  (void)c;
  (void)limit;
  if (v) *v = 1024;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetLimit(int, size_t) {
  NEED_CTX(c);
  (void)c;
  return CUDA_SUCCESS;
}

// ---- errors -------------------------------------------------------------------------------------

EXPORT CUresult cuGetErrorName(CUresult code, const char** s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrName& e : kErrors)
    if (e.code == code) {
      *s = e.name;
      return CUDA_SUCCESS;
    }
  *s = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult code, const char** s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  const char* text = nullptr;
  for (const ErrName& e : kErrors)
    if (e.code == code) text = e.text;
  if (!text) {
    *s = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> l(g_detail_mu);
  auto it = g_detail.find(code);
  if (it == g_detail.end()) {
    *s = text;
  } else {
    g_texts.push_back(std::string(text) + " [cuda-emu: " + it->second + "]");
    *s = g_texts.back().c_str();
  }
  return CUDA_SUCCESS;
}

// ---- memory -----------------------------------------------------------------------------------

EXPORT CUresult cuMemGetInfo_v2(size_t* free_b, size_t* total) {
  NEED_CTX(c);
  (void)c;
  std::lock_guard<std::mutex> l(g_mu);
  size_t lim = mem_limit();
  if (free_b) *free_b = lim - std::min(lim, g_live_bytes);
  if (total) *total = kTotalMem;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  NEED_CTX(c);
  if (!p) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(NULL)");
  if (n == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc: 0 bytes");
  if (CUresult r = unsafe_call_check(c, "cuMemAlloc")) return r;
  return device_alloc(n, "cuMemAlloc", p);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  if (!p) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAllocAsync(NULL)");
  if (s->capturing)
    return fail(CUDA_ERROR_NOT_SUPPORTED,
                "cuMemAllocAsync during graph capture: graph memory nodes are not emulated (allocate before capture)");
  if (n == 0) {
    *p = 0;
    return CUDA_SUCCESS;
  }
  // The memory is usable in stream order right away (the emulator maps it now).
  return device_alloc(n, "cuMemAllocAsync", p);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_CTX(c);
  if (CUresult r = unsafe_call_check(c, "cuMemFree")) return r;
  if (p == 0) return CUDA_SUCCESS;
  // cuMemFree waits for the work that may still use the buffer.
  std::vector<Stream*> ss;
  {
    std::lock_guard<std::mutex> l(g_mu);
    ss.assign(c->streams.begin(), c->streams.end());
  }
  if (c->legacy) ss.push_back(c->legacy.get());
  for (Stream* s : ss) drain(s);
  return device_free(p, "cuMemFree");
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  if (p == 0) return CUDA_SUCCESS;
  if (s->capturing)
    return fail(CUDA_ERROR_NOT_SUPPORTED,
                "cuMemFreeAsync during graph capture: graph memory nodes are not emulated (free after capture)");
  if (CUresult r = check_free(p, "cuMemFreeAsync")) return r;
  enqueue(s, Op{"cuMemFreeAsync", [p](std::string* msg) {
                  if (device_free(p, "cuMemFreeAsync")) *msg = "cuMemFreeAsync: double free";
                  return 0;
                }});
  return CUDA_SUCCESS;
}

namespace {

CUresult copy_async(Ctx* c, Stream* s, void* dst, const void* src, size_t n, int kind, const char* call,
                    bool sync) {
  // kind: 0 HtoD, 1 DtoH, 2 DtoD
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return fail(CUDA_ERROR_INVALID_VALUE, "%s: NULL pointer", call);
  {
    std::lock_guard<std::mutex> l(g_mu);
    std::string why;
    if (kind != 1 && !range_ok_locked((uintptr_t)dst, n, &why))
      return fail(CUDA_ERROR_INVALID_VALUE, "%s: destination %s", call, why.c_str());
    if (kind != 0 && !range_ok_locked((uintptr_t)src, n, &why))
      return fail(CUDA_ERROR_INVALID_VALUE, "%s: source %s", call, why.c_str());
  }
  std::vector<std::pair<Stream*, unsigned long long>> deps;
  if (CUresult r = implicit_deps(c, s, &deps)) return r;
  push_deps(s, deps);
  bool capturing;
  {
    std::lock_guard<std::mutex> l(s->mu);
    capturing = s->capturing;
  }
  std::string what = call;
  if (kind == 0 && !capturing) {
    // Pageable host memory is staged at the call, as the driver does.
    auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + n);
    enqueue(s, Op{what, [dst, staged](std::string*) {
                    std::memcpy(dst, staged->data(), staged->size());
                    return 0;
                  }});
  } else {
    enqueue(s, Op{what, [dst, src, n](std::string*) {
                    std::memmove(dst, src, n);
                    return 0;
                  }});
  }
  // A copy to pageable host memory returns when it is done (so does a synchronous call).
  if (!capturing && (kind == 1 || sync)) {
    drain(s);
    if (int st = c->sticky.load()) return st;
  }
  return CUDA_SUCCESS;
}

}  // namespace

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  return copy_async(c, s, (void*)dst, src, n, 0, "cuMemcpyHtoDAsync", false);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  return copy_async(c, s, dst, (const void*)src, n, 1, "cuMemcpyDtoHAsync", false);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  return copy_async(c, s, (void*)dst, (const void*)src, n, 2, "cuMemcpyDtoDAsync", false);
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  NEED_CTX(c);
  if (CUresult r = unsafe_call_check(c, "cuMemcpyHtoD")) return r;
  NEED_STREAM(s, 0);
  return copy_async(c, s, (void*)dst, src, n, 0, "cuMemcpyHtoD", true);
}
EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  NEED_CTX(c);
  if (CUresult r = unsafe_call_check(c, "cuMemcpyDtoH")) return r;
  NEED_STREAM(s, 0);
  return copy_async(c, s, dst, (const void*)src, n, 1, "cuMemcpyDtoH", true);
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  NEED_CTX(c);
  if (CUresult r = unsafe_call_check(c, "cuMemcpyDtoD")) return r;
  NEED_STREAM(s, 0);
  return copy_async(c, s, (void*)dst, (const void*)src, n, 2, "cuMemcpyDtoD", true);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  if (n == 0) return CUDA_SUCCESS;
  {
    std::lock_guard<std::mutex> l(g_mu);
    std::string why;
    if (!range_ok_locked((uintptr_t)dst, n, &why))
      return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD8Async: %s", why.c_str());
  }
  std::vector<std::pair<Stream*, unsigned long long>> deps;
  if (CUresult r = implicit_deps(c, s, &deps)) return r;
  push_deps(s, deps);
  bool capturing;
  {
    std::lock_guard<std::mutex> l(s->mu);
    capturing = s->capturing;
  }
  if (!capturing && memset_covers_pending((uintptr_t)dst, n, v)) {
    enqueue(s, Op{"cuMemsetD8Async (fresh zero pages)", [](std::string*) { return 0; }}, false);
    return CUDA_SUCCESS;
  }
  enqueue(s, Op{"cuMemsetD8Async", [dst, v, n](std::string*) {
                  std::memset((void*)dst, v, n);
                  return 0;
                }});
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  NEED_CTX(c);
  if (CUresult r = unsafe_call_check(c, "cuMemsetD8")) return r;
  CUresult r = cuMemsetD8Async(dst, v, n, nullptr);
  if (r) return r;
  drain(c->legacy.get());
  return c->sticky.load();
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned v, size_t n, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  if (n == 0) return CUDA_SUCCESS;
  if (dst % 4) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32Async: 0x%llx is not 4-byte aligned", dst);
  {
    std::lock_guard<std::mutex> l(g_mu);
    std::string why;
    if (!range_ok_locked((uintptr_t)dst, n * 4, &why))
      return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32Async: %s", why.c_str());
  }
  enqueue(s, Op{"cuMemsetD32Async", [dst, v, n](std::string*) {
                  unsigned* p = (unsigned*)dst;
                  for (size_t i = 0; i < n; ++i) p[i] = v;
                  return 0;
                }});
  return CUDA_SUCCESS;
}

// ---- streams and events -----------------------------------------------------------------------

EXPORT CUresult cuStreamCreate(void** out, unsigned flags) {
  NEED_CTX(c);
  if (!out) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate(NULL)");
  if (flags & ~1u) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: flags 0x%x", flags);
  Stream* s = new Stream();
  s->ctx = c;
  s->blocking = !(flags & 1u);
  std::lock_guard<std::mutex> l(g_mu);
  c->streams.insert(s);
  *out = s;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreateWithPriority(void** out, unsigned flags, int) { return cuStreamCreate(out, flags); }

EXPORT CUresult cuStreamDestroy_v2(void* h) {
  NEED_INIT();
  Stream* s = (Stream*)h;
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (!g_ctx.streams.count(s)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy(%p): not a live stream", h);
    if (s->capturing) {
      s->invalidated = true;
    }
    g_ctx.streams.erase(s);
  }
  // Pending work still runs (the destructor drains the queue before joining).
  drain(s);
  delete s;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(void* h) {
  NEED_INIT();
  Ctx* c = &g_ctx;
  if (!c->active) return fail(CUDA_ERROR_INVALID_CONTEXT, "cuStreamSynchronize: the context was destroyed");
  NEED_STREAM(s, h);
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->capturing) {
      s->invalidated = true;
      return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                  "cuStreamSynchronize on a stream that captures a graph (the capture is invalidated)");
    }
  }
  if (s->legacy) {
    std::lock_guard<std::mutex> l(g_mu);
    for (Stream* o : c->streams)
      if (o->blocking && o->capturing) {
        o->invalidated = true;
        return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                    "synchronizing the legacy stream while blocking stream %p captures a graph", (void*)o);
      }
  }
  drain(s);
  return c->sticky.load();
}

EXPORT CUresult cuStreamQuery(void* h) {
  NEED_CTX(c);
  NEED_STREAM(s, h);
  std::lock_guard<std::mutex> l(s->mu);
  if (s->capturing) {
    s->invalidated = true;
    return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamQuery on a capturing stream");
  }
  if (int st = c->sticky.load()) return st;
  return s->completed >= s->submitted ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventCreate(void** out, unsigned flags) {
  NEED_CTX(c);
  (void)flags;
  if (!out) return fail(CUDA_ERROR_INVALID_VALUE, "cuEventCreate(NULL)");
  Event* e = new Event();
  e->ctx = c;
  std::lock_guard<std::mutex> l(g_mu);
  c->events.insert(e);
  *out = e;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(void* h) {
  NEED_INIT();
  std::lock_guard<std::mutex> l(g_mu);
  Event* e = (Event*)h;
  if (!g_ctx.events.erase(e)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy(%p): not a live event", h);
  delete e;
  return CUDA_SUCCESS;
}

namespace {
Event* live_event(void* h) {
  std::lock_guard<std::mutex> l(g_mu);
  return g_ctx.events.count((Event*)h) ? (Event*)h : nullptr;
}
}  // namespace

EXPORT CUresult cuEventRecord(void* h, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  Event* e = live_event(h);
  if (!e) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord(%p): not a live event", h);
  std::lock_guard<std::mutex> l(s->mu);
  e->stream = s;
  e->captured = s->capturing;
  e->seq = s->submitted;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecordWithFlags(void* h, void* stream, unsigned) { return cuEventRecord(h, stream); }

EXPORT CUresult cuStreamWaitEvent(void* stream, void* h, unsigned flags) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  (void)flags;
  Event* e = live_event(h);
  if (!e) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent: %p is not a live event", h);
  if (!e->stream) return CUDA_SUCCESS;  // never recorded: nothing to wait for
  if (e->captured) {
    if (e->stream == s) return CUDA_SUCCESS;
    return fail(CUDA_ERROR_NOT_SUPPORTED,
                "cuStreamWaitEvent on an event recorded during capture by another stream: cross-stream capture is "
                "not emulated");
  }
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->capturing) {
      s->invalidated = true;
      return fail(905 /* CUDA_ERROR_STREAM_CAPTURE_ISOLATION */,
                  "a capturing stream waits on an event recorded outside the capture");
    }
  }
  if (e->stream == s) return CUDA_SUCCESS;
  Stream* o = e->stream;
  unsigned long long seq = e->seq;
  enqueue(s, Op{"cuStreamWaitEvent", [o, seq](std::string*) {
                  wait_seq(o, seq);
                  return 0;
                }});
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(void* h) {
  NEED_INIT();
  Event* e = live_event(h);
  if (!e) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventSynchronize(%p): not a live event", h);
  if (e->captured) return fail(CUDA_ERROR_CAPTURED_EVENT, "cuEventSynchronize on an event recorded during capture");
  if (e->stream) wait_seq(e->stream, e->seq);
  return e->ctx->sticky.load();
}

EXPORT CUresult cuEventQuery(void* h) {
  NEED_INIT();
  Event* e = live_event(h);
  if (!e) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventQuery(%p): not a live event", h);
  if (e->captured) return fail(CUDA_ERROR_CAPTURED_EVENT, "cuEventQuery on an event recorded during capture");
  if (int st = e->ctx->sticky.load()) return st;
  if (!e->stream) return CUDA_SUCCESS;
  std::lock_guard<std::mutex> l(e->stream->mu);
  return e->stream->completed >= e->seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventElapsedTime(float* ms, void* a, void* b) {
  NEED_INIT();
  if (!live_event(a) || !live_event(b)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime: bad event");
  if (ms) *ms = 0.0f;  // timing is not modelled
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventElapsedTime_v2(float* ms, void* a, void* b) { return cuEventElapsedTime(ms, a, b); }

EXPORT CUresult cuLaunchHostFunc(void* stream, void (*fn)(void*), void* user) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  (void)c;
  enqueue(s, Op{"cuLaunchHostFunc", [fn, user](std::string*) {
                  fn(user);
                  return 0;
                }});
  return CUDA_SUCCESS;
}

// ---- graphs -------------------------------------------------------------------------------------

EXPORT CUresult cuStreamBeginCapture_v2(void* stream, int mode) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  if (s->legacy)
    return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamBeginCapture on the legacy (NULL) stream");
  if (mode < 0 || mode > 2) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamBeginCapture: mode %d", mode);
  std::lock_guard<std::mutex> l(s->mu);
  if (s->capturing) return fail(CUDA_ERROR_ILLEGAL_STATE_, "cuStreamBeginCapture: the stream already captures");
  s->capturing = true;
  s->invalidated = false;
  s->capture_mode = mode;
  s->capture_thread = std::this_thread::get_id();
  s->graph.reset(new Graph());
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(void* stream, void** graph) {
  NEED_INIT();
  Ctx* c = &g_ctx;
  NEED_STREAM(s, stream);
  if (!graph) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamEndCapture(NULL)");
  std::unique_ptr<Graph> g;
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (!s->capturing) return fail(CUDA_ERROR_ILLEGAL_STATE_, "cuStreamEndCapture: the stream is not capturing");
    if (s->capture_mode != 2 && s->capture_thread != std::this_thread::get_id())
      return fail(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "cuStreamEndCapture from another thread than the capture's");
    s->capturing = false;
    g = std::move(s->graph);
    if (s->invalidated) {
      *graph = nullptr;
      return fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                  "cuStreamEndCapture: the capture was invalidated by an earlier call not permitted during capture");
    }
  }
  Graph* gp = g.release();
  std::lock_guard<std::mutex> l(g_mu);
  c->graphs.insert(gp);
  *graph = gp;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(void* stream, int* status) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  std::lock_guard<std::mutex> l(s->mu);
  *status = s->capturing ? (s->invalidated ? 2 : 1) : 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
  NEED_CTX(c);
  Graph* g = (Graph*)graph;
  std::lock_guard<std::mutex> l(g_mu);
  if (!c->graphs.count(g)) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: %p is not a graph", graph);
  if (flags & ~0xfull) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: flags 0x%llx", flags);
  if ((flags & 1) && (flags & 4))
    return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: AUTO_FREE_ON_LAUNCH with DEVICE_LAUNCH");
  GraphExec* e = new GraphExec();
  e->ops = g->ops;
  c->execs.insert(e);
  *exec = e;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(void* exec, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  GraphExec* e = (GraphExec*)exec;
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (!c->execs.count(e)) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphLaunch: %p is not a graph exec", exec);
  }
  std::vector<std::pair<Stream*, unsigned long long>> deps;
  if (CUresult r = implicit_deps(c, s, &deps)) return r;
  push_deps(s, deps);
  for (const Op& op : e->ops) enqueue(s, op);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphUpload(void* exec, void* stream) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  (void)s;
  std::lock_guard<std::mutex> l(g_mu);
  if (!c->execs.count((GraphExec*)exec)) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphUpload: not a graph exec");
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphExecDestroy(void* exec) {
  NEED_INIT();
  std::lock_guard<std::mutex> l(g_mu);
  GraphExec* e = (GraphExec*)exec;
  if (!g_ctx.execs.erase(e)) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphExecDestroy: not a graph exec");
  delete e;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(void* graph) {
  NEED_INIT();
  std::lock_guard<std::mutex> l(g_mu);
  Graph* g = (Graph*)graph;
  if (!g_ctx.graphs.erase(g)) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphDestroy: not a graph");
  delete g;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphGetNodes(void* graph, void** nodes, size_t* n) {
  NEED_INIT();
  std::lock_guard<std::mutex> l(g_mu);
  Graph* g = (Graph*)graph;
  if (!g_ctx.graphs.count(g)) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphGetNodes: not a graph");
  if (!nodes && n) *n = g->ops.size();
  return CUDA_SUCCESS;
}

// ---- modules and launches -----------------------------------------------------------------------

EXPORT CUresult cuModuleLoadData(void** out, const void* image) {
  NEED_CTX(c);
  if (!out || !image) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData(NULL)");
  const char* text = (const char*)image;
  if (std::strncmp(text, "\x7f" "ELF", 4) == 0 || *(const unsigned*)image == 0xBA55ED50u)
    return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: cubin/fatbin images are not emulated (load PTX text)");
  std::string ptx;
  for (const char* q = text; *q;) {  // the PTX without // comments
    if (q[0] == '/' && q[1] == '/') {
      while (*q && *q != '\n') ++q;
    } else {
      ptx += *q++;
    }
  }
  // .version: the H200 machine's driver (CUDA 13.0) JITs PTX ISA up to 9.0.
  size_t v = ptx.find(".version");
  if (v == std::string::npos) return fail(CUDA_ERROR_INVALID_PTX, "cuModuleLoadData: not PTX (no .version)");
  int maj = 0, min = 0;
  sscanf(ptx.c_str() + v, ".version %d.%d", &maj, &min);
  if (maj * 10 + min > 90)
    return fail(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "cuModuleLoadData: PTX ISA %d.%d is newer than the driver's 9.0",
                maj, min);
  size_t t = ptx.find(".target");
  if (t != std::string::npos) {
    int sm = 0;
    if (sscanf(ptx.c_str() + t, ".target sm_%d", &sm) == 1 && sm > 90)
      return fail(CUDA_ERROR_NO_BINARY_FOR_GPU, "cuModuleLoadData: PTX for sm_%d cannot run on sm_90", sm);
  }
  std::unique_ptr<Module> m(new Module());
  m->ctx = c;
  size_t pos = 0;
  while ((pos = ptx.find(".entry", pos)) != std::string::npos) {
    pos += 6;
    while (pos < ptx.size() && (ptx[pos] == ' ' || ptx[pos] == '\t')) ++pos;
    size_t e = pos;
    while (e < ptx.size() && (isalnum((unsigned char)ptx[e]) || ptx[e] == '_' || ptx[e] == '$')) ++e;
    std::string name = ptx.substr(pos, e - pos);
    if (name.empty()) continue;
    const emu::KernelDef* def = nullptr;
    for (const emu::ModuleDef* md : registry())
      for (unsigned k = 0; k < md->n_kernels && !def; ++k)
        if (name == md->kernels[k].name) def = &md->kernels[k];
    if (!def)
      return fail(CUDA_ERROR_INVALID_IMAGE,
                  "cuModuleLoadData: kernel %s has no C++ build in the emulator (kernels/*.cu changed since "
                  "tools/cuda-driver-emu was built?)",
                  name.c_str());
    m->funcs[name] = def;
  }
  if (m->funcs.empty()) return fail(CUDA_ERROR_INVALID_PTX, "cuModuleLoadData: the PTX declares no .entry");
  std::lock_guard<std::mutex> l(g_mu);
  Module* mp = m.release();
  c->modules.insert(mp);
  *out = mp;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoadDataEx(void** out, const void* image, unsigned, void*, void*) {
  return cuModuleLoadData(out, image);
}

EXPORT CUresult cuModuleUnload(void* h) {
  NEED_INIT();
  std::lock_guard<std::mutex> l(g_mu);
  Module* m = (Module*)h;
  if (!g_ctx.modules.erase(m)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload(%p): not a module", h);
  for (auto it = g_ctx.functions.begin(); it != g_ctx.functions.end();) {
    if ((*it)->mod == m) {
      delete *it;
      it = g_ctx.functions.erase(it);
    } else {
      ++it;
    }
  }
  delete m;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(void** out, void* h, const char* name) {
  NEED_CTX(c);
  if (!out || !name) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction(NULL)");
  std::lock_guard<std::mutex> l(g_mu);
  Module* m = (Module*)h;
  if (!c->modules.count(m)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction: %p is not a module", h);
  auto it = m->funcs.find(name);
  if (it == m->funcs.end()) return fail(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction: no kernel %s in the module", name);
  Function* f = new Function();
  f->mod = m;
  f->def = it->second;
  c->functions.insert(f);
  *out = f;
  return CUDA_SUCCESS;
}

namespace {
Function* live_function(void* h) {
  std::lock_guard<std::mutex> l(g_mu);
  return g_ctx.functions.count((Function*)h) ? (Function*)h : nullptr;
}
}  // namespace

EXPORT CUresult cuFuncGetAttribute(int* v, int attr, void* h) {
  NEED_INIT();
  Function* f = live_function(h);
  if (!f || !v) return fail(CUDA_ERROR_INVALID_HANDLE, "cuFuncGetAttribute: %p is not a function", h);
  switch (attr) {
    case 0: *v = f->def->max_threads ? f->def->max_threads : 1024; break;
    case 1: *v = 0; break;  // static shared memory: not tracked (thread_local arrays)
    case 2: *v = 0; break;
    case 3: *v = 0; break;
    case 4: *v = 32; break;
    case 5: case 6: *v = 90; break;
    case 8: *v = f->max_dyn_smem; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(void* h, int attr, int v) {
  NEED_INIT();
  Function* f = live_function(h);
  if (!f) return fail(CUDA_ERROR_INVALID_HANDLE, "cuFuncSetAttribute: %p is not a function", h);
  if (attr == 8) {
    if (v < 0 || v > kSmemOptin)
      return fail(CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d) > %d", v, kSmemOptin);
    f->max_dyn_smem = v;
    return CUDA_SUCCESS;
  }
  if (attr == 9) return CUDA_SUCCESS;
  return fail(CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute: attribute %d cannot be set", attr);
}

EXPORT CUresult cuFuncSetCacheConfig(void* h, int) {
  NEED_INIT();
  if (!live_function(h)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuFuncSetCacheConfig: not a function");
  return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(void* h, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned smem, void* stream, void** params, void** extra) {
  NEED_CTX(c);
  NEED_STREAM(s, stream);
  Function* f = live_function(h);
  if (!f) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: %p is not a function", h);
  const emu::KernelDef* d = f->def;
  if (extra) return fail(CUDA_ERROR_NOT_SUPPORTED, "cuLaunchKernel(%s): `extra` is not emulated", d->name);
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel(%s): grid (%u,%u,%u) block (%u,%u,%u) has a zero", d->name,
                gx, gy, gz, bx, by, bz);
  if (gx > 2147483647u || gy > 65535 || gz > 65535)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel(%s): grid (%u,%u,%u) exceeds (2^31-1, 65535, 65535)",
                d->name, gx, gy, gz);
  if (bx > 1024 || by > 1024 || bz > 64 || (unsigned long long)bx * by * bz > 1024)
    return fail(CUDA_ERROR_INVALID_VALUE,
                "cuLaunchKernel(%s): block (%u,%u,%u) exceeds 1024 threads or (1024, 1024, 64)", d->name, bx, by, bz);
  if (d->max_threads && (int)(bx * by * bz) > d->max_threads)
    return fail(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                "cuLaunchKernel(%s): block of %u threads, __launch_bounds__(%d)", d->name, bx * by * bz, d->max_threads);
  if ((int)smem > f->max_dyn_smem)
    return fail(CUDA_ERROR_INVALID_VALUE,
                "cuLaunchKernel(%s): %u bytes of dynamic shared memory, the function allows %d (set "
                "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first; at most %d)",
                d->name, smem, f->max_dyn_smem, kSmemOptin);
  if (d->nparams && !params)
    return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel(%s): kernelParams is NULL, the kernel takes %u", d->name,
                d->nparams);
  // Copy the arguments now (kernelParams point to the caller's temporaries).
  auto args = std::make_shared<std::vector<unsigned long long>>(d->nparams ? d->nparams : 1, 0ull);
  for (unsigned i = 0; i < d->nparams; ++i) {
    if (d->sizes[i] > 8)
      return fail(CUDA_ERROR_NOT_SUPPORTED, "cuLaunchKernel(%s): parameter %u of %u bytes", d->name, i, d->sizes[i]);
    std::memcpy(&(*args)[i], params[i], d->sizes[i]);
  }
  std::vector<std::pair<Stream*, unsigned long long>> deps;
  if (CUresult r = implicit_deps(c, s, &deps)) return r;
  push_deps(s, deps);
  dim3 grid(gx, gy, gz), block(bx, by, bz);
  enqueue(s, Op{d->name, [d, args, grid, block](std::string* msg) {
                  // Pointer arguments must be device addresses (or NULL).
                  for (unsigned i = 0; i < d->nparams; ++i) {
                    if (!d->is_ptr[i] || !(*args)[i]) continue;
                    uintptr_t p = (uintptr_t)(*args)[i];
                    if (!g_arena || p < g_arena || p >= g_arena + kArena) {
                      char b[300];
                      snprintf(b, sizeof b, "kernel %s: argument %u (0x%llx) is not a device address", d->name, i,
                               (unsigned long long)p);
                      *msg = b;
                      return (int)CUDA_ERROR_ILLEGAL_ADDRESS;
                    }
                  }
                  void* ptrs[64];
                  for (unsigned i = 0; i < d->nparams && i < 64; ++i) ptrs[i] = &(*args)[i];
                  emu::RunDesc rd;
                  rd.name = d->name;
                  rd.grid = grid;
                  rd.block = block;
                  rd.invoke = d->invoke;
                  rd.params = ptrs;
                  return emu::run_grid(rd, msg);
                }});
  return CUDA_SUCCESS;
}

// ---- occupancy (answers for the launch shapes, not a model of the hardware) ----------------------

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, void* h, int block, size_t smem) {
  NEED_INIT();
  if (!live_function(h) || !n || block <= 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuOccupancy: bad arguments");
  int by_threads = 2048 / block;
  int by_smem = smem ? (int)((228 * 1024) / smem) : 32;
  *n = std::max(0, std::min(std::min(by_threads, by_smem), 32));
  return CUDA_SUCCESS;
}
