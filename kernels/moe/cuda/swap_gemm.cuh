// The routed grouped GEMMs with the operands' roles swapped and a group's tail folded in (MoeConfig::swap_fold, a
// candidate): out^T = W^T x^T, the expert weights on the MMA's M side (M-major A straight from the weights' TMA
// boxes) and a group's tokens on its N side (K-major B, the gathered rows as grouped_gemm.cuh loads them). A group of
// up to 288 rows is one token tile: 256 tokens in wgmma m64n256k16 and the rest in m64n16k16 / m64n32k16 beside it
// (swap_tiles.h). So each feature tile of a group is one unit that reads its weights once, where grouped_gemm.cuh
// gives the 2048-token case's groups (228-279 rows) a third, mostly empty m-tile that reads them again and pads 20%
// of the computed rows.
//
// Unit = (group, feature tile, token tile) (swap_tiles.h decode_swap).
//   kGlu = true  (GEMM 1): warpgroup 0 multiplies gate columns f0 .. f0 + 63, warpgroup 1 the same up columns,
//                both by the same tokens; the epilogue writes H[row][f0 + j] = silu(gate) * up.
//   kGlu = false (GEMM 2): warpgroups 0 and 1 take down columns f0 .. f0 + 63 and f0 + 64 .. f0 + 127.
// A ring stage holds k 32: the two weight boxes (32 k-rows x 64 columns, 128-byte rows: the MMA's M-major A) and up
// to three token boxes (128 rows x 32 k, 64-byte rows: its K-major B). Four stages of 32 KB fit beside the staging
// of 288 tokens. The consumers round their accumulators to fp16 and store them transposed ([token][64 columns],
// stmatrix .trans) into their staging buffers; the producer warpgroup's warps 1-3 write each token's row out, as
// grouped_gemm.cuh's asynchronous epilogue does.
#pragma once
#include "grouped_gemm.cuh"
#include "swap_tiles.h"

namespace moe {
namespace swap {

constexpr int kBKs = 32;                                   // a stage's k
constexpr int kStages = 4;
constexpr int kWBox = kBKs * 64 * 2;                       // a weight box: 32 k-rows x 64 columns, 4 KB
constexpr int kXBox = kBM * kBKs * 2;                      // a token box: 128 rows x 32 k, 8 KB
constexpr int kRows = kTileN + kFold;                      // tokens a tile at most
constexpr int kXBoxes = (kRows + kBM - 1) / kBM;           // 3
constexpr int kStageW = 2 * kWBox;
constexpr int kStage = kStageW + kXBoxes * kXBox;          // 32 KB
constexpr int kPitch = 64 * 2 + 16;                        // a staged token: 64 fp16 columns + 16 bytes
constexpr int kStaging = kRows * kPitch;                   // per consumer warpgroup
// Byte offsets from the block's 1024-aligned base.
constexpr int kOffStaging = kStages * kStage;
constexpr int kOffRowOff = kOffStaging + 2 * kStaging;     // each token's output offset (int64)
constexpr int kOffRowScale = kOffRowOff + kRows * 8;       // and its score (half2)
constexpr int kOffBars = kOffRowScale + kRows * 4;         // full, empty, stg_full, stg_empty
constexpr int kOffMeta = kOffBars + (2 * kStages + 4) * 8; // the groups' first rows, then their first token tiles
constexpr int kSmemBytes = 1024 + kOffMeta + 2 * (kMaxGroups + 1) * 4;
static_assert(kSmemBytes <= kSmemLimit, "the swap GEMM's shared memory exceeds a block's 227 KB");
static_assert(kOffBars % 8 == 0 && kOffRowOff % 8 == 0, "barriers and offsets need 8-byte alignment");

// The producer (one thread): every k-block's two weight boxes and the tile's token boxes into the next free stage.
template <bool kGlu>
__device__ __forceinline__ void produce(const GemmParams& p, const int* s_meta, const int* s_tiles, uint8_t* ring,
                                        uint64_t* full, uint64_t* empty, int units, int num_kb) {
  int s = 0, g_from = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const SwapUnit w = decode_swap(s_meta, s_tiles, p.groups, p.n_tiles, u, g_from);
    g_from = w.g;
    const bool shared_x = kGlu && w.g == p.shared_group;  // GEMM 1 reads the shared expert's rows from x itself
    const CUtensorMap* xmap = &p.a[shared_x ? 1 : 0];
    const int x_row = (shared_x ? 0 : w.row0) + w.t0;  // a tile reads on into the next group (never stored)
    const int boxes = (main_n(w.size) + fold_n(w.size) + kBM - 1) / kBM;
    const CUtensorMap* w0 = &p.b[w.g];
    const CUtensorMap* w1 = kGlu ? &p.b[kMaxGroups + w.g] : &p.b[w.g];
    const int c0 = kGlu ? w.ft * 64 : w.ft * 128, c1 = kGlu ? c0 : c0 + 64;
    // (swap_prefetch: each weight tile is read by this unit alone, so its DRAM latency is this CTA's; the ring's
    // stages hold 24 KB of it in flight, and the L2 prefetches take more, without shared memory)
    const int ahead = p.swap_prefetch;
    for (int kb = 0; kb < min(ahead, num_kb); ++kb) {
      tma_prefetch_2d(w0, c0, kb * kBKs);
      tma_prefetch_2d(w1, c1, kb * kBKs);
    }
    for (int kb = 0; kb < num_kb; ++kb) {
      mbar_wait(&empty[s], phase ^ 1);
      mbar_arrive_expect_tx(&full[s], kStageW + boxes * kXBox);
      uint8_t* st = ring + s * kStage;
      tma_load_2d(st, w0, &full[s], c0, kb * kBKs);
      tma_load_2d(st + kWBox, w1, &full[s], c1, kb * kBKs);
      for (int j = 0; j < boxes; ++j)
        tma_load_2d(st + kStageW + j * kXBox, xmap, &full[s], kb * kBKs, x_row + kBM * j);
      if (ahead > 0 && kb + ahead < num_kb) {
        tma_prefetch_2d(w0, c0, (kb + ahead) * kBKs);
        tma_prefetch_2d(w1, c1, (kb + ahead) * kBKs);
      }
      ring_next(s, phase, kStages);
    }
  }
}

template <int N>
__device__ __forceinline__ void mma_n(float* acc, uint64_t a, uint64_t b, int accumulate) {
  if constexpr (N == 16) wgmma_m64n16k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 32) wgmma_m64n32k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 64) wgmma_m64n64k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 96) wgmma_m64n96k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 128) wgmma_m64n128k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 144) wgmma_m64n144k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 160) wgmma_m64n160k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 176) wgmma_m64n176k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 192) wgmma_m64n192k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 208) wgmma_m64n208k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 224) wgmma_m64n224k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 240) wgmma_m64n240k16_f16<0, 1>(acc, a, b, accumulate);
  if constexpr (N == 256) wgmma_m64n256k16_f16<0, 1>(acc, a, b, accumulate);
}

