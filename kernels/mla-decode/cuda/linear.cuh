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
//
// kAbsorb (the step's q_up, bn 192 = one head's nope | rope columns, no split): after storing its q tile's rope
// columns, each CTA multiplies the head's q_nope (the accumulator rounded to bf16, kept in registers as wgmma A
// fragments) by the head's W_UK [128][512] (four more ring stages, two 64-column blocks a stage; asked of L2 at the
// CTA's start they took the main loop's DRAM stream: +4.7 us) and stores the 512 latent columns of the attention's
// query (LinearParams::q_lat): the per-head W_UK GEMM without a launch of its own (docs/mla-decode-notes.md,
// finding 59).
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
  // kAbsorb: the attention's query [m][128 heads][576], whose columns 0 .. 511 of head n-tile this CTA stores; a
  // moving graph's map of W_kv_up (tm_uk's input), or null
  __nv_bfloat16* q_lat;
  const CUtensorMap* bound_uk;
};

// kAbsorb's shapes: a head's q is 128 nope + 64 rope columns; W_UK of head h is rows [256 h, 256 h + 128) of W_kv_up
// [128 * 256][512], loaded as 8 blocks of 128 rows x 64 columns (16 KB, 128-byte swizzle), two a ring stage (the
// stage's X slot and its W slot, each at least 16 KB).
constexpr int kAbsorbNope = 128, kAbsorbRope = 64, kAbsorbLatent = 512, kAbsorbHeadRows = 256;
constexpr int kAbsorbQHead = kAbsorbLatent + kAbsorbRope, kAbsorbQRow = 128 * kAbsorbQHead;  // q_lat's pitches
constexpr int kAbsorbBlockBytes = kAbsorbNope * 128;
constexpr int kAbsorbStages = kAbsorbLatent / 64 / 2;

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

// One m64n64 accumulator block of a consumer warpgroup (rows row0 .. row0 + 63, the wgmma layout: u[4c + 2h + e] is
// row warp 16 + lane / 4 + 8h, column 8c + 2 (lane % 4) + e) as bf16 into dst's rows (< m; pitch in elements), 128
// contiguous bytes a row. Through `staging`, 64 rows of 144 bytes of shared memory only this warpgroup uses (barrier
// `bar`): each thread's pairs in (a row pitch of 36 words puts a warp's 32 pairs in 32 banks), then each warp stores
// four whole 128-byte row pieces an instruction. Scattered 4-byte stores of the pairs straight from registers took
// 16 us for a CTA's 128 KB (finding 59).
__device__ __forceinline__ void store_block_staged(const float* u, uint8_t* staging, __nv_bfloat16* dst, long long pitch,
                                                   int row0, int m, int t, int bar) {
  constexpr int kPitch = 144;
  const int r = t / 32 * 16 + t % 32 / 4, col = 2 * (t % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int c = 0; c < 8; ++c)
      *reinterpret_cast<__nv_bfloat162*>(staging + (r + 8 * h) * kPitch + (8 * c + col) * 2) =
          __floats2bfloat162_rn(u[4 * c + 2 * h], u[4 * c + 2 * h + 1]);
  named_bar_sync(bar, 128);
#pragma unroll
  for (int i = t; i < 64 * 8; i += 128) {
    const int rr = i / 8, chunk = i % 8;
    if (row0 + rr < m)
      *reinterpret_cast<uint4*>(dst + static_cast<long long>(row0 + rr) * pitch + 8 * chunk) =
          *reinterpret_cast<const uint4*>(staging + rr * kPitch + 16 * chunk);
  }
  named_bar_sync(bar, 128);  // read before the next block overwrites it
}

