// Blockwise-scaled FP8 GEMM for Hopper: TMA -> multi-stage shared-memory ring -> FP8 wgmma, warp-specialized
// (1 producer warpgroup, 2 consumer warpgroups), persistent over (tile, k-split) work units.
//
// Two MMA kinds (template kF16):
//   kF16 = true  (default, exact): operands widened to fp16 by the transpose pass, FP16 wgmma. Its fp32
//                accumulation is exact enough for the official tolerance (rtol 2e-2, atol 1e-3).
//   kF16 = false (fast, inexact): e4m3 wgmma straight on the bytes. Hopper's FP8 MMA aligns products to the
//                largest exponent and keeps ~14 bits, so outputs that nearly cancel miss atol 1e-3 (cuBLAS's
//                blockwise FP8 GEMM misses it the same way); kept for measurements.
// Operands (device memory), K-contiguous: e4m3 bytes or fp16, both holding exactly 2x the fnuz value.
//   A  [m][k]
//   B  [n][k]
//   SA fp32, a_scale[i, kb] at sa[kb * ld + i] (M-major), read by TMA (tensor map dims {m, k/128})
//   SB fp32, b_scale[nb, kb] at sb[nb * s0 + kb * s1]
//   C  [m][n]  bf16 row-major (splits == 1), or (splits > 1) WS fp32: one [m][n] slice accumulated with atomics,
//              or [splits][m][n] slices written with plain stores (ws_split_stride != 0; the default plans)
// c[i,j] = sum_kb (sum_{k in kb} A[i,k] B[j,k]) * SA[i,kb] * SB[j/128,kb] * 0.25  (0.25 undoes the 2x per operand)
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_bf16.h>

#include "sm90_ptx.cuh"
#include "wgmma_ops.cuh"

namespace fp8mm {

constexpr int kBM = 128;             // rows per tile: 2 consumer warpgroups x 64
constexpr int kBK = 128;             // k per scale block
constexpr int kRowBytes = 128;       // bytes of k per smem tile row and stage (one 128-byte swizzle span)
constexpr int kThreads = 384;        // warpgroup 0 produces, 1 and 2 consume
constexpr int kGroupM = 8;           // rasterization: consecutive tiles sweep 8 m-tiles before moving along n
constexpr int kSmemLimit = 232448;   // sm_90 opt-in dynamic shared memory per block

// kHalfC: the bf16 output is staged in two column halves (half the staging buffer), which frees room for one more
// pipeline stage at BN = 128 (6 instead of 5).
template <int BN, bool kHalfC = false>
struct GemmShape {
  static constexpr int kABytes = kBM * kRowBytes;
  static constexpr int kBBytes = BN * kRowBytes;
  static constexpr int kSABytes = kBM * 4;
  static constexpr int kStageBytes = kABytes + kBBytes + kSABytes;
  // bf16 output staging (rows padded so fragment stores hit distinct banks); the direct-store fallback in
  // store_tile serves tiles too wide to stage.
  static constexpr bool kStageC = BN <= 128;
  static constexpr int kCPitch = (kHalfC ? BN : BN * 2) + 16;
  static constexpr int kCBytes = kStageC ? 2 * 64 * kCPitch : 0;
  static constexpr int kStages = (kSmemLimit - 1024 - kCBytes - 256) / kStageBytes;
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kCBytes + 2 * kStages * 8;
  static_assert(kStages >= 3, "pipeline too shallow");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory over budget");
};

struct GemmParams {
  int m, n, k;
  int num_m_tiles, num_n_tiles, num_tiles;
  int num_kb, kb_per_split, num_units;  // units = tiles x splits
  int splits;
  int sb_blocks;  // ceil(n / 128): b_scale column blocks
  const float* sb;
  long long sb_s0, sb_s1;
  __nv_bfloat16* c;  // used when splits == 1
  float* ws;         // used when splits > 1
  long long ws_split_stride;  // 0: partial sums red.add-ed into one zeroed [m][n] slice; else plain stores into
                              // slice `split` of [splits][m][n] (summed by f32_sum_to_bf16_kernel)
};

struct Unit {
  int mt, nt, kb0, kb1;
};

__device__ __forceinline__ Unit decode_unit(const GemmParams& p, int u) {
  // Tile-major within a split so one wave of CTAs works on neighbouring tiles (shared A rows / B columns in L2).
  const int tile = u % p.num_tiles;
  const int split = u / p.num_tiles;
  const int group = kGroupM * p.num_n_tiles;
  const int first_m = (tile / group) * kGroupM;
  const int gsize = min(p.num_m_tiles - first_m, kGroupM);
  const int in_group = tile % group;
  Unit r;
  r.mt = first_m + in_group % gsize;
  r.nt = in_group / gsize;
  r.kb0 = split * p.kb_per_split;
  r.kb1 = min(p.num_kb, r.kb0 + p.kb_per_split);
  return r;
}

// One 64 x BN x (32 bytes of k) MMA step: k32 for e4m3, k16 for fp16.
template <int BN, bool kF16>
__device__ __forceinline__ void wgmma_tile(float* d, uint64_t da, uint64_t db, int accumulate) {
  if constexpr (kF16 && BN == 128)
    wgmma_m64n128k16_f16(d, da, db, accumulate);
  else if constexpr (kF16)
    wgmma_m64n64k16_f16(d, da, db, accumulate);
  else if constexpr (BN == 128)
    wgmma_m64n128k32(d, da, db, accumulate);
  else
    wgmma_m64n64k32(d, da, db, accumulate);
}

// Calls store(i, x, y) for each pair of horizontally adjacent fp32 results this thread holds in the wgmma fragment
// layout of a 64 x BN tile at (row0, col0); i is the pair's flat index in the row-major m x n output. Pairs outside
// m x n are skipped.
template <int BN, class Store>
__device__ __forceinline__ void for_each_output_pair(const GemmParams& p, const float (&v)[BN / 2], int frag_row,
                                                     int frag_col, int row0, int col0, Store store) {
#pragma unroll
  for (int c = 0; c < BN / 8; ++c) {
    const int gc = col0 + 8 * c + frag_col;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int gr = row0 + frag_row + 8 * h;
      if (gr < p.m && gc < p.n) store((long long)gr * p.n + gc, v[4 * c + 2 * h], v[4 * c + 2 * h + 1]);
    }
  }
}

