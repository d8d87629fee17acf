// The kernels the emulated driver can run: every `extern "C" __global__` function of
// kernels/*.cu, compiled as C++ against tools/cuda-emu/inc/cuda_emu.h. The table is
// generated (gen_kernels.sh) from the kernels' real signatures: EMU_KERNEL takes the
// function's type apart with templates, so argument sizes and the unpacking of
// cuLaunchKernel's kernelParams always follow the source.
#pragma once
#include <cstddef>
#include <type_traits>
#include <utility>

namespace emu {

struct KernelDef {
  const char* name;
  void (*invoke)(void* const* params);
  unsigned nparams;
  const unsigned* sizes;         // sizeof each parameter
  const unsigned char* is_ptr;   // 1 where the parameter is a pointer (a device address)
  int max_threads;               // __launch_bounds__, or 0
};

struct ModuleDef {
  const char* stem;        // kernels/<stem>.cu
  const char* source;      // its text when the emulator was built
  size_t source_len;
  const KernelDef* kernels;
  unsigned n_kernels;
};

void register_module(const ModuleDef* m);

template <class Fn>
struct Sig;
template <class... A>
struct Sig<void (*)(A...)> {
  static constexpr unsigned n = sizeof...(A);
  static constexpr unsigned sizes[n + 1] = {(unsigned)sizeof(std::remove_cv_t<A>)..., 0u};
  static constexpr unsigned char ptrs[n + 1] = {(unsigned char)std::is_pointer<A>::value..., 0};
  template <void (*F)(A...), size_t... I>
  static void call(void* const* p, std::index_sequence<I...>) {
    F(*static_cast<std::remove_cv_t<A>*>(p[I])...);
  }
  template <void (*F)(A...)>
  static void invoke(void* const* p) {
    call<F>(p, std::index_sequence_for<A...>{});
  }
};

constexpr int lb_first() { return 0; }
template <class... R>
constexpr int lb_first(int a, R...) { return a; }

struct Registrar {
  explicit Registrar(const ModuleDef* m) { register_module(m); }
};

}  // namespace emu

#define EMU_KERNEL(NS, NAME, LB)                                                                   \
  emu::KernelDef {                                                                                 \
    #NAME, &emu::Sig<decltype(&NS::NAME)>::template invoke<&NS::NAME>,                             \
        emu::Sig<decltype(&NS::NAME)>::n, emu::Sig<decltype(&NS::NAME)>::sizes,                    \
        emu::Sig<decltype(&NS::NAME)>::ptrs, emu::lb_first LB                                      \
  }
