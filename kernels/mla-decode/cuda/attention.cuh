// Absorbed MLA decode attention on Hopper: 128 query heads attend over one batch row's latent cache
// (576 = latent 512 | rope 64 per position), as multi-query attention with the keys' RoPE applied on the fly.
// This file holds the pieces both schedules share (Params, the RoPE tables and rotation, the split combine) and the
// previous schedule, kept as KBENCH_MLA_S_ONCE=0; the shipped one is attention_s_once.cuh.
//
// CTA = (batch row, head group of 64, kv split). Warpgroup 2 (the producer, one thread) loads Q once and streams the cache through a
// 2-stage ring of 64-row tiles with TMA (9 boxes of 64 x 64, 128-byte swizzle). The two consumer warpgroups
// (all 64 heads each, half of the tile's 64 positions each) per tile:
//   1. rotate the tile's rope columns in shared memory with the reference's bf16 RoPE (cos/sin tables from the
//      reference's own bf16 angles);
//   2. S = Q K^T over their 32 positions (36 wgmma m64n32k16, bf16, fp32 accumulation);
//   3. online softmax in fp32 (log2 domain), the row maxima exchanged between the two warpgroups;
//   4. P (bf16) into shared memory, both halves;
//   5. O += P V with V = the tile's latent columns (N-major B operand): each warpgroup owns 256 of the 512 output
//      columns (4 wgmma m64n256k16).
// Without a split the CTA writes the normalised output; with splits, fp32 partials + (max, sum) for the combine.
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_bf16.h>

#include "moving_inputs.h"
#include "sm90.cuh"
#include "wgmma.cuh"
#include "mla_config.h"  // kTile, kHeads, kHG