// Every k-block of one unit at widths N (tokens 0 .. N-1) and NF (tokens 256 .. 256 + NF - 1, 0: none): wait for
// the stage, issue its MMAs, hand back the stage before it.
template <int N, int NF>
__device__ __forceinline__ void mma_loop(float* acc, float* accf, const uint8_t* ring, uint64_t* full,
                                         uint64_t* empty, int& s, uint32_t& phase, int num_kb, int cw, int lane,
                                         int& prev) {
  for (int kb = 0; kb < num_kb; ++kb) {
    mbar_wait(&full[s], phase);
    const uint8_t* st = ring + s * kStage;
    const uint64_t da = make_desc_sw128(st + cw * kWBox, kWBox, 1024);  // M-major: 64 columns, one swizzle span
    const uint64_t db = make_desc_sw64(st + kStageW);                   // K-major tokens, 64-byte rows
    const uint64_t dbf = make_desc_sw64(st + kStageW + kTileN * kBKs * 2);  // token 256 on
    wgmma_fence();
#pragma unroll
    for (int q = 0; q < kBKs / 16; ++q) {  // k16 steps: the weights advance 16 rows of 128 bytes, the tokens 32 bytes
      const uint64_t a = da + (2048 >> 4) * q;
      const int accumulate = kb > 0 || q > 0;
      mma_n<N>(acc, a, db + 2 * q, accumulate);
      if constexpr (NF > 0) mma_n<NF>(accf, a, dbf + 2 * q, accumulate);
    }
    wgmma_commit();
    if (prev >= 0) release_after_wgmma(&empty[prev], lane);
    prev = s;
    ring_next(s, phase, kStages);
  }
}

