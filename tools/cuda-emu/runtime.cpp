// The device side of the CPU emulation (see inc/cuda_emu.h): runs a grid of a kernel
// block by block on the calling OS thread; the threads of a block are fibers with
// their own stacks that switch (a few instructions, tools/cuda-emu/runtime.cpp's
// emu_ctx_switch) only at __syncthreads and warp collectives. Kernel faults (a
// misaligned vector access, a bad warp collective, a deadlock, and SIGSEGV / SIGBUS /
// SIGFPE raised while a fiber runs: guard pages, freed device memory) end the launch
// with a code and a message instead of killing the process.
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include "cuda_emu.h"
#include "emu_runtime.h"


#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64 (System V ABI)"
#endif

// emu_ctx_switch(void** save_sp, void* new_sp): saves the callee-saved registers on
// the current stack, stores the stack pointer in *save_sp, and resumes the context
// whose stack pointer is new_sp. (MXCSR and the x87 control word are not switched:
// nothing in the kernels changes them.)
// emu_fiber_start: first "return address" of a fresh fiber: calls r12(r13).
asm(R"(
.text
.globl emu_ctx_switch
.hidden emu_ctx_switch
.type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_ctx_switch, .-emu_ctx_switch
.globl emu_fiber_start
.hidden emu_fiber_start
.type emu_fiber_start,@function
emu_fiber_start:
    movq %r13, %rdi
    andq $-16, %rsp
    call *%r12
    ud2
.size emu_fiber_start, .-emu_fiber_start
)");
extern "C" void emu_ctx_switch(void** save_sp, void* new_sp);
extern "C" void emu_fiber_start();

namespace emu {
namespace {

constexpr size_t kGuard = 4096;
constexpr size_t kSlot = kSlotBytes;  // per CUDA thread: guard page, stack, header
constexpr size_t kStack = kSlot - 2 * kGuard;
constexpr unsigned kMaxThreads = 1024;
struct Exec;

enum State : unsigned char { RUNNABLE, BLOCK_WAIT, WARP_WAIT, DONE };
const char* kWarpNames[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                            "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync"};
const char* kBlockNames[] = {"__syncthreads", "__syncthreads_or", "__syncthreads_and", "__syncthreads_count"};

struct alignas(64) Fiber {
  void* sp;
  Exec* exec;
  FiberHdr* hdr;
  State state;
  unsigned index, lane, warp;
  uint3 tid;
  uint64_t val, result;
  int arg, width;
};

struct Warp {
  unsigned exists = 0, exited = 0, arrived = 0, mask = 0;
  int kind = -1;
};

struct Exec {
  void* sched_sp = nullptr;
  char* stacks = nullptr;
  size_t stack_bytes = 0;
  Fiber fibers[kMaxThreads];
  Warp warps[kMaxThreads / 32];
  unsigned nthreads = 0, live = 0, arrived = 0;
  int bkind = -1, bacc = 0;
  Fiber* cur = nullptr;
  uint3 bid{0, 0, 0};
  bool in_fiber = false;
  const RunDesc* desc = nullptr;
  bool faulted = false;
  int fault_code = 0;
  std::string fault_msg;
  void* altstack = nullptr;
  char* map = nullptr;
  size_t map_bytes = 0;
  Exec() {
    stack_bytes = (size_t)kMaxThreads * kSlot;
    map_bytes = stack_bytes + kSlot;
    void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      perror("cuda-emu: mmap fiber stacks");
      std::abort();
    }
    map = (char*)p;
    stacks = (char*)(((uintptr_t)p + kSlot - 1) & ~(uintptr_t)(kSlot - 1));
    for (unsigned i = 0; i < kMaxThreads; ++i) {
      mprotect(stacks + i * kSlot, kGuard, PROT_NONE);  // under the stack
      Fiber& f = fibers[i];
      f.exec = this;
      f.hdr = hdr_of_slot((uintptr_t)(stacks + i * kSlot));
      f.hdr->fiber = &f;
      f.index = i;
      f.lane = i % 32;
      f.warp = i / 32;
    }
    altstack = std::malloc(64 * 1024);
    stack_t ss{};
    ss.ss_sp = altstack;
    ss.ss_size = 64 * 1024;
    sigaltstack(&ss, nullptr);
  }
  ~Exec() {
    stack_t ss{};
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, nullptr);
    munmap(map, map_bytes);
    std::free(altstack);
  }
};

