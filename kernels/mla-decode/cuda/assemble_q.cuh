// The absorbed query of one decode step in one launch, in place of ~10 small torch ops (docs/mla-decode-notes.md):
// q_full[b][h] = (q_nope W_UK)[h][b] (512) | RoPE(q_rope[b][h]) (64). RoPE with the reference's bf16 roundings, as
// the torch ops it replaced computed it: out = bf16(bf16(x * cos) + bf16(rot * sin))
// with rot = (-x[32..63], x[0..31]) and cos/sin of position pos = kv_len - 1 repeated over both halves. kv_len comes
// from device memory so that a captured graph replays for every cache length.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

#include "late_address.h"

namespace mla {

constexpr int kAssembleThreads = 256;  // one thread per 8 output elements: 72 per (b, h) row

__device__ __forceinline__ float bf16r(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// qn [H][bs][512] (the per-head bmm's output), q [bs][H][192] (q_nope 128 | q_rope 64, un-rotated),
// cos_tab / sin_tab [max_seq][32], kv_len [1]; writes q_full [bs][H][576]. qn null: only the rope columns (the
// bmm wrote the latent ones straight into q_full), one thread per 8 of them.
__global__ void __launch_bounds__(kAssembleThreads) assemble_q_kernel(const __nv_bfloat16* __restrict__ qn,
                                                                      const __nv_bfloat16* __restrict__ q,
                                                                      const __nv_bfloat16* __restrict__ cos_tab,
                                                                      const __nv_bfloat16* __restrict__ sin_tab,
                                                                      __nv_bfloat16* __restrict__ q_full, int bs,
                                                                      int heads, const int* __restrict__ kv_len,
                                                                      int max_seq) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  const long long rows = static_cast<long long>(bs) * heads;
  const int per_row = qn ? 72 : 8;
  if (i >= rows * per_row) return;
  const int chunk = static_cast<int>(i % per_row) + (qn ? 0 : 64);
  const long long row = i / per_row;  // b * heads + h
  const int b = static_cast<int>(row / heads), h = static_cast<int>(row % heads);
  uint4* dst = reinterpret_cast<uint4*>(q_full + row * 576) + chunk;
  if (chunk < 64) {  // latent part: a transpose of the bmm's [H][bs] order
    *dst = *(reinterpret_cast<const uint4*>(qn + (static_cast<long long>(h) * bs + b) * 512) + chunk);
    return;
  }
  const int c = chunk - 64;  // rope elements 8c .. 8c+7; their partners 32 apart are chunk (c + 4) % 8
  const int pos = *kv_len - 1;
  if (pos < 0 || pos >= max_seq) {
    *dst = make_uint4(0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u);  // bf16 NaN x 8
    return;
  }
  const __nv_bfloat16* rope = q + row * 192 + 128;
  const uint4 xv = *reinterpret_cast<const uint4*>(rope + 8 * c);
  const uint4 pv = *reinterpret_cast<const uint4*>(rope + 8 * ((c + 4) % 8));
  const uint4 cv = *reinterpret_cast<const uint4*>(cos_tab + static_cast<long long>(pos) * 32 + 8 * (c % 4));
  const uint4 sv = *reinterpret_cast<const uint4*>(sin_tab + static_cast<long long>(pos) * 32 + 8 * (c % 4));
  const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(&xv);
  const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(&pv);
  const __nv_bfloat16* cs = reinterpret_cast<const __nv_bfloat16*>(&cv);
  const __nv_bfloat16* sn = reinterpret_cast<const __nv_bfloat16*>(&sv);
  uint4 ov;
  __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&ov);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float xe = __bfloat162float(x[e]), pe = __bfloat162float(p[e]);
    const float ce = __bfloat162float(cs[e]), se = __bfloat162float(sn[e]);
    // first half: rot = -x[i + 32]; second half: rot = x[i - 32]
    const float rs = c < 4 ? -bf16r(pe * se) : bf16r(pe * se);
    o[e] = __float2bfloat16_rn(bf16r(xe * ce) + rs);
  }
  *dst = ov;
}

// KVCache.forward's append: cache[b][kv_len - 1][:] = row[b][:] (576 bf16 each), kv_len read from device memory so
// that a captured graph appends at each call's row. 16 bytes a thread a step: 72 a batch row. With late.ring (a
// graph the binding launches, one block): thread 0 first takes the call's output address and cache length from the
// late ring (late_address.h), and writes the length to kv_len for the kernels after this one. cache_slot (a moving
// graph, moving_inputs.h): the cache is where that device word points.
__global__ void __launch_bounds__(kAssembleThreads) append_row_kernel(const uint4* __restrict__ row,
                                                                      uint4* __restrict__ cache, int bs, int max_seq,
                                                                      const int* kv_len, kb::LateAddress late,
                                                                      void* const* cache_slot) {
  __shared__ int len;
  if (cache_slot) cache = static_cast<uint4*>(*cache_slot);  // a moving graph: this call's cache
  if (threadIdx.x == 0) {
    if (late.ring) take_late_address(late);  // (late.value_slot is kv_len)
    len = *reinterpret_cast<const volatile int*>(kv_len);
  }
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < bs * 72; i += gridDim.x * blockDim.x) {
    const int b = i / 72, chunk = i % 72;
    cache[(static_cast<long long>(b) * max_seq + (len - 1)) * 72 + chunk] = row[i];
  }
}

}  // namespace mla