namespace mla {

using namespace kb::sm90;

constexpr int kLatent = 512, kRope = 64, kWidth = kLatent + kRope;
constexpr int kBlocks = kWidth / 64;       // 9 column blocks of 64 (one 128-byte swizzle span each)
constexpr int kStages = 2;
constexpr int kBlockBytes = 64 * 128;      // 64 rows x 128 bytes
constexpr int kTileBytes = kBlocks * kBlockBytes;  // 73,728: one cache tile, also Q
// The cache's last tile when it holds <= kTailRows rows (MlaConfig::narrow_tail): loaded as boxes of kTailRows rows,
// S by m64n16 and P V by one k16 step. The benchmark cases' caches hold prefill + 1 rows, so every work item's last
// tile carries one row and cost a whole tile's period (docs/mla-decode-notes.md, finding 41).
constexpr int kTailRows = 16;
constexpr int kTailBlockBytes = kTailRows * 128;
constexpr int kThreads = 384;              // consumer warpgroups 0, 1; producer warpgroup 2 (one thread issues)
constexpr int kSmemBytes = 1024 + kTileBytes * (1 + kStages) + kBlockBytes + 4 * kHG * 4 + 8 * (1 + 2 * kStages);
// Named barriers among the 256 consumer threads.
constexpr int kBarRope = 1, kBarMax = 2, kBarP = 3, kBarSum = 4;

struct Params {
  const __nv_bfloat16* cos_tab;  // [max_seq][32]
  const __nv_bfloat16* sin_tab;
  __nv_bfloat16* out;            // [bs][128][512]
  float* part_o;                 // [splits][bs][128][512] (splits > 1)
  float* part_ml;                // [splits][bs][128][2]
  const int* kv_len;             // [1] in device memory: a captured graph replays for any cache length
  int bs, max_seq, splits;
  int bulk_store;                // s-once, splits == 1: rows staged in shared memory, written by bulk copies
  int staged_st;                 // ... or (bulk_store too) by coalesced 16-byte stores from the staged rows
  float scale_log2;              // log2(e) / sqrt(192)
  int narrow_tail;               // s-once: the cache's last tile narrow where it holds <= kTailRows rows
  // s-once, a moving graph (moving_inputs.h): the cache's maps in device memory, read instead of tm_kv / tm_tail
  const CUtensorMap* bound_kv;
  const CUtensorMap* bound_tail;
#ifdef KBENCH_DEV
  int skip_rope;                 // timing only (KBENCH_MLA_DEV_SKIP_ROPE): the keys left un-rotated
  int skip_math;                 // timing only (KBENCH_MLA_DEV_SKIP_MATH): s-once consumers only wait and release
  long long* trace;              // KBENCH_MLA_DEV_TRACE: clock64 stamps [kTraceCtas][kTraceRoles][kTraceTiles][8]
#endif
};

// Dev builds may record when each role of the first kTraceCtas CTAs passes each point of its tile loop (SM clock
// cycles, clock64): where a tile's time goes on the critical path (benchmarks/mla_decode.py --phase-trace).
// Role kTraceClock holds (clock64, globaltimer ns) pairs in its tile 0: events 0-1 at the start of warpgroup 0's loop
// (Q landed), 2-3 at its end, from which the SM clock of the run follows; the s-once kernel adds 4-5 at the CTA's
// entry and 6-7 once its rows are stored, so that a work item's fixed cost (what does not grow with its tiles) splits
// into its parts (finding 33), and in its tile 1 the steps of the store: 0-1 once warpgroup 1's last P V is done
// (the rows' sums shared), 2-3 once warpgroup 0's columns are staged (bulk_store; finding 34). (Tracing the grid's
// last CTAs too cost warpgroup 0 a register spill: not done.)
constexpr int kTraceCtas = 8, kTraceRoles = 5, kTraceTiles = 128, kTraceEvents = 8;
enum TraceRole { kTraceWg0 = 0, kTraceWg1 = 1, kTraceLoader = 2, kTraceRotator = 3, kTraceClock = 4 };
__device__ __forceinline__ void trace_stamp(const Params& p, int role, int tile, int event) {
#ifdef KBENCH_DEV
  if (p.trace && blockIdx.x < kTraceCtas && tile < kTraceTiles)
    p.trace[((blockIdx.x * kTraceRoles + role) * kTraceTiles + tile) * kTraceEvents + event] = clock64();
#endif
}
__device__ __forceinline__ void trace_clock(const Params& p, int event, int slot = 0) {
#ifdef KBENCH_DEV
  if (p.trace && blockIdx.x < kTraceCtas) {
    long long* at =
        p.trace + ((blockIdx.x * kTraceRoles + kTraceClock) * kTraceTiles + slot) * kTraceEvents + event;
    const long long ns = global_ns();  // (read first, as before: the pair's order within the stamp)
    at[0] = clock64();
    at[1] = ns;
  }
#endif
}

// Dev builds' timing-only switches (wrong results); the shipped build has neither branch. rope: the keys left
// un-rotated (KBENCH_MLA_DEV_SKIP_ROPE). math: the s-once consumers wait for each stage and release it, with no MMA,
// softmax or hand-over of P (KBENCH_MLA_DEV_SKIP_MATH): what the loads and the rotation take by themselves.
struct DevSkips {
  bool rope, math;
};
__device__ __forceinline__ DevSkips dev_skips(const Params& p) {
#ifdef KBENCH_DEV
  return {p.skip_rope != 0, p.skip_math != 0};
#else
  return {false, false};
#endif
}


struct RopeTables {  // cos and sin of one position, frequencies 8g .. 8g + 7
  uint4 c, s;
};

__device__ __forceinline__ RopeTables load_rope_tables(int pos, int g, const Params& p) {
  const long long at = static_cast<long long>(pos) * 32 + 8 * g;
  return {*reinterpret_cast<const uint4*>(p.cos_tab + at), *reinterpret_cast<const uint4*>(p.sin_tab + at)};
}

// The rope columns of tile row r for frequencies 8g .. 8g + 7: x[8g .. 8g+7] (lo) and x[32+8g .. 32+8g+7] (hi).
struct RopePair {
  uint4 lo, hi;
};

__device__ __forceinline__ RopePair load_rope_pair(const uint8_t* rope_block, int r, int g) {
  return {*reinterpret_cast<const uint4*>(rope_block + sw128_offset(r, g)),
          *reinterpret_cast<const uint4*>(rope_block + sw128_offset(r, g + 4))};
}

__device__ __forceinline__ void store_rope_pair(uint8_t* rope_block, int r, int g, const RopePair& x) {
  *reinterpret_cast<uint4*>(rope_block + sw128_offset(r, g)) = x.lo;
  *reinterpret_cast<uint4*>(rope_block + sw128_offset(r, g + 4)) = x.hi;
}

// Step 1's arithmetic, with the reference's roundings: out = bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)).
// In bf16x2 instructions (mul.rn / add.rn / sub.rn.bf16x2, six for two elements where the fp32 path took ~40):
// each rounds its exact result to bf16 once, as torch's bf16 mul and add do through fp32 (a bf16 product is exact
// in fp32; a sum that fp32 rounds has operands 2^16 apart, where both give the larger one).
__device__ __forceinline__ RopePair rotate_pair(RopePair x, const RopeTables& t) {
  __nv_bfloat162* x1 = reinterpret_cast<__nv_bfloat162*>(&x.lo);
  __nv_bfloat162* x2 = reinterpret_cast<__nv_bfloat162*>(&x.hi);
  const __nv_bfloat162* cs = reinterpret_cast<const __nv_bfloat162*>(&t.c);
  const __nv_bfloat162* sn = reinterpret_cast<const __nv_bfloat162*>(&t.s);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const __nv_bfloat162 u = x1[e], v = x2[e];
    x1[e] = __hsub2_rn(__hmul2_rn(u, cs[e]), __hmul2_rn(v, sn[e]));  // rotate_half(x)[i] = -x[i + 32]
    x2[e] = __hadd2_rn(__hmul2_rn(v, cs[e]), __hmul2_rn(u, sn[e]));  // rotate_half(x)[i + 32] = x[i]
  }
  return x;
}