thread_local std::unique_ptr<Exec> t_exec_owner;
// The executing thread's Exec (a plain pointer: the hot paths read it often).
__attribute__((visibility("hidden"))) thread_local Exec* t_exec_ptr = nullptr;

Exec& exec() {
  if (!t_exec_ptr) {
    t_exec_owner.reset(new Exec());
    t_exec_ptr = t_exec_owner.get();
  }
  return *t_exec_ptr;
}

// Switches from fiber `from` (blocked or done) straight to the next runnable fiber of
// the block, in thread order after it; back to the scheduler when none is runnable
// (every thread done, or a deadlock).
void switch_next(Exec& e, Fiber* from) {
  const unsigned nt = e.nthreads, i0 = (unsigned)(from - e.fibers);
  for (unsigned k = 1; k <= nt; ++k) {
    unsigned i = i0 + k;
    if (i >= nt) i -= nt;
    Fiber* to = &e.fibers[i];
    if (to->state != RUNNABLE) continue;
    if (to == from) return;
    e.cur = to;
    emu_ctx_switch(&from->sp, to->sp);
    return;
  }
  e.in_fiber = false;
  emu_ctx_switch(&from->sp, e.sched_sp);
}

void yield_to_sched(Exec& e) { switch_next(e, e.cur); }

std::string where(Exec& e) {
  char b[200];
  const Fiber* f = e.cur;
  snprintf(b, sizeof b, "kernel %s block (%u,%u,%u) thread (%u,%u,%u)", e.desc ? e.desc->name : "?", e.bid.x,
           e.bid.y, e.bid.z, f ? f->tid.x : 0, f ? f->tid.y : 0, f ? f->tid.z : 0);
  return b;
}

[[noreturn]] void fault_now(Exec& e, int code, const std::string& msg) {
  e.faulted = true;
  e.fault_code = code;
  e.fault_msg = msg;
  e.in_fiber = false;
  void* junk;
  emu_ctx_switch(&junk, e.sched_sp);
  __builtin_unreachable();
}

unsigned linear(const Fiber* f, const Exec& e) { return (unsigned)(f - e.fibers); }

void fiber_main(void*) {
  Exec& e = *t_exec_ptr;
  e.desc->invoke(e.desc->params);
  // The thread returned from the kernel.
  Fiber* f = e.cur;
  unsigned i = linear(f, e), w = i / 32, lane = i % 32;
  f->state = DONE;
  e.live--;
  Warp& wp = e.warps[w];
  wp.exited |= 1u << lane;
  if (wp.arrived && (wp.mask >> lane & 1)) {
    char b[160];
    snprintf(b, sizeof b, " exited while lanes 0x%08x of its warp wait for it in %s (mask 0x%08x)", wp.arrived,
             kWarpNames[wp.kind], wp.mask);
    fault_now(e, FAULT_ILLEGAL_INSTRUCTION, where(e) + b);
  }
  if (e.arrived > 0 && e.arrived == e.live) {
    // The rest of the block waits at a barrier: release it (exited threads do not count).
    for (unsigned t = 0; t < e.nthreads; ++t)
      if (e.fibers[t].state == BLOCK_WAIT) {
        e.fibers[t].state = RUNNABLE;
        e.fibers[t].result = (uint64_t)e.bacc;
      }
    e.arrived = 0;
  }
  switch_next(e, f);  // never comes back: the fiber is DONE
  __builtin_unreachable();
}

