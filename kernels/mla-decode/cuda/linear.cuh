// The decode step's projections on Hopper: Y [m][n] = X [m][k] W [n][k]^T in bf16 with fp32 accumulation, m <= 128
// (the batch rows), W streamed from DRAM once. Configuration and its choice: linear_config.h.
//
// CTA = (n-tile of kBN W rows, k-split), one wave. Warpgroup 0 produces (one thread issues TMA: X's 128 x 64 tile and
// W's kBN x 64 tile per stage, both K-major with the 128-byte swizzle), warpgroups 1 and 2 consume (wgmma
// m64 n kBN k16, rows 0-63 and 64-127 of X; rows past m are TMA's zero fill). The splits of one n-tile are one
// cluster: each CTA parks its fp32 accumulator in its own shared memory, and after a cluster barrier CTA r sums rows
// [r 128 / splits, (r + 1) 128 / splits) over the cluster (ld.shared::cluster) and stores them as bf16, whole rows
// of the tile at a time (coalesced). Deterministic: the sum's order is fixed.
//
// Launched with programmatic stream serialization: W does not depend on the kernel before this one, so the producer
// issues the first stages' W loads before griddepcontrol.wait, and only X (the previous kernel's output) waits.
//
// Two projections of one X in one launch (LinearParams::y2): the n-tiles past tiles1 take W2 (tm_w2) and store to Y2
// [m][n2]. The step's kv_down and q_down (both of x) run so, in one wave: launched apart, the first to start took
// every SM and the other, on the q path to the attention, waited for it (docs/mla-decode-notes.md, finding 54).
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_bf16.h>

#include "linear_config.h"
#include "moving_inputs.h"
#include "sm90.cuh"
#include "wgmma.cuh"