// `count` 8-token groups of an m64 accumulator (tokens first + 8c ..) into the staging rows, transposed: register
// 4c + 2h + j of this lane is column (weight) 16 warp + lane / 4 + 8 h, token 8c + 2 (lane % 4) + j. Matrices (c, 0),
// (c, 1), (c + 1, 0), (c + 1, 1) go out in one stmatrix: lane l addresses the staged row of token 8 (c + l / 16) +
// l % 8, columns 16 warp + 8 ((l / 8) % 2) onwards.
template <int kMax>
__device__ __forceinline__ void stage_tokens(const float* acc, uint8_t* staging, int first, int count, int warp,
                                             int lane) {
  const int mat = lane / 8;
  uint8_t* dst = staging + (first + 8 * (mat / 2) + lane % 8) * kPitch + (16 * warp + 8 * (mat % 2)) * 2;
#pragma unroll
  for (int c = 0; c < kMax / 8; c += 2) {
    if (c >= count) break;
    uint32_t r[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const __half2 v = __floats2half2_rn(acc[4 * (c + m / 2) + 2 * (m % 2)], acc[4 * (c + m / 2) + 2 * (m % 2) + 1]);
      r[m] = *reinterpret_cast<const uint32_t*>(&v);
    }
    stmatrix_x4_trans(dst + 8 * c * kPitch, r[0], r[1], r[2], r[3]);
  }
}

// The instantiations a unit's widths select (key: main N x 4 + fold N / 16).
#define KB_SWAP_CASE(N, NF)                                                                   \
  case (N) * 4 + (NF) / 16:                                                                    \
    mma_loop<N, NF>(acc, accf, ring, full, empty, s, phase, num_kb, cw, lane, prev); \
    break;

// The producer warpgroup's warps 1-3 (e = 0..95): each unit's staged tokens out to their rows, once both consumer
// warpgroups have staged theirs.
template <bool kGlu>
__device__ __forceinline__ void drain(const GemmParams& p, const int* s_meta, const int* s_tiles,
                                      const uint8_t* s_stage, long long* s_off, __half2* s_scale, uint64_t* stg_full,
                                      uint64_t* stg_empty, int units, int e) {
  const bool accumulate = !kGlu && p.out_slot != nullptr;
  __half* const out = accumulate ? *p.out_slot : p.out;
  const int warp = e / 32, lane = e % 32;
  uint32_t phase = 0;
  int g_from = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const SwapUnit w = decode_swap(s_meta, s_tiles, p.groups, p.n_tiles, u, g_from);
    g_from = w.g;
    const Unit group{w.g, 0, 0, w.rows, w.row0};
    named_bar_sync(3, kEpiThreads);  // every warp is done with the previous unit's table
    for (int r = e; r < w.size; r += kEpiThreads)
      s_off[r] = row_target<kGlu>(p, group, w.t0 + r, accumulate, s_scale[r]);
    named_bar_sync(3, kEpiThreads);
    mbar_wait(&stg_full[0], phase);
    mbar_wait(&stg_full[1], phase);
    if constexpr (kGlu) {  // 8 lanes a token, 8 columns a lane: gate staged by warpgroup 0, up by warpgroup 1
      __half* const dst = out + w.ft * 64 + (lane % 8) * 8;
      for (int r = warp * 4 + lane / 8; r < w.size; r += 4 * (kEpiThreads / 32)) {
        const uint8_t* src = s_stage + r * kPitch + (lane % 8) * 16;
        const uint4 gv = *reinterpret_cast<const uint4*>(src);
        const uint4 uv = *reinterpret_cast<const uint4*>(src + kStaging);
        const __half* gh = reinterpret_cast<const __half*>(&gv);
        const __half* uh = reinterpret_cast<const __half*>(&uv);
        uint4 hv;
        __half* hh = reinterpret_cast<__half*>(&hv);
#pragma unroll
        for (int j = 0; j < 8; ++j) hh[j] = glu(__half2float(gh[j]), __half2float(uh[j]));
        *reinterpret_cast<uint4*>(dst + s_off[r]) = hv;
      }
    } else {  // 16 lanes a token: columns 0-63 staged by warpgroup 0, 64-127 by warpgroup 1, 8 a lane
      const int c16 = lane % 16;
      __half* const dst = out + w.ft * 128 + c16 * 8;
      for (int r = warp * 2 + lane / 16; r < w.size; r += 2 * (kEpiThreads / 32)) {
        uint4 v = *reinterpret_cast<const uint4*>(s_stage + (c16 / 8) * kStaging + r * kPitch + (c16 % 8) * 16);
        if (accumulate) {  // the reference's out.mul_(score), then its fp16 index_add_
          __half2* h = reinterpret_cast<__half2*>(&v);
          const __half2 sc = s_scale[r];
#pragma unroll
          for (int j = 0; j < 4; ++j) h[j] = __hmul2(h[j], sc);
          red_add_f16x8(dst + s_off[r], v);
        } else {
          *reinterpret_cast<uint4*>(dst + s_off[r]) = v;
        }
      }
    }
    mbar_arrive(&stg_empty[0]);  // every thread: its reads are ordered before the consumers' next writes
    mbar_arrive(&stg_empty[1]);
    phase ^= 1;
  }
}