void init_fiber(Exec& e, unsigned i) {
  char* top = (char*)e.fibers[i].hdr;  // the stack grows down from just below the header
  uint64_t* sp = (uint64_t*)top;
  *--sp = 0;                            // alignment pad
  *--sp = (uint64_t)&emu_fiber_start;   // return address of emu_ctx_switch
  *--sp = 0;                            // rbp
  *--sp = 0;                            // rbx
  *--sp = (uint64_t)&fiber_main;        // r12
  *--sp = 0;                            // r13 (argument)
  *--sp = 0;                            // r14
  *--sp = 0;                            // r15
  e.fibers[i].sp = sp;
}

void release_block(Exec& e) {
  for (unsigned t = 0; t < e.nthreads; ++t) {
    Fiber& f = e.fibers[t];
    if (f.state == BLOCK_WAIT) {
      f.state = RUNNABLE;
      f.result = (uint64_t)e.bacc;
    }
  }
  e.arrived = 0;
}

// Runs one block; false when it faulted.
bool run_block(Exec& e) {
  const unsigned nt = e.nthreads;
  for (unsigned i = 0; i < nt; ++i) {
    Fiber& f = e.fibers[i];
    f.state = RUNNABLE;
    const dim3 bd = e.desc->block;
    f.tid = uint3{i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y)};
    FiberHdr* h = f.hdr;
    h->tid = f.tid;
    h->bid = e.bid;
    h->bdim = bd;
    h->gdim = e.desc->grid;
    init_fiber(e, i);
  }
  for (unsigned w = 0; w < (nt + 31) / 32; ++w) {
    unsigned n = std::min(32u, nt - 32 * w);
    e.warps[w] = Warp{};
    e.warps[w].exists = n == 32 ? 0xffffffffu : ((1u << n) - 1);
  }
  e.live = nt;
  e.arrived = 0;
  e.bkind = -1;
  {
    // Fibers switch among themselves; control comes back here when none is runnable.
    Fiber& f = e.fibers[0];
    e.cur = &f;
    e.in_fiber = true;
    emu_ctx_switch(&e.sched_sp, f.sp);
    e.in_fiber = false;
    if (e.faulted) return false;
    unsigned done = 0;
    for (unsigned i = 0; i < nt; ++i) done += e.fibers[i].state == DONE;
    if (done == nt) return true;
    {
      // Every live thread waits, and no barrier can complete.
      std::string m = "kernel " + std::string(e.desc->name) + " block (" + std::to_string(e.bid.x) + "," +
                      std::to_string(e.bid.y) + "," + std::to_string(e.bid.z) +
                      ") deadlocks: threads wait at barriers that cannot complete:";
      int shown = 0;
      for (unsigned i = 0; i < nt && shown < 8; ++i) {
        const Fiber& f = e.fibers[i];
        if (f.state == BLOCK_WAIT || f.state == WARP_WAIT) {
          m += " thread " + std::to_string(i) + " in " +
               (f.state == BLOCK_WAIT ? kBlockNames[std::max(0, e.bkind)] : kWarpNames[std::max(0, e.warps[i / 32].kind)]) +
               ";";
          ++shown;
        }
      }
      e.faulted = true;
      e.fault_code = FAULT_LAUNCH_FAILED;
      e.fault_msg = m;
      return false;
    }
  }
}

struct sigaction g_prev_segv, g_prev_bus, g_prev_fpe;
AddressDescriber g_describer = nullptr;