// Step 1: rope columns of tile row r for frequencies 8g .. 8g + 7, in place.
__device__ __forceinline__ void rotate_in_place(uint8_t* rope_block, int r, int g, const RopeTables& t) {
  store_rope_pair(rope_block, r, g, rotate_pair(load_rope_pair(rope_block, r, g), t));
}

// The CTA's batch row, head group, split and its tiles [tile0, tile1) of the cache (kv_len read from device memory).
struct CtaWork {
  int b, hg, split, kv_len, tile0, tile1;
};

// item: the work item's index (b, hg, split), blockIdx.x where each CTA takes one; the persistent s-once kernel
// (MlaConfig::persistent) walks items blockIdx.x, blockIdx.x + gridDim.x, ...
__device__ __forceinline__ CtaWork cta_work(const Params& p, unsigned item) {
  CtaWork c;
  c.b = item / (2 * p.splits);
  c.hg = (item / p.splits) % 2;
  c.split = item % p.splits;
  c.kv_len = *p.kv_len;
  const int num_tiles = (c.kv_len + kTile - 1) / kTile;
  const int tiles_per_split = (num_tiles + p.splits - 1) / p.splits;
  c.tile0 = c.split * tiles_per_split;
  c.tile1 = min(num_tiles, c.tile0 + tiles_per_split);
  return c;
}
__device__ __forceinline__ CtaWork cta_work(const Params& p) { return cta_work(p, blockIdx.x); }

// Whether cache tile `tile` (< the cache's tile count) is the cache's last and holds <= kTailRows rows, and (with
// MlaConfig::narrow_tail on) is then loaded and computed narrow. The same answer in every role of the CTA.
__device__ __forceinline__ bool short_tail(int kv_len, int tile) { return kv_len - tile * kTile <= kTailRows; }
__device__ __forceinline__ bool narrow_tile(const Params& p, int kv_len, int tile) {
  return p.narrow_tail && short_tail(kv_len, tile);
}