namespace mla {

using namespace kb::sm90;

constexpr int kLinearThreads = 384;          // warpgroup 0 produces, 1 and 2 consume
constexpr int kLinearBox = 128 * kLinearBK * 2;  // one X box: 128 rows x 64 k, 16 KB
constexpr int kLinearSmemLimit = 232448;     // the opt-in maximum of dynamic shared memory per block (sm_90)

template <int kBN>
struct LinearShape {
  static constexpr int kABytes = kLinearBox;
  static constexpr int kBBytes = kBN * kLinearBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kFit = (kLinearSmemLimit - 2048) / kStageBytes;
  static constexpr int kStages = kFit > 8 ? 8 : kFit;
  // fp32 staging row pitch = 8 (mod 16) floats: a half-warp's float2 stores (rows r..r+3, 8 floats each) then fall in
  // four different 8-bank groups. (kBN + 8 for every width left kBN = 56, wo's tile, 4-way conflicted.)
  static constexpr int kPitch = kBN % 16 == 0 ? kBN + 8 : kBN + 16;
  static_assert(kPitch % 16 == 8, "the staging stores' bank groups");
  static constexpr int kStagingBytes = 128 * kPitch * 4;
  static_assert(kStagingBytes <= kStages * kStageBytes, "the accumulator is parked in the ring's space");
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
};

struct LinearParams {
  __nv_bfloat16* y;  // [m][n], row pitch n
  void* const* y_slot;  // null, or the device word holding y's address instead (read at the store: a late output)
  int m, n;
  int kblocks;       // k-blocks per split (k / 64 / splits)
  int splits;        // = the cluster size
  // a moving graph's maps of X and W in device memory (moving_inputs.h), read instead of tm_x / tm_w; null: those
  const CUtensorMap* bound_x;
  const CUtensorMap* bound_w;
  // a second projection of X: n-tiles from tiles1 on multiply W2 (tm_w2, or bound_w2) into y2 [m][n2]; null y2: none
  __nv_bfloat16* y2;
  int n2, tiles1;
  const CUtensorMap* bound_w2;
};

// Four floats of CTA `rank`'s shared memory at the address `local` has in this CTA.
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t local, uint32_t rank) {
  const uint32_t remote = mapa_shared(local, rank);
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

template <int kBN>
__device__ __forceinline__ void linear_mma(float* acc, uint64_t da, uint64_t db, int accumulate) {
  if constexpr (kBN == 256) wgmma_m64n256k16_bf16<0>(acc, da, db, accumulate);
  else if constexpr (kBN == 224) wgmma_m64n224k16_bf16<0>(acc, da, db, accumulate);
  else if constexpr (kBN == 192) wgmma_m64n192k16_bf16<0>(acc, da, db, accumulate);
  else if constexpr (kBN == 128) wgmma_m64n128k16_bf16<0>(acc, da, db, accumulate);
  else if constexpr (kBN == 112) wgmma_m64n112k16_bf16<0>(acc, da, db, accumulate);
  else if constexpr (kBN == 96) wgmma_m64n96k16_bf16<0>(acc, da, db, accumulate);
  else if constexpr (kBN == 64) wgmma_m64n64k16_bf16<0>(acc, da, db, accumulate);
  else wgmma_m64n56k16_bf16<0>(acc, da, db, accumulate);
}

template <int kBN>
__global__ void __launch_bounds__(kLinearThreads, 1)
    linear_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                  const __grid_constant__ CUtensorMap tm_w2, const LinearParams p) {
  using S = LinearShape<kBN>;
  constexpr int kStages = S::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // 128B-swizzled tiles: 1024-aligned
  uint8_t* s_a = base;
  uint8_t* s_b = s_a + kStages * S::kABytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(base + kStages * S::kStageBytes);
  uint64_t* empty = full + kStages;
  float* staging = reinterpret_cast<float*>(base);  // after the main loop: the fp32 accumulator, [128][kPitch]

  const int split = static_cast<int>(cluster_ctarank());  // 1-D clusters along x: the rank is blockIdx.x % splits
  const bool second = p.y2 != nullptr && static_cast<int>(blockIdx.x / p.splits) >= p.tiles1;  // (uniform in a cluster)
  const int nt = blockIdx.x / p.splits - (second ? p.tiles1 : 0);
  const int kb0 = split * p.kblocks;
  const int wg = threadIdx.x / 128;
  // (the bound maps are written by the graph's first kernel, which this one follows; no early trigger lets it start
  // sooner)
  const CUtensorMap* map_x = p.bound_x ? p.bound_x : &tm_x;
  const CUtensorMap* bound_w = second ? p.bound_w2 : p.bound_w;
  const CUtensorMap* map_w = bound_w ? bound_w : second ? &tm_w2 : &tm_w;
  if (threadIdx.x == 0) {
    if (p.bound_x) kb::tensormap_acquire(p.bound_x);
    if (bound_w) kb::tensormap_acquire(bound_w);
    tma_prefetch_desc(map_x);
    tma_prefetch_desc(map_w);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);   // the producer's arrive_expect_tx; the TMA bytes complete the phase
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      // W first: the stages' W boxes before the previous kernel has finished (X is its output)
      const int early = p.kblocks < kStages ? p.kblocks : kStages;
      for (int i = 0; i < early; ++i) {
        mbar_arrive_expect_tx(&full[i], S::kStageBytes);
        tma_load_2d(s_b + i * S::kBBytes, map_w, &full[i], (kb0 + i) * kLinearBK, nt * kBN);
      }
      griddep_wait();
      for (int i = 0; i < early; ++i) tma_load_2d(s_a + i * S::kABytes, map_x, &full[i], (kb0 + i) * kLinearBK, 0);
      int s = early % kStages;
      uint32_t phase = early == kStages ? 1 : 0;
      for (int i = early; i < p.kblocks; ++i) {
        mbar_wait(&empty[s], phase ^ 1);
        mbar_arrive_expect_tx(&full[s], S::kStageBytes);
        tma_load_2d(s_b + s * S::kBBytes, map_w, &full[s], (kb0 + i) * kLinearBK, nt * kBN);
        tma_load_2d(s_a + s * S::kABytes, map_x, &full[s], (kb0 + i) * kLinearBK, 0);
        ring_next(s, phase, kStages);
      }
    }
    // The producer warpgroup only keeps the cluster's barriers (its 40 registers run no epilogue).
    __syncwarp();
    cluster_sync();
    cluster_sync();
    return;
  }
  {  // the consumers
    setmaxnreg_inc<232>();
    const int cw = wg - 1;  // rows [64 cw, 64 cw + 64) of X and Y
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    float acc[kBN / 2];
    int s = 0, prev = -1;
    uint32_t phase = 0;
    for (int i = 0; i < p.kblocks; ++i) {
      mbar_wait(&full[s], phase);
      const uint64_t da = make_desc_sw128(s_a + s * S::kABytes + cw * 64 * 128);
      const uint64_t db = make_desc_sw128(s_b + s * S::kBBytes);
      wgmma_fence();
#pragma unroll
      for (int q = 0; q < 4; ++q)  // k16 steps: both K-major operands advance 32 bytes
        linear_mma<kBN>(acc, da + 2 * q, db + 2 * q, i > 0 || q > 0);
      wgmma_commit();
      if (prev >= 0) release_after_wgmma(&empty[prev], lane);
      prev = s;
      ring_next(s, phase, kStages);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) reg_fence(acc[i]);
    // Both consumers' MMAs must be done reading the ring before either overwrites it with its accumulator.
    named_bar_sync(1, 256);
    const int row = cw * 64 + warp * 16 + lane / 4, col = 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < kBN / 8; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(staging + (row + 8 * h) * S::kPitch + 8 * c + col) =
            make_float2(acc[4 * c + 2 * h], acc[4 * c + 2 * h + 1]);
    // Every CTA of the cluster has parked its partial: CTA `split` sums its share of rows over the cluster.
    cluster_sync();
    const int rows = 128 / p.splits, row0 = split * rows;
    const int n0 = nt * kBN;
    constexpr int kQuads = kBN / 4;
    __nv_bfloat16* const y = second ? p.y2 : p.y_slot ? static_cast<__nv_bfloat16*>(*p.y_slot) : p.y;
    const int n = second ? p.n2 : p.n;
    for (int e = threadIdx.x - 128; e < rows * kQuads; e += 256) {
      const int r = row0 + e / kQuads, c = 4 * (e % kQuads);
      if (r >= p.m || n0 + c >= n) continue;
      const uint32_t local = smem_u32(staging + r * S::kPitch + c);
      float4 v = ld_cluster_f4(local, 0);
      for (int q = 1; q < p.splits; ++q) {  // rank order: the same sum on every run
        const float4 w = ld_cluster_f4(local, q);
        v.x += w.x;
        v.y += w.y;
        v.z += w.z;
        v.w += w.w;
      }
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
      uint2 packed;
      packed.x = *reinterpret_cast<const uint32_t*>(&lo);
      packed.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(y + static_cast<long long>(r) * n + n0 + c) = packed;  // n % 4 == 0 (host check)
    }
    // No CTA may leave while another still reads its shared memory.
    cluster_sync();
  }
}

}  // namespace mla