void on_signal(int sig, siginfo_t* si, void* uc) {
  Exec* e = t_exec_ptr;
  if (e && e->in_fiber) {
    char b[160];
    const char* what = sig == SIGFPE ? "arithmetic fault (integer division by zero?)" : "invalid memory access";
    snprintf(b, sizeof b, ": %s at address %p", what, si->si_addr);
    std::string m = where(*e) + b;
    int code = FAULT_ILLEGAL_ADDRESS;
    if (sig == SIGFPE) {
      code = FAULT_ILLEGAL_INSTRUCTION;
    } else {
      uintptr_t a = (uintptr_t)si->si_addr;
      uintptr_t stk = (uintptr_t)e->stacks;
      if (a >= stk && a < stk + e->stack_bytes) {
        m += " (the thread's stack overflowed: more than 248 KiB of locals)";
        code = FAULT_HARDWARE_STACK;
      } else if (g_describer) {
        m += ": " + g_describer(a);
      }
    }
    fault_now(*e, code, m);
  }
  // Not ours: hand the signal to whoever had it before (e.g. Rust's stack-overflow handler).
  struct sigaction* prev = sig == SIGSEGV ? &g_prev_segv : sig == SIGBUS ? &g_prev_bus : &g_prev_fpe;
  if (prev->sa_flags & SA_SIGINFO) {
    if (prev->sa_sigaction) {
      prev->sa_sigaction(sig, si, uc);
      return;
    }
  } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
    prev->sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);  // returning re-raises the fault with the default action
}

}  // namespace

void set_address_describer(AddressDescriber d) { g_describer = d; }

void install_fault_handlers() {
  static bool done = false;
  if (done) return;
  done = true;
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_prev_segv);
  sigaction(SIGBUS, &sa, &g_prev_bus);
  sigaction(SIGFPE, &sa, &g_prev_fpe);
}

namespace {

// Blocks [next, total) of one grid, taken one at a time by the calling executor thread
// and the pool's workers; the first fault stops everyone.
struct Job {
  const RunDesc* d = nullptr;
  unsigned total = 0;
  std::atomic<unsigned> next{0};
  std::atomic<bool> faulted{false};
  std::mutex mu;
  int code = 0;
  std::string msg;
};

void run_blocks(Job& j) {
  Exec& e = exec();
  const RunDesc& d = *j.d;
  e.desc = &d;
  e.faulted = false;
  e.nthreads = d.block.x * d.block.y * d.block.z;
  const unsigned gx = d.grid.x, gxy = d.grid.x * d.grid.y;
  for (;;) {
    if (j.faulted.load(std::memory_order_relaxed)) break;
    const unsigned b = j.next.fetch_add(1);
    if (b >= j.total) break;
    e.bid = uint3{b % gx, (b / gx) % d.grid.y, b / gxy};
    if (!run_block(e)) {
      std::lock_guard<std::mutex> l(j.mu);
      if (!j.faulted.exchange(true)) {
        j.code = e.fault_code;
        j.msg = e.fault_msg;
      }
      break;
    }
  }
  e.desc = nullptr;
}

// Host threads that run blocks of one grid at a time next to the launching thread
// (CUDA_EMU_THREADS in all, default: the host's cores, at most 8). A launch that finds
// the pool busy (another stream's grid) runs its blocks alone.
struct Pool {
  std::mutex mu;
  std::condition_variable cv, done_cv;
  Job* job = nullptr;
  unsigned long long gen = 0;
  unsigned busy = 0;
  unsigned workers = 0;
  std::atomic<bool> in_use{false};

  Pool() {
    unsigned n = std::thread::hardware_concurrency();
    if (const char* v = getenv("CUDA_EMU_THREADS")) n = (unsigned)atoi(v);
    n = std::max(1u, std::min(n, 8u));
    workers = n - 1;
    for (unsigned i = 0; i < workers; ++i) std::thread([this] { loop(); }).detach();
  }
  void loop() {
    unsigned long long seen = 0;
    for (;;) {
      Job* j;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return gen != seen; });
        seen = gen;
        j = job;
        ++busy;
      }
      if (j) run_blocks(*j);
      {
        std::lock_guard<std::mutex> l(mu);
        --busy;
      }
      done_cv.notify_all();
    }
  }
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: workers may run at exit
  return *p;
}

}  // namespace