// kAbsorb's epilogue for one consumer warpgroup (rows 64 cw .. of X): acc is its m64n192 q tile (head nt). Stores
// the tile's rope columns to Y (mla_rope_q's input; the nope columns of Y are not written), then q_nope W_UK into
// the head's latent columns of p.q_lat, reading W_UK from the kAbsorbStages ring stages after the main loop's (s,
// phase: the next one). Both rounded as the separate GEMMs round them: q to bf16 first, the product's fp32 sum to
// bf16. The rows go out through the ring stage of the last k-block (loaded no more): warpgroup 0 stages in its X
// slot, warpgroup 1 in its W slot, once both have finished their main loop's MMAs.
template <int kStages>
__device__ __forceinline__ void absorb_epilogue(const LinearParams& p, const float* acc, uint8_t* s_a, uint8_t* s_b,
                                                int a_bytes, int b_bytes, uint64_t* full, int s, uint32_t phase,
                                                int cw, int t, int nt) {
  static_assert(kStages > kAbsorbStages, "the last k-block's stage is not among W_UK's");
  const int last = (s + kStages - 1) % kStages, bar = 2 + cw, row0 = 64 * cw;
  uint8_t* staging = cw == 0 ? s_a + last * a_bytes : s_b + last * b_bytes;
  named_bar_sync(1, 256);  // both warpgroups' MMAs are done with the last stage
  store_block_staged(acc + 4 * (kAbsorbNope / 8), staging, p.y + nt * (kAbsorbNope + kAbsorbRope) + kAbsorbNope, p.n,
                     row0, p.m, t, bar);
  uint32_t qa[kAbsorbNope / 4];  // q_nope's A fragments: qa[4j .. 4j + 3] = columns 16j .. 16j + 15
#pragma unroll
  for (int c = 0; c < kAbsorbNope / 8; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(acc[4 * c + 2 * h], acc[4 * c + 2 * h + 1]);
      qa[2 * c + h] = *reinterpret_cast<const uint32_t*>(&v);
    }
  __nv_bfloat16* q_lat = p.q_lat + nt * kAbsorbQHead;
  // Stage e + 1's two blocks are multiplied while stage e's products go out (two accumulator pairs in turn; a tie
  // with one stage at a time, finding 59)
  float u[2][2][32];
  auto issue = [&](float(&pair)[2][32]) {
    mbar_wait(&full[s], phase);
    // W_UK's blocks are N-major (rows of k = the nope dimension, 64 latent columns each): advancing k by 16 rows
    // moves 2048 bytes
    const uint64_t d0 = make_desc_sw128(s_a + s * a_bytes, kAbsorbBlockBytes, 1024);
    const uint64_t d1 = make_desc_sw128(s_b + s * b_bytes, kAbsorbBlockBytes, 1024);
    wgmma_fence();
#pragma unroll
    for (int q = 0; q < kAbsorbNope / 16; ++q) wgmma_m64n64k16_rs_bf16<1>(pair[0], qa + 4 * q, d0 + (2048 >> 4) * q, q);
#pragma unroll
    for (int q = 0; q < kAbsorbNope / 16; ++q) wgmma_m64n64k16_rs_bf16<1>(pair[1], qa + 4 * q, d1 + (2048 >> 4) * q, q);
    wgmma_commit();
    ring_next(s, phase, kStages);
  };
  issue(u[0]);
#pragma unroll
  for (int e = 0; e < kAbsorbStages; ++e) {
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      reg_fence(u[e & 1][0][i]);
      reg_fence(u[e & 1][1][i]);
    }
    if (e + 1 < kAbsorbStages) issue(u[(e + 1) & 1]);
    store_block_staged(u[e & 1][0], staging, q_lat + 64 * (2 * e), kAbsorbQRow, row0, p.m, t, bar);
    store_block_staged(u[e & 1][1], staging, q_lat + 64 * (2 * e + 1), kAbsorbQRow, row0, p.m, t, bar);
  }
}

template <int kBN, bool kAbsorb = false>
__global__ void __launch_bounds__(kLinearThreads, 1)
    linear_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                  const __grid_constant__ CUtensorMap tm_w2, const __grid_constant__ CUtensorMap tm_uk,
                  const LinearParams p) {
  static_assert(!kAbsorb || kBN == kAbsorbNope + kAbsorbRope, "kAbsorb: one head's q columns a CTA");
  using S = LinearShape<kBN>;
  static_assert(!kAbsorb || (S::kABytes >= kAbsorbBlockBytes && S::kBBytes >= kAbsorbBlockBytes),
                "kAbsorb: a W_UK block in each slot of a stage");
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
  const CUtensorMap* map_uk = p.bound_uk ? p.bound_uk : &tm_uk;
  if (threadIdx.x == 0) {
    if (p.bound_x) kb::tensormap_acquire(p.bound_x);
    if (bound_w) kb::tensormap_acquire(bound_w);
    if (kAbsorb && p.bound_uk) kb::tensormap_acquire(p.bound_uk);
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
      if constexpr (kAbsorb) {  // W_UK behind the last k-block, through the same ring
        for (int e = 0; e < kAbsorbStages; ++e) {
          mbar_wait(&empty[s], phase ^ 1);
          mbar_arrive_expect_tx(&full[s], 2 * kAbsorbBlockBytes);
          tma_load_2d(s_a + s * S::kABytes, map_uk, &full[s], 64 * (2 * e), nt * kAbsorbHeadRows);
          tma_load_2d(s_b + s * S::kBBytes, map_uk, &full[s], 64 * (2 * e + 1), nt * kAbsorbHeadRows);
          ring_next(s, phase, kStages);
        }
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
    if constexpr (kAbsorb) {
      absorb_epilogue<kStages>(p, acc, s_a, s_b, S::kABytes, S::kBBytes, full, s, phase, cw, t, nt);
      cluster_sync();  // (the producer's two: a cluster of one here)
      cluster_sync();
      return;
    }
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