// The producer thread's two loads: a work item's Q (64 heads x 576) on q_full, and cache tile `tile` of row c.b into
// ring stage s (with rope_landed: the rope block first, on rope_landed[s], and full[s] counting the 8 latent blocks).
// tm_tail (non-null where MlaConfig::narrow_tail is on): the same cache in boxes of kTailRows rows, for a narrow tile
// (narrow_tile), whose rows land at the top of each block of the stage. [kJ0, kJ1): the blocks full[s] counts (kJ1
// -1: every block rope_landed does not take; MlaConfig::split_release loads a stage as blocks 0-3 with the rope block,
// then 4-7 on a barrier of their own).
__device__ __forceinline__ void load_q(const CUtensorMap* tm_q, uint8_t* s_q, uint64_t* q_full, const CtaWork& c) {
  mbar_arrive_expect_tx(q_full, kTileBytes);
  for (int j = 0; j < kBlocks; ++j) tma_load_2d(s_q + j * kBlockBytes, tm_q, q_full, j * 64, c.b * kHeads + c.hg * kHG);
}
template <int kJ0 = 0, int kJ1 = -1>
__device__ __forceinline__ void load_tile(const CUtensorMap* tm_kv, uint8_t* s_kv, uint64_t* full,
                                          uint64_t* rope_landed, int s, const CtaWork& c, int tile, int max_seq,
                                          const CUtensorMap* tm_tail = nullptr) {
  const int row = c.b * max_seq + tile * kTile;
  uint8_t* stage = s_kv + s * kTileBytes;
  const bool narrow = tm_tail && short_tail(c.kv_len, tile);  // narrow_tile, with the map as the knob
  const CUtensorMap* tm = narrow ? tm_tail : tm_kv;
  const int box_bytes = narrow ? kTailBlockBytes : kBlockBytes;
  if (rope_landed) {
    constexpr int j1 = kJ1 < 0 ? kBlocks - 1 : kJ1;
    mbar_arrive_expect_tx(&full[s], (j1 - kJ0) * box_bytes);
    mbar_arrive_expect_tx(&rope_landed[s], box_bytes);
    tma_load_2d(stage + (kBlocks - 1) * kBlockBytes, tm, &rope_landed[s], (kBlocks - 1) * 64, row);
    for (int j = kJ0; j < j1; ++j) tma_load_2d(stage + j * kBlockBytes, tm, &full[s], j * 64, row);
  } else {
    constexpr int j1 = kJ1 < 0 ? kBlocks : kJ1;
    mbar_arrive_expect_tx(&full[s], (j1 - kJ0) * box_bytes);
    for (int j = kJ0; j < j1; ++j) tma_load_2d(stage + j * kBlockBytes, tm, &full[s], j * 64, row);
  }
}

// The producer thread: Q once, then the CTA's cache tiles through the kStages ring (full: bytes landed; empty: the
// consumers' 8 warps are done with the stage). With rope_landed, each tile's rope block (block 8) is loaded first,
// on rope_landed[s], and full[s] counts only the 8 latent blocks (its other arrivals are the rotators').
__device__ __forceinline__ void load_q_and_tiles(const CUtensorMap* tm_q, const CUtensorMap* tm_kv, uint8_t* s_q,
                                                 uint8_t* s_kv, uint64_t* q_full, uint64_t* full, uint64_t* empty,
                                                 const CtaWork& c, int max_seq, uint64_t* rope_landed = nullptr,
                                                 const Params* trace = nullptr, const CUtensorMap* tm_tail = nullptr) {
  tma_prefetch_desc(tm_q);
  tma_prefetch_desc(tm_kv);
  if (tm_tail) tma_prefetch_desc(tm_tail);
  load_q(tm_q, s_q, q_full, c);
  int s = 0;
  uint32_t phase = 0;
  for (int tile = c.tile0; tile < c.tile1; ++tile) {
    if (trace) trace_stamp(*trace, kTraceLoader, tile - c.tile0, 0);
    mbar_wait(&empty[s], phase ^ 1);
    if (trace) trace_stamp(*trace, kTraceLoader, tile - c.tile0, 1);
    load_tile(tm_kv, s_kv, full, rope_landed, s, c, tile, max_seq, tm_tail);
    ring_next(s, phase, kStages);
  }
}