// Writes one warpgroup's 64 x BN fp32 results v (wgmma fragment layout) as bf16 to c, or adds them to the fp32
// split-K workspace. kStageC: go through shared memory so global stores are 16-byte row segments.
template <int BN, bool kStageC, bool kHalfC = false>
__device__ __forceinline__ void store_tile(const GemmParams& p, const float (&v)[BN / 2], uint8_t* my_c, int cw,
                                           int t, int frag_row, int frag_col, int row0, int col0, int split) {
  if (p.splits > 1 && p.ws_split_stride != 0) {
    // Partial sums of a k-range into this split's own fp32 slice: plain 8-byte stores, every element written once.
    float* slice = p.ws + (long long)split * p.ws_split_stride;
    for_each_output_pair<BN>(p, v, frag_row, frag_col, row0, col0, [&](long long i, float x, float y) {
      *reinterpret_cast<float2*>(slice + i) = make_float2(x, y);
    });
  } else if (p.splits > 1) {
    // Partial sums of a k-range: add into the fp32 workspace; a separate pass converts to bf16.
    for_each_output_pair<BN>(p, v, frag_row, frag_col, row0, col0, [&](long long i, float x, float y) {
      asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p.ws + i), "f"(x), "f"(y) : "memory");
    });
  } else if constexpr (kStageC && kHalfC) {
    // Two passes over column halves [h BN/2, (h+1) BN/2) through a 64 x (BN/2) bf16 buffer.
    constexpr int kPitch = GemmShape<BN, true>::kCPitch;
    constexpr int kHalfFrags = BN / 16;  // 8-column fragments per half
    constexpr int kChunks = BN / 16;     // 16-byte chunks per half row
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      named_bar_sync(1 + cw, 128);  // the previous pass's readers are done with my_c
#pragma unroll
      for (int c = 0; c < kHalfFrags; ++c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int cc = h2 * kHalfFrags + c;
          const __nv_bfloat162 x = __floats2bfloat162_rn(v[4 * cc + 2 * h], v[4 * cc + 2 * h + 1]);
          *reinterpret_cast<__nv_bfloat162*>(my_c + (frag_row + 8 * h) * kPitch + (8 * c + frag_col) * 2) = x;
        }
      }
      named_bar_sync(1 + cw, 128);