int run_grid(const RunDesc& d, std::string* msg) {
  install_fault_handlers();
  const unsigned nt = d.block.x * d.block.y * d.block.z;
  if (nt == 0 || nt > kMaxThreads) {
    if (msg) *msg = "block of " + std::to_string(nt) + " threads";
    return FAULT_LAUNCH_FAILED;
  }
  Job j;
  j.d = &d;
  j.total = d.grid.x * d.grid.y * d.grid.z;
  Pool& p = pool();
  // Worth waking the pool only for grids with some work (a decode step's small grids
  // would pay more in thread hand-offs than they gain).
  const bool big = j.total >= 4 && (unsigned long long)j.total * nt >= 8192;
  bool shared = big && p.workers > 0 && !p.in_use.exchange(true);
  if (shared) {
    {
      std::lock_guard<std::mutex> l(p.mu);
      p.job = &j;
      ++p.gen;
    }
    p.cv.notify_all();
  }
  run_blocks(j);
  if (shared) {
    // Every block is taken; wait for the workers still running theirs.
    std::unique_lock<std::mutex> l(p.mu);
    p.job = nullptr;
    p.done_cv.wait(l, [&] { return p.busy == 0; });
    p.in_use = false;
  }
  if (j.faulted) {
    if (msg) *msg = j.msg;
    return j.code;
  }
  return 0;
}

int run_grid_fn(dim3 grid, dim3 block, const std::function<void()>& body) {
  struct Ctx {
    const std::function<void()>* f;
  } c{&body};
  void* params[1] = {&c};
  RunDesc d;
  d.name = "host-launched";
  d.grid = grid;
  d.block = block;
  d.params = params;
  d.invoke = [](void* const* p) { (*static_cast<Ctx*>(p[0])->f)(); };
  std::string msg;
  int r = run_grid(d, &msg);
  if (r) fprintf(stderr, "cuda-emu: fault %d: %s\n", r, msg.c_str());
  return r;
}

void fault(int code, const char* fmt, ...) {
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  Exec* e = t_exec_ptr;
  if (!e || !e->in_fiber) {
    fprintf(stderr, "cuda-emu: device fault outside a kernel: %s\n", b);
    std::abort();
  }
  fault_now(*e, code, where(*e) + ": " + b);
}

void misaligned(const void* p, unsigned align, const char* type) {
  Exec* e = t_exec_ptr;
  if (!e || !e->in_fiber) return;  // host code copying vector types: no rule
  char b[200];
  snprintf(b, sizeof b, ": misaligned %s access at %p (needs %u-byte alignment)", type, p, align);
  std::string m = where(*e) + b;
  if (g_describer) m += ": " + g_describer((uintptr_t)p);
  fault_now(*e, FAULT_MISALIGNED, m);
}

int block_sync(int kind, int v) {
  Fiber* f = (Fiber*)hdr()->fiber;
  Exec& e = *f->exec;
  if (e.arrived == 0) {
    e.bkind = kind;
    e.bacc = kind == 2 ? 1 : 0;
  } else if (e.bkind != kind) {
    fault_now(e, FAULT_ILLEGAL_INSTRUCTION,
              where(e) + " reached " + kBlockNames[kind] + " while other threads wait in " + kBlockNames[e.bkind]);
  }
  switch (kind) {
    case 1: e.bacc |= v; break;
    case 2: e.bacc &= v; break;
    case 3: e.bacc += v; break;
    default: break;
  }
  e.arrived++;
  f->state = BLOCK_WAIT;
  if (e.arrived == e.live) {
    release_block(e);
  } else {
    yield_to_sched(e);
  }
  return (int)f->result;
}

unsigned active_mask() {
  Fiber* f = (Fiber*)hdr()->fiber;
  Exec& e = *f->exec;
  unsigned w = f->warp;
  return e.warps[w].exists & ~e.warps[w].exited;
}

