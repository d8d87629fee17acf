// kernels/*.cu include <cuda_bf16.h>; on the CPU it is the emulation header.
#pragma once
#include "cuda_emu.h"