#pragma unroll 4
      for (int idx = t; idx < 64 * kChunks; idx += 128) {
        const int r = idx / kChunks, ch = idx % kChunks;
        const int gr = row0 + r, gc = col0 + h2 * (BN / 2) + ch * 8;
        if (gr < p.m && gc < p.n)
          *reinterpret_cast<uint4*>(p.c + (long long)gr * p.n + gc) =
              *reinterpret_cast<const uint4*>(my_c + r * kPitch + ch * 16);
      }
    }
  } else if constexpr (kStageC) {
    constexpr int kPitch = GemmShape<BN>::kCPitch;
    named_bar_sync(1 + cw, 128);  // the previous tile's readers are done with my_c
#pragma unroll
    for (int c = 0; c < BN / 8; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_bfloat162 x = __floats2bfloat162_rn(v[4 * c + 2 * h], v[4 * c + 2 * h + 1]);
        *reinterpret_cast<__nv_bfloat162*>(my_c + (frag_row + 8 * h) * kPitch + (8 * c + frag_col) * 2) = x;
      }
    }
    named_bar_sync(1 + cw, 128);
    constexpr int kChunks = BN / 8;  // 16-byte chunks per row
#pragma unroll 4
    for (int idx = t; idx < 64 * kChunks; idx += 128) {
      const int r = idx / kChunks, ch = idx % kChunks;
      const int gr = row0 + r, gc = col0 + ch * 8;
      if (gr < p.m && gc < p.n)
        *reinterpret_cast<uint4*>(p.c + (long long)gr * p.n + gc) =
            *reinterpret_cast<const uint4*>(my_c + r * kPitch + ch * 16);
    }
  } else {
    for_each_output_pair<BN>(p, v, frag_row, frag_col, row0, col0, [&](long long i, float x, float y) {
      *reinterpret_cast<__nv_bfloat162*>(p.c + i) = __floats2bfloat162_rn(x, y);
    });
  }
}

// Scales and stage slots of a k-block whose MMAs are in flight.
struct BlockInFlight {
  float sa0, sa1, sb;   // a_scale of the fragment's two rows, b_scale of the tile's column block
  int s_first, s_last;  // its pipeline stages (equal for the FP8 path)
};

// Consumer schedules of the fp16 (exact) path, per k-block (kSched template parameter):
//   0: both consumer warpgroups issue as soon as the stage is full (lock step: both promote at the same time,
//      leaving the tensor cores idle meanwhile).
//   1: ordered issue: consumer 1 issues block kb after consumer 0 has issued it, consumer 0 issues kb+1 after
//      consumer 1 has issued kb. If the tensor pipe runs each SMSP's wgmmas in issue order, consumer 0's MMAs
//      finish half a block earlier and its promotion overlaps consumer 1's MMAs (and vice versa).
//   2: strict alternation: a consumer issues block kb only after the other one's MMAs for the previous turn have
//      completed (ping-pong at k-block granularity; pays a short issue gap per turn).
//   3: split chains with early promotion: the block's two stages (64 k each) go to two register arrays committed
//      as two groups; the first is promoted and its stage freed while the second one's MMAs run.
//   4: split chains, one commit group (two independent accumulator chains, promoted together).
// Flag 8 (kDeep): stage C in column halves, one more pipeline stage (GemmShape<BN, true>).
// Named barriers 3 (consumer 0 may go) and 4 (consumer 1 may go), 256 threads each; 1 and 2 are the epilogue's.
constexpr int kBarTurn0 = 3, kBarTurn1 = 4;