// A consumer warpgroup's 256 output columns (256w ..) of heads frag_row and frag_row + 8: with one split the output
// normalised by the row sums l; with splits the fp32 partials, and (write_ml) the rows' (max, sum) for the combine.
// o: the m64n256 accumulator; m, l: per head h of the two.
__device__ __forceinline__ void store_rows(const Params& p, const CtaWork& c, const float* o, int w, int frag_row,
                                           int frag_col, const float* m, const float* l, bool write_ml) {
  const int head0 = c.hg * kHG;
  if (p.splits == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = frag_row + 8 * h;
      const float inv = 1.0f / l[h];
      __nv_bfloat16* dst = p.out + (static_cast<long long>(c.b) * kHeads + head0 + row) * kLatent + 256 * w;
#pragma unroll
      for (int col = 0; col < 32; ++col)
        *reinterpret_cast<__nv_bfloat162*>(dst + 8 * col + frag_col) =
            __floats2bfloat162_rn(o[4 * col + 2 * h] * inv, o[4 * col + 2 * h + 1] * inv);
    }
  } else {
    const long long bh = (static_cast<long long>(c.split) * p.bs + c.b) * kHeads + head0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = frag_row + 8 * h;
      float* dst = p.part_o + (bh + row) * kLatent + 256 * w;
#pragma unroll
      for (int col = 0; col < 32; ++col)
        *reinterpret_cast<float2*>(dst + 8 * col + frag_col) = make_float2(o[4 * col + 2 * h], o[4 * col + 2 * h + 1]);
      if (write_ml) {
        p.part_ml[(bh + row) * 2] = m[h];
        p.part_ml[(bh + row) * 2 + 1] = l[h];
      }
    }
  }
}