template <bool kGlu>
__global__ void __launch_bounds__(kThreads, 1) swap_gemm_kernel(const __grid_constant__ GemmParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // TMA and wgmma: 1024-aligned
  uint8_t* ring = base;
  uint8_t* s_stage = base + kOffStaging;
  long long* s_off = reinterpret_cast<long long*>(base + kOffRowOff);
  __half2* s_scale = reinterpret_cast<__half2*>(base + kOffRowScale);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + kOffBars);
  uint64_t* empty = full + kStages;
  uint64_t* stg_full = empty + kStages;  // per consumer warpgroup: its staged tokens are there
  uint64_t* stg_empty = stg_full + 2;    // the epilogue warps are done with them
  int* s_meta = reinterpret_cast<int*>(base + kOffMeta);
  int* s_tiles = s_meta + kMaxGroups + 1;

  const int G = p.groups;
  for (int i = threadIdx.x; i <= G; i += blockDim.x)  // the groups' first rows (the meta's m-tile half is
    s_meta[i] = p.meta ? p.meta[i] : p.fixed_meta[i];  // grouped_gemm.cuh's)
  __syncthreads();
  if (threadIdx.x == 0) {
    int tiles = 0;
    for (int g = 0; g < G; ++g) {
      s_tiles[g] = tiles;
      tiles += group_tiles(s_meta[g + 1] - s_meta[g]);
    }
    s_tiles[G] = tiles;
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);   // the producer's arrive_expect_tx (the TMA bytes complete the phase)
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    for (int c = 0; c < 2; ++c) {
      mbar_init(&stg_full[c], 128);
      mbar_init(&stg_empty[c], kEpiThreads);
    }
    fence_mbar_init();
  }
  __syncthreads();
  const int units = s_tiles[G] * p.n_tiles;
  const int num_kb = p.k / kBKs;
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) produce<kGlu>(p, s_meta, s_tiles, ring, full, empty, units, num_kb);
    if (threadIdx.x >= 32)
      drain<kGlu>(p, s_meta, s_tiles, s_stage, s_off, s_scale, stg_full, stg_empty, units, threadIdx.x - 32);
    return;
  }

  setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  uint8_t* staging = s_stage + cw * kStaging;
  int s = 0, g_from = 0;
  uint32_t phase = 0, stg_phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const SwapUnit w = decode_swap(s_meta, s_tiles, G, p.n_tiles, u, g_from);
    g_from = w.g;
    // (from lane 0: the compiler must see the branches to each width as warp-uniform, or ptxas serializes the
    // wgmma, C7518)
    const int n = __shfl_sync(0xffffffffu, main_n(w.size), 0);
    const int nf = __shfl_sync(0xffffffffu, fold_n(w.size), 0);
    float acc[kTileN / 2], accf[kFold / 2];
    int prev = -1;
    // The whole k-loop per width pair, each writing a prefix of the one accumulator array: the registers are the same
    // whichever runs (an array per width made ptxas spill and serialize the wgmma, C7512), and the loop has no branch.
    switch (n * 4 + nf / 16) {
      KB_SWAP_CASE(64, 0)
      KB_SWAP_CASE(96, 0)
      KB_SWAP_CASE(128, 0)
      KB_SWAP_CASE(144, 0)
      KB_SWAP_CASE(160, 0)
      KB_SWAP_CASE(176, 0)
      KB_SWAP_CASE(192, 0)
      KB_SWAP_CASE(208, 0)
      KB_SWAP_CASE(224, 0)
      KB_SWAP_CASE(240, 0)
      KB_SWAP_CASE(256, 16)
      KB_SWAP_CASE(256, 32)
      default: mma_loop<256, 0>(acc, accf, ring, full, empty, s, phase, num_kb, cw, lane, prev);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kTileN / 2; ++i) reg_fence(acc[i]);
#pragma unroll
    for (int i = 0; i < kFold / 2; ++i) reg_fence(accf[i]);
    __syncwarp();
    if (lane == 0 && prev >= 0) mbar_arrive(&empty[prev]);
    mbar_wait(&stg_empty[cw], stg_phase ^ 1);
    stage_tokens<kTileN>(acc, staging, 0, n / 8, warp, lane);
    if (nf) stage_tokens<kFold>(accf, staging, kTileN, nf / 8, warp, lane);
    mbar_arrive(&stg_full[cw]);  // every thread: its own writes are released to the epilogue warps
    stg_phase ^= 1;
  }
}

#undef KB_SWAP_CASE

}  // namespace swap
}  // namespace moe