template <int BN, bool kF16, int kSchedFlags = 0>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                    const __grid_constant__ CUtensorMap tm_sa, const GemmParams p) {
  constexpr int kSched = kSchedFlags & 7;             // consumer schedule (above)
  constexpr bool kDeep = (kSchedFlags & 8) != 0;      // half-size C staging, one more pipeline stage
  using S = GemmShape<BN, kDeep>;
  constexpr int kStages = S::kStages;
  constexpr int kAcc = BN / 2;  // fp32 accumulators per thread for a 64 x BN warpgroup tile
  constexpr int kSPB = kF16 ? 2 : 1;      // pipeline stages per 128-k scale block
  constexpr int kKPS = kBK / kSPB;        // k elements per stage (always 128 bytes per tile row)
  // Pairs of k-blocks in flight per consumer: +10% on the FP8 path; on the fp16 path a pair holds 4 of the 5
  // stages and starves the producer (measured 15% slower), so it promotes block by block.
  constexpr bool kPairs = kSPB == 1;
  static_assert(kSched == 0 || kF16, "consumer schedules other than 0 are for the fp16 (exact) path");

  extern __shared__ uint8_t smem_raw[];
  // 128B-swizzled TMA tiles and wgmma descriptors both assume 1024-byte aligned tiles.
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_a = base;
  uint8_t* s_b = s_a + kStages * S::kABytes;
  float* s_sa = reinterpret_cast<float*>(s_b + kStages * S::kBBytes);
  uint8_t* s_c = reinterpret_cast<uint8_t*>(s_sa + kStages * kBM);
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + S::kCBytes);
  uint64_t* empty = full + kStages;

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);   // the producer's arrive_expect_tx; TMA bytes complete the phase
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    fence_mbar_init();
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
    tma_prefetch_desc(&tm_sa);
  }
  __syncthreads();
  // Launched with PDL: everything above overlapped the previous kernel (the transpose pass); from here on we read
  // what it wrote (A, B) and write what earlier work may still read (C), so wait for it to finish.
  asm volatile("griddepcontrol.wait;" ::: "memory");

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      int s = 0;
      uint32_t phase = 0;
      for (int u = blockIdx.x; u < p.num_units; u += gridDim.x) {
        const Unit w = decode_unit(p, u);
        for (int st = w.kb0 * kSPB; st < w.kb1 * kSPB; ++st) {
          mbar_wait(&empty[s], phase ^ 1);
          mbar_arrive_expect_tx(&full[s], S::kStageBytes);
          tma_load_2d(s_a + s * S::kABytes, &tm_a, &full[s], st * kKPS, w.mt * kBM);
          tma_load_2d(s_b + s * S::kBBytes, &tm_b, &full[s], st * kKPS, w.nt * BN);
          tma_load_2d(s_sa + s * kBM, &tm_sa, &full[s], w.mt * kBM, st / kSPB);
          if (++s == kStages) {
            s = 0;
            phase ^= 1;
          }
        }
      }
    }
    return;
  }

  setmaxnreg_inc<232>();
  const int cw = wg - 1;  // consumer index: rows [64 cw, 64 cw + 64) of the tile
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4;  // accumulator rows frag_row and frag_row + 8 (within 64)
  const int frag_col = 2 * (lane % 4);        // accumulator columns 8c + frag_col + {0, 1}
  int s = 0;
  uint32_t phase = 0;
  constexpr bool kOrdered = (kSched == 1 || kSched == 2) && !(kSPB == 1);  // the FP8 path keeps its pairs
  bool issued_any = false;                               // consumer 0: the first turn needs no permission

  for (int u = blockIdx.x; u < p.num_units; u += gridDim.x) {
    const Unit w = decode_unit(p, u);
    const int row0 = w.mt * kBM + cw * 64;
    const int col0 = w.nt * BN;
    const float* sb_col = p.sb + (long long)(col0 / 128) * p.sb_s0;  // BN divides 128: one b_scale column
    float total[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = 0.f;

    // Waits for block kb's stages and issues its MMAs into acc (first one with D = 0) as one commit group.
    auto issue = [&](float (&acc)[kAcc], int kb, BlockInFlight& b) {
      b.sb = __ldg(sb_col + kb * p.sb_s1);  // consumed after the MMAs
      b.s_first = s;
#pragma unroll
      for (int h = 0; h < kSPB; ++h) {
        mbar_wait(&full[s], phase);
        if (h == 0) {
          b.sa0 = s_sa[s * kBM + cw * 64 + frag_row];
          b.sa1 = s_sa[s * kBM + cw * 64 + frag_row + 8];
        }
        const uint64_t da = make_desc_k128_sw128(s_a + s * S::kABytes + cw * 64 * kRowBytes);
        const uint64_t db = make_desc_k128_sw128(s_b + s * S::kBBytes);
        wgmma_fence();
#pragma unroll
        for (int q = 0; q < kRowBytes / 32; ++q)
          wgmma_tile<BN, kF16>(acc, da + 2 * q, db + 2 * q, h > 0 || q > 0);
        b.s_last = s;
        if (++s == kStages) {
          s = 0;
          phase ^= 1;
        }
      }
      wgmma_commit();
    };
    // The caller waited for block b's MMAs: free its stages and promote it into the fp32 total.
    auto retire = [&](float (&acc)[kAcc], const BlockInFlight& b) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) reg_fence(acc[i]);  // the accumulators are asm outputs: read after the wait
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(&empty[b.s_last]);
        if (kSPB == 2) mbar_arrive(&empty[b.s_first]);
      }
      const float f0 = b.sa0 * b.sb * 0.25f, f1 = b.sa1 * b.sb * 0.25f;  // 0.25: both operands read 2x