// kPrefetchTables: each consumer thread loads the cos/sin it needs for the next tile while this one is processed,
// taking the tables' L2 latency off the per-tile path (MlaConfig::prefetch_tables).
template <bool kPrefetchTables>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                                    const __grid_constant__ CUtensorMap tm_kv,
                                                                    const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_q = base;
  uint8_t* s_kv = s_q + kTileBytes;
  uint8_t* s_p = s_kv + kStages * kTileBytes;
  float* s_max = reinterpret_cast<float*>(s_p + kBlockBytes);  // [2][64]
  float* s_sum = s_max + 2 * kHG;                                // [2][64]
  uint64_t* q_full = reinterpret_cast<uint64_t*>(s_sum + 2 * kHG);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + kStages;

  const CtaWork work = cta_work(p);
  const int kv_len = work.kv_len, tile0 = work.tile0, tile1 = work.tile1;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (threadIdx.x >= 256) {  // producer warpgroup: gives its registers to the consumers
    setmaxnreg_dec<56>();
    if (threadIdx.x == 256) load_q_and_tiles(&tm_q, &tm_kv, s_q, s_kv, q_full, full, empty, work, p.max_seq);
    return;
  }

  setmaxnreg_inc<224>();
  const int w = threadIdx.x / 128;  // this warpgroup's half: positions [32w, 32w + 32) of a tile, output cols 256w..
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4;  // heads frag_row and frag_row + 8 (within the CTA's 64)
  const int frag_col = 2 * (lane % 4);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  RopeTables tables{};  // kPrefetchTables: this thread's cos/sin for the tile it rotates next
  if (kPrefetchTables && tile0 < tile1)
    tables = load_rope_tables(tile0 * kTile + (threadIdx.x >> 2), threadIdx.x & 3, p);
  mbar_wait(q_full, 0);
  int s = 0;
  uint32_t phase = 0;
  for (int tile = tile0; tile < tile1; ++tile) {
    uint8_t* kv = s_kv + s * kTileBytes;
    mbar_wait(&full[s], phase);
    {  // 1. RoPE on the tile's rope columns (block 8): thread -> (row, frequency group)
      const int r = threadIdx.x >> 2, g = threadIdx.x & 3, pos = tile * kTile + r;
      if constexpr (kPrefetchTables) {
        if (pos < kv_len) rotate_in_place(kv + 8 * kBlockBytes, r, g, tables);
        if (tile + 1 < tile1) tables = load_rope_tables(pos + kTile, g, p);
      } else if (pos < kv_len) {
        rotate_in_place(kv + 8 * kBlockBytes, r, g, load_rope_tables(pos, g, p));
      }
      fence_proxy_async_smem();
      named_bar_sync(kBarRope, 256);
    }
    // 2. S = Q K^T for this warpgroup's 32 positions.
    float sc[16];
    wgmma_fence();
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      const uint64_t da = make_desc_sw128(s_q + blk * kBlockBytes);
      const uint64_t db = make_desc_sw128(kv + blk * kBlockBytes + w * 32 * 128);
#pragma unroll
      for (int q = 0; q < 4; ++q) wgmma_m64n32k16_bf16<0>(sc, da + 2 * q, db + 2 * q, blk > 0 || q > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 16; ++i) reg_fence(sc[i]);

    // 3. online softmax (log2 domain): scale, mask positions past kv_len, row maxima across both warpgroups.
    float m_loc[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int pos = tile * kTile + w * 32 + 8 * c + frag_col + e;
          float& v = sc[4 * c + 2 * h + e];
          v = pos < kv_len ? v * p.scale_log2 : -INFINITY;
          m_loc[h] = fmaxf(m_loc[h], v);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_loc[h] = fmaxf(m_loc[h], __shfl_xor_sync(0xffffffff, m_loc[h], 1));
      m_loc[h] = fmaxf(m_loc[h], __shfl_xor_sync(0xffffffff, m_loc[h], 2));
      if ((lane & 3) == 0) s_max[w * kHG + frag_row + 8 * h] = m_loc[h];
    }
    named_bar_sync(kBarMax, 256);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = frag_row + 8 * h;
      const float m_new = fmaxf(m_run[h], fmaxf(s_max[row], s_max[kHG + row]));
      alpha[h] = exp2f(m_run[h] - m_new);
      m_run[h] = m_new;
    }
    float l_loc[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = exp2f(sc[4 * c + 2 * h] - m_run[h]), p1 = exp2f(sc[4 * c + 2 * h + 1] - m_run[h]);
        l_loc[h] += p0 + p1;
        // 4. P (bf16) into shared memory: row = head, column = position in the tile (128-byte swizzled rows)
        *reinterpret_cast<__nv_bfloat162*>(s_p + sw128_offset(frag_row + 8 * h, 4 * w + c) + frag_col * 2) =
            __floats2bfloat162_rn(p0, p1);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_loc[h] += __shfl_xor_sync(0xffffffff, l_loc[h], 1);
      l_loc[h] += __shfl_xor_sync(0xffffffff, l_loc[h], 2);
      l_run[h] = l_run[h] * alpha[h] + l_loc[h];
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    fence_proxy_async_smem();
    named_bar_sync(kBarP, 256);

    // 5. O += P V: V = the tile's latent columns [256w, 256w + 256) = blocks 4w .. 4w+3, rows = positions.
    {
      const uint64_t da = make_desc_sw128(s_p);
      const uint64_t db = make_desc_sw128(kv + 4 * w * kBlockBytes, kBlockBytes, 1024);
      wgmma_fence();
#pragma unroll
      for (int q = 0; q < 4; ++q) wgmma_m64n256k16_bf16<1>(o, da + 2 * q, db + (2048 >> 4) * q, 1);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) reg_fence(o[i]);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    ring_next(s, phase, kStages);
  }

  // The row sums: each warpgroup summed its own positions.
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if ((lane & 3) == 0) s_sum[w * kHG + frag_row + 8 * h] = l_run[h];
  named_bar_sync(kBarSum, 256);
  float l_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) l_row[h] = s_sum[frag_row + 8 * h] + s_sum[kHG + frag_row + 8 * h];
  store_rows(p, work, o, w, frag_row, frag_col, m_run, l_row, w == 0 && (lane & 3) == 0);
}

// Splits > 1: out[b][h] = sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s; one warp per (b, h), 16 columns a lane.
__global__ void mla_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                   __nv_bfloat16* __restrict__ out, int bs, int splits) {
  const int bh = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (bh >= bs * kHeads) return;
  const long long stride = static_cast<long long>(bs) * kHeads;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, part_ml[(s * stride + bh) * 2]);
  float acc[16] = {}, l = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float ms = part_ml[(s * stride + bh) * 2];
    if (ms == -INFINITY) continue;  // a split with no position (cannot happen with whole tiles; kept safe)
    const float f = exp2f(ms - m);
    l += f * part_ml[(s * stride + bh) * 2 + 1];
    const float* src = part_o + (s * stride + bh) * kLatent + lane * 16;
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] += f * src[i];
  }
  __nv_bfloat16* dst = out + static_cast<long long>(bh) * kLatent + lane * 16;
#pragma unroll
  for (int i = 0; i < 16; i += 2)
    *reinterpret_cast<__nv_bfloat162*>(dst + i) = __floats2bfloat162_rn(acc[i] / l, acc[i + 1] / l);
}

}  // namespace mla