uint64_t warp_op(int kind, unsigned mask, uint64_t v, int arg, int width) {
  Fiber* f = (Fiber*)hdr()->fiber;
  Exec& e = *f->exec;
  const unsigned w = f->warp, lane = f->lane;
  Warp& wp = e.warps[w];
  char b[200];
  if (!(mask >> lane & 1)) {
    snprintf(b, sizeof b, " calls %s with mask 0x%08x that leaves out its own lane %u", kWarpNames[kind], mask, lane);
    fault_now(e, FAULT_ILLEGAL_INSTRUCTION, where(e) + b);
  }
  if (mask & ~wp.exists) {
    snprintf(b, sizeof b, " calls %s with mask 0x%08x naming lanes that do not exist (block of %u threads)",
             kWarpNames[kind], mask, e.nthreads);
    fault_now(e, FAULT_ILLEGAL_INSTRUCTION, where(e) + b);
  }
  if (mask & wp.exited) {
    snprintf(b, sizeof b, " calls %s with mask 0x%08x naming exited lanes 0x%08x", kWarpNames[kind], mask,
             mask & wp.exited);
    fault_now(e, FAULT_ILLEGAL_INSTRUCTION, where(e) + b);
  }
  if (width <= 0 || width > 32 || (width & (width - 1))) {
    snprintf(b, sizeof b, " calls %s with width %d (a power of two <= 32)", kWarpNames[kind], width);
    fault_now(e, FAULT_ILLEGAL_INSTRUCTION, where(e) + b);
  }
  if (wp.arrived == 0) {
    wp.mask = mask;
    wp.kind = kind;
  } else if (wp.mask != mask || wp.kind != kind) {
    snprintf(b, sizeof b, " calls %s (mask 0x%08x) while lanes 0x%08x of its warp wait in %s (mask 0x%08x)",
             kWarpNames[kind], mask, wp.arrived, kWarpNames[wp.kind], wp.mask);
    fault_now(e, FAULT_ILLEGAL_INSTRUCTION, where(e) + b);
  }
  f->val = v;
  f->arg = arg;
  f->width = width;
  wp.arrived |= 1u << lane;
  f->state = WARP_WAIT;
  if (wp.arrived == mask) {
    Fiber* base = &e.fibers[w * 32];
    unsigned ballot = 0;
    for (unsigned l = 0; l < 32; ++l)
      if ((mask >> l & 1) && base[l].val) ballot |= 1u << l;
    for (unsigned l = 0; l < 32; ++l) {
      if (!(mask >> l & 1)) continue;
      Fiber& g = base[l];
      const unsigned seg = l & ~(unsigned)(g.width - 1);
      int src = (int)l;
      switch (kind) {
        case W_SHFL_IDX: src = (int)(seg + ((unsigned)g.arg & (unsigned)(g.width - 1))); break;
        case W_SHFL_UP: src = (int)l - g.arg < (int)seg ? (int)l : (int)l - g.arg; break;
        case W_SHFL_DOWN: src = (int)l + g.arg >= (int)(seg + g.width) ? (int)l : (int)l + g.arg; break;
        case W_SHFL_XOR: {
          int s = (int)(l ^ (unsigned)g.arg);
          src = s >= (int)(seg + g.width) ? (int)l : s;
          break;
        }
        default: break;
      }
      if (kind >= W_SHFL_IDX && kind <= W_SHFL_XOR) {
        if (src < 0 || src > 31 || !(mask >> src & 1)) {
          e.cur = &g;
          snprintf(b, sizeof b, " reads lane %d in %s, outside the mask 0x%08x", src, kWarpNames[kind], mask);
          fault_now(e, FAULT_ILLEGAL_INSTRUCTION, where(e) + b);
        }
        g.result = base[src].val;
      } else if (kind == W_BALLOT) {
        g.result = ballot;
      } else if (kind == W_ANY) {
        g.result = ballot != 0;
      } else if (kind == W_ALL) {
        g.result = ballot == mask;
      }
      g.state = RUNNABLE;
    }
    wp.arrived = 0;
    wp.kind = -1;
  } else {
    yield_to_sched(e);
  }
  return f->result;
}

}  // namespace emu