#pragma unroll
      for (int i = 0; i < kAcc; ++i) total[i] += acc[i] * ((i & 2) ? f1 : f0);
    };

    if constexpr (kPairs) {
      // Blocks go in pairs with the accumulators local to the pair (in-flight accumulators must not be carried
      // around the loop, or ptxas serializes every wgmma): block kb's promotion overlaps block kb+1's MMAs, so
      // the tensor cores are not left idle while both consumer warpgroups promote.
      for (int kb = w.kb0; kb < w.kb1; kb += 2) {
        float acc0[kAcc], acc1[kAcc];
        BlockInFlight b0, b1;
        issue(acc0, kb, b0);
        if (kb + 1 < w.kb1) {
          issue(acc1, kb + 1, b1);
          wgmma_wait<1>();
          retire(acc0, b0);
          wgmma_wait<0>();
          retire(acc1, b1);
        } else {
          wgmma_wait<0>();
          retire(acc0, b0);
        }
      }
    } else if constexpr (kSched >= 3) {
      // Split chains (fp16 path): each of the block's two stages accumulates into its own register array (same
      // scales, so total += (acc0 + acc1) f). Schedule 3 commits them as two groups and promotes/frees the first
      // stage while the second one's MMAs run; schedule 4 commits once (two independent chains, no early promote).
      for (int kb = w.kb0; kb < w.kb1; ++kb) {
        float acc0[kAcc], acc1[kAcc];
        const float sbv = __ldg(sb_col + kb * p.sb_s1);
        const int s0 = s;
        mbar_wait(&full[s], phase);
        const float sa0 = s_sa[s * kBM + cw * 64 + frag_row];
        const float sa1 = s_sa[s * kBM + cw * 64 + frag_row + 8];
        {
          const uint64_t da = make_desc_k128_sw128(s_a + s * S::kABytes + cw * 64 * kRowBytes);
          const uint64_t db = make_desc_k128_sw128(s_b + s * S::kBBytes);
          wgmma_fence();
#pragma unroll
          for (int q = 0; q < kRowBytes / 32; ++q) wgmma_tile<BN, kF16>(acc0, da + 2 * q, db + 2 * q, q > 0);
          if constexpr (kSched == 3) wgmma_commit();
        }
        if (++s == kStages) {
          s = 0;
          phase ^= 1;
        }
        const int s1 = s;
        mbar_wait(&full[s], phase);
        {
          const uint64_t da = make_desc_k128_sw128(s_a + s * S::kABytes + cw * 64 * kRowBytes);
          const uint64_t db = make_desc_k128_sw128(s_b + s * S::kBBytes);
          wgmma_fence();
#pragma unroll
          for (int q = 0; q < kRowBytes / 32; ++q) wgmma_tile<BN, kF16>(acc1, da + 2 * q, db + 2 * q, q > 0);
          wgmma_commit();
        }
        if (++s == kStages) {
          s = 0;
          phase ^= 1;
        }
        const float f0 = sa0 * sbv * 0.25f, f1 = sa1 * sbv * 0.25f;  // 0.25: both operands read 2x
        if constexpr (kSched == 3) {
          wgmma_wait<1>();
#pragma unroll
          for (int i = 0; i < kAcc; ++i) reg_fence(acc0[i]);
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[s0]);
#pragma unroll
          for (int i = 0; i < kAcc; ++i) total[i] += acc0[i] * ((i & 2) ? f1 : f0);
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < kAcc; ++i) reg_fence(acc1[i]);
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[s1]);
#pragma unroll
          for (int i = 0; i < kAcc; ++i) total[i] += acc1[i] * ((i & 2) ? f1 : f0);
        } else {
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < kAcc; ++i) {
            reg_fence(acc0[i]);
            reg_fence(acc1[i]);
          }
          __syncwarp();
          if (lane == 0) {
            mbar_arrive(&empty[s0]);
            mbar_arrive(&empty[s1]);
          }
