// Host side of the device emulation runtime (tools/cuda-emu/runtime.cpp): what the
// emulated driver (tools/cuda-driver-emu) calls to run a grid.
#pragma once
#include <cstdint>
#include <string>

#include "cuda_emu.h"

namespace emu {
struct RunDesc {
  const char* name = "";
  dim3 grid, block;
  void (*invoke)(void* const* params) = nullptr;
  void* const* params = nullptr;
};
// Runs every block of the grid on the calling thread. Returns 0, or a fault code
// (a CUresult: 700 illegal address, 716 misaligned, 715 bad collective, 719 deadlock,
// 714 stack overflow) with *msg saying which kernel, block, thread and address.
int run_grid(const RunDesc& d, std::string* msg);
// Describes a faulting address (which device buffer it is near); called from the
// fault handler.
using AddressDescriber = std::string (*)(uintptr_t addr);
void set_address_describer(AddressDescriber d);
void install_fault_handlers();
}  // namespace emu
