// The Hopper PTX wrappers fp8-mm uses: kbench's shared ones (kernels/_common/sm90.cuh), in this kernel's namespace.
#pragma once
#include "sm90.cuh"

namespace fp8mm {

using namespace kb::sm90;

// A K-major tile of 128-byte rows written by TMA with 128-byte swizzle (the leading byte offset is unused).
__device__ __forceinline__ uint64_t make_desc_k128_sw128(const void* smem_tile) { return make_desc_sw128(smem_tile); }

}  // namespace fp8mm
