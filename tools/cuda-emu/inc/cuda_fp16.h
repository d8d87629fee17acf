// kernels/*.cu include <cuda_fp16.h>; on the CPU it is the emulation header.
#pragma once
#include "cuda_emu.h"