#pragma unroll
          for (int i = 0; i < kAcc; ++i) total[i] += (acc0[i] + acc1[i]) * ((i & 2) ? f1 : f0);
        }
      }
    } else {
      for (int kb = w.kb0; kb < w.kb1; ++kb) {
        float acc[kAcc];
        BlockInFlight b;
        if constexpr (kOrdered) {
          if (cw == 0) {
            if (issued_any) named_bar_sync(kBarTurn0, 256);
          } else {
            named_bar_sync(kBarTurn1, 256);
          }
        }
        issue(acc, kb, b);
        if constexpr (kOrdered && kSched == 1) named_bar_arrive(cw == 0 ? kBarTurn1 : kBarTurn0, 256);
        wgmma_wait<0>();
        if constexpr (kOrdered && kSched == 2) named_bar_arrive(cw == 0 ? kBarTurn1 : kBarTurn0, 256);
        issued_any = true;
        retire(acc, b);
      }
    }
    store_tile<BN, S::kStageC, kDeep>(p, total, s_c + cw * 64 * S::kCPitch, cw, t, frag_row, frag_col, row0, col0,
                                      w.kb0 / p.kb_per_split);
  }
  // Consumer 1 arrived once per turn it took; consume its last arrival so the counts balance at exit.
  if constexpr (kOrdered) {
    if (cw == 0 && issued_any) named_bar_sync(kBarTurn0, 256);
  }
}

// Split-K finish for plain partial slices: c = bf16(sum of the `splits` fp32 slices), 8 elements per thread.
__global__ void f32_sum_to_bf16_kernel(const float* __restrict__ ws, __nv_bfloat16* __restrict__ c, long long count,
                                       int splits) {
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i >= count) return;
  float4 x = *reinterpret_cast<const float4*>(ws + i);
  float4 y = *reinterpret_cast<const float4*>(ws + i + 4);
  for (int sp = 1; sp < splits; ++sp) {
    const float4 x2 = *reinterpret_cast<const float4*>(ws + sp * count + i);
    const float4 y2 = *reinterpret_cast<const float4*>(ws + sp * count + i + 4);
    x.x += x2.x; x.y += x2.y; x.z += x2.z; x.w += x2.w;
    y.x += y2.x; y.y += y2.y; y.z += y2.z; y.w += y2.w;
  }
  __nv_bfloat162 o[4] = {__floats2bfloat162_rn(x.x, x.y), __floats2bfloat162_rn(x.z, x.w),
                         __floats2bfloat162_rn(y.x, y.y), __floats2bfloat162_rn(y.z, y.w)};
  *reinterpret_cast<uint4*>(c + i) = *reinterpret_cast<const uint4*>(o);
}

// Split-K finish: fp32 workspace -> bf16 output, 8 elements per thread. count % 8 == 0.
__global__ void f32_to_bf16_kernel(const float* __restrict__ ws, __nv_bfloat16* __restrict__ c, long long count) {
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i >= count) return;
  const float4 x = *reinterpret_cast<const float4*>(ws + i);
  const float4 y = *reinterpret_cast<const float4*>(ws + i + 4);
  __nv_bfloat162 o[4] = {__floats2bfloat162_rn(x.x, x.y), __floats2bfloat162_rn(x.z, x.w),
                         __floats2bfloat162_rn(y.x, y.y), __floats2bfloat162_rn(y.z, y.w)};
  *reinterpret_cast<uint4*>(c + i) = *reinterpret_cast<const uint4*>(o);
}

}  // namespace fp8mm
