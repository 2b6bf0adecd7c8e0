// Grouped fp16 GEMM for the MoE layer on Hopper: TMA -> 4-stage shared-memory ring -> wgmma m64n256k16, warp
// specialized (one producer warpgroup, two consumer warpgroups of 64 rows each), persistent over (group, m-tile,
// n-tile) work units whose counts only the device knows (route.cuh writes them).
//
// One template, two uses (kGlu):
//   kGlu = true  (GEMM 1): A = the group's token rows [rows][d] (K-major: a routed expert's rows gathered into
//                expert order by gather_kernel, the shared expert's x itself), B = gate and up [d][dexp] (row-major: the
//                N-major wgmma layout), tile = 128 rows x (128 gate + 128 up) columns; the epilogue writes
//                h = silu(gate) * up (fp16, rounded as the reference rounds) into H at the group's sorted rows.
//   kGlu = false (GEMM 2): A = H rows [rows][dexp], B = down [dexp][d], tile = 128 x 256; the epilogue writes the
//                fp16 expert output to its (token, slot) row of Y (routed) or to the shared block of Y, or
//                (out_slot, red_combine) adds it, times the pair's score, into the token's output row by fp16
//                red.add, as the reference's index_add_ accumulates in fp16 (each term rounded: fp16 GEMM output,
//                fp16 product with the score, fp16 sums in whatever order the units finish).
// Groups 0..E-1 are the routed experts, group E the shared expert (all T tokens, in token order).
//
// kAsync (MoeConfig::async_epilogue, the default since 2026-11-25: -3.5% official): the consumers only round their
// accumulators to fp16 into a per-warpgroup staging buffer (the whole 64 x 256 tile) and start the next unit's MMAs;
// the producer warpgroup's three idle warps finish the epilogue (GEMM 1's silu * up, GEMM 2's score and red.add /
// store) while the tensor cores run. The staging buffer takes a ring stage's room: kAsync builds have 3 stages.
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_fp16.h>

#include "gemm_smem.h"
#include "sm90.cuh"
#include "unit_order.h"
#include "wgmma.cuh"

namespace moe {

using namespace kb::sm90;

// (kMaxGroups, kBM and the staging's sizes: gemm_smem.h)
constexpr int kBN = 256;             // B columns per tile (GEMM 1: 128 gate + 128 up)
constexpr int kThreads = 384;        // warpgroup 0 produces, 1 and 2 consume
constexpr int kMaxStages = 8;  // the ring's depth is a template parameter: 3 or 4 stages of k 64, 6 of k 32
// A ring stage's k (the kernels' template parameter kBK, from MoeConfig::bk32): 64, one 128-byte swizzle span of
// fp16 (A rows of 128 bytes, 48 KB a stage), or 32 (A rows of 64 bytes in 64-byte swizzle spans, B boxes of 32
// k-rows: 24 KB a stage, so twice the stages in the same bytes and more of them in flight while the consumers hold
// one).
template <int kBK>
struct Ring {
  static_assert(kBK == 64 || kBK == 32, "a stage holds 32 or 64 of k");
  static constexpr int kABytes = a_tile_bytes(kBK);      // 16 KB (k 64)
  static constexpr int kBChunk = kBK * 64 * 2;           // one TMA box of B: kBK k-rows x 64 columns, 8 KB (k 64)
  static constexpr int kBBytes = b_tile_bytes(kBK);      // 32 KB (k 64): 4 boxes
  static constexpr int kStageBytes = kABytes + kBBytes;  // 48 KB (k 64)
  static constexpr int kSteps = kBK / 16;                // wgmma k16 steps a stage
  static constexpr int kAsyncStages = 3 * 64 / kBK;      // the asynchronous epilogue's ring: 144 KB beside its staging
  // A tile's descriptor: rows of kBK * 2 bytes, K-major, in the swizzle TMA wrote them with
  static __device__ __forceinline__ uint64_t a_desc(const uint8_t* tile) {
    if constexpr (kBK == 64) return make_desc_sw128(tile);
    else return make_desc_sw64(tile);
  }
};
// Registers a thread after setmaxnreg. The CTA starts with kLaunchRegs a thread (ptxas's count under
// __launch_bounds__(384, 1)) and setmaxnreg.inc waits until the pool can give what it asks for: consumers that take
// more than the producer gives back wait forever (every launch hung with a 64-register producer, docs/moe-notes.md,
// twenty-first session; mla-decode learnt it first, attention_s_once.cuh).
constexpr int kLaunchRegs = 168, kConsumerRegs = 224, kProducerRegs = 56;
static_assert(2 * (kConsumerRegs - kLaunchRegs) <= kLaunchRegs - kProducerRegs,
              "setmaxnreg: the consumer warpgroups would wait forever for registers the producer does not free");

// meta (int32, written by route_kernel): [0, G]: first sorted row of group g (G = groups, so [G] = the end),
// then [G+1, 2G+1]: first m-tile of group g (prefix of ceil(rows_g / 128)). A launch may take the first `groups` of
// the meta_groups groups route_kernel wrote (GEMM 1 of the routed experts alone), or, with meta null, its one
// group's four numbers from fixed_meta (GEMM 1 of the shared expert alone, launched before the routing).
struct GemmParams {
  CUtensorMap a[2];               // kGlu: [0] the gathered routed rows, [1] x (the shared group); else [0] H
  CUtensorMap b[2 * kMaxGroups];  // kGlu: gate of group g at [g], up at [kMaxGroups + g]; else down at [g]
  const int* meta;
  int meta_groups;                // the group count meta was written for (>= groups)
  int fixed_meta[4];              // meta null: groups = 1 and these are its meta
  int shared_group;               // the shared expert's group index, -1 if this launch has none
  const int* out_rows;            // !kGlu: Y row of each sorted routed row (its pair index)
  __half* out;                    // kGlu: H; else Y (unless out_slot)
  __half* const* out_slot;        // !kGlu, red_combine: the zeroed output [T][d] lives at *out_slot; nullptr: Y
  const __half* scores;           // with out_slot: [T][K] fp16, the weight of pair t*K + k
  int K;                          // with out_slot: slots per token
  int groups;                     // E + 1
  int n_out;                      // output columns: dexp (kGlu) or d
  int n_tiles;                    // output tiles per row block: n_out / 128 (kGlu) or n_out / 256
  int k;                          // reduction length (multiple of 64)
  int shared_out_row0;            // !kGlu: Y row of the shared group's first token (T*K)
  int skip_empty_halves;          // a consumer whose 64 rows all lie past its group's end issues no MMAs
  // kGlu and kAsync, the shared expert's own launch after the routing (MoeConfig::shared_gather): besides H, each
  // unit's epilogue warps copy a slice of the tokens' rows of x to their K sorted rows of xs through shared memory
  // (gather_lsu: cp.async and stores, else bulk copies; the gather pass's job, under the MMAs), and zero those
  // tokens' output rows, which GEMM 2 adds into. gather_x null: neither.
  const __half* gather_x;         // x [T][d] (d = k)
  __half* gather_xs;              // xs [T*K][d]
  const int* gather_pair_row;     // [T*K]: the sorted row of pair t*K + k
  __half* const* zero_slot;       // the output's address in device memory; null: not zeroed here
  int gather_lsu;                 // MoeConfig::gather_lsu: the copies through the load/store units (gather_slice_lsu)
  int band;                       // MoeConfig::band: m-tiles a band of a group's units (decode); 0: the whole group
  int decode_ahead;               // MoeConfig::decode_ahead: consumers decode the next unit under this one's last MMAs
                                  // and every scan for a unit's group starts at the previous unit's; 0: at the unit's
                                  // start, from group 0 (the build before)
  // late output: the device word the output's address is taken into. A null address there is a speculative launch
  // called off (moe_replay: inputs other than the graph's), and the launch reads and writes nothing.
  void* const* abort_slot;
#ifdef KBENCH_DEV
  long long* trace;               // KBENCH_MOE_DEV_TRACE: per-unit stamps (kTrace instances; see below)
  int trace_launch;               // which of the call's GEMM launches this is (the trace's first index)
#endif
};

// Dev builds may stamp every unit of a GEMM launch (benchmarks/moe.py --trace): consumer warpgroup 0's thread 0
// writes kTraceFields int64 per unit at trace[(trace_launch * kTraceUnits + u) * kTraceFields]: 0 the unit (SM id
// bits 0-7, group 8-15, m-tile 16-23, its rows in the tile 24-31, n-tile 32-47), 1-3 globaltimer (ns) when the
// unit's loop starts, when its first stage has landed and when its last MMA is done, 4-5 clock64 at the first and
// the third, 6 the cycles spent waiting on full barriers, 7 globaltimer once its accumulators are handed over (the
// staging buffer written, kAsync). The SM clock of a unit is (5 - 4) / (3 - 1); its MMAs at the tensor cores' peak
// take num_kb x 1024 cycles (8 wgmma m64n256k16 a k-block, 128 cycles each).
constexpr int kTraceLaunches = 4, kTraceUnits = 16384, kTraceFields = 8;
__device__ __forceinline__ int sm_id() {
  int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// h = silu(gate) * up with the reference's roundings: the GEMM outputs are fp16 (F.linear), silu computes in fp32
// and rounds to fp16, and the product of two fp16 tensors rounds once more.
// (expf and an IEEE division as torch's silu; __expf with __frcp_rn measured 0.9% slower end to end, moe notes.)
__device__ __forceinline__ __half glu(float gate, float up) {
  const float g = __half2float(__float2half_rn(gate));
  const float s = __half2float(__float2half_rn(g / (1.0f + expf(-g))));
  return __float2half_rn(s * __half2float(__float2half_rn(up)));
}

// Where row `local` of unit w goes: the element offset of its first column in the output (H, Y or the token's output
// row), or -1 past the group's end; `scale` the fp16 score it is multiplied by (1 but for GEMM 2's routed rows when
// accumulating).
template <bool kGlu>
__device__ __forceinline__ long long row_target(const GemmParams& p, const Unit& w, int local, bool accumulate,
                                                __half2& scale) {
  scale = __float2half2_rn(1.0f);
  if (local >= w.rows) return -1;
  long long out_row;
  if constexpr (kGlu) {
    out_row = w.row0 + local;  // H keeps the sorted order (routed rows, then the shared expert's)
  } else if (accumulate) {     // the token's output row
    if (w.g == p.shared_group) {
      out_row = local;
    } else {
      const int pair = p.out_rows[w.row0 + local];
      out_row = pair / p.K;
      scale = __half2half2(p.scores[pair]);
    }
  } else {
    out_row = w.g == p.shared_group ? p.shared_out_row0 + local : p.out_rows[w.row0 + local];
  }
  return out_row * p.n_out;
}

// out[0..7] += v[0..7] (fp16, each sum rounded to nearest, subnormals kept), one 16-byte reduction in L2.
__device__ __forceinline__ void red_add_f16x8(__half* out, const uint4& v) {
  asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(out), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// The producer (one thread): for each of this CTA's units, every k-block's A tile and four B boxes into the next
// free stage.
template <bool kGlu, int kStages, int kBK>
__device__ __forceinline__ void produce(const GemmParams& p, const int* s_meta, uint8_t* s_a, uint8_t* s_b,
                                        uint64_t* full, uint64_t* empty, int units, int num_kb) {
  using R = Ring<kBK>;
  const int G = p.groups;
  int s = 0, g_from = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = decode(s_meta, G, p.n_tiles, u, p.band, p.decode_ahead ? g_from : 0);
    g_from = w.g;
    const bool shared_x = kGlu && w.g == p.shared_group;  // GEMM 1 reads the shared expert's rows from x itself
    const CUtensorMap* amap = &p.a[shared_x ? 1 : 0];
    // A group's last m-tile reads on into the next group's rows (its results there are never stored). Keep it so:
    // the same rows as zeros made GEMM 1 ~35% slower on an H100 (docs/moe-notes.md, eighth session), and zeroing
    // them in the stage by the consumers' stores cost +8-25% whatever the value written, and loading the tile as up
    // to 12 smaller boxes (rows, then TMA's zero fill) +30-35% with or without zeros; one box through a map ending
    // at the group's end (zeros for free) tied (thirty-fourth session), though zero operands cost the MMAs ~30% less
    // energy in isolation (benchmarks/wgmma_energy_probe.py).
    const int a_row = (shared_x ? 0 : w.row0) + w.mt * kBM;
    for (int kb = 0; kb < num_kb; ++kb) {
      mbar_wait(&empty[s], phase ^ 1);
      mbar_arrive_expect_tx(&full[s], R::kStageBytes);
      tma_load_2d(s_a + s * R::kABytes, amap, &full[s], kb * kBK, a_row);
      uint8_t* sb = s_b + s * R::kBBytes;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (kGlu) {  // chunks 0, 1: gate columns n0 .. n0 + 127; chunks 2, 3: the same up columns
          const CUtensorMap* bmap = &p.b[(j < 2 ? 0 : kMaxGroups) + w.g];
          tma_load_2d(sb + j * R::kBChunk, bmap, &full[s], w.nt * 128 + (j & 1) * 64, kb * kBK);
        } else {
          tma_load_2d(sb + j * R::kBChunk, &p.b[w.g], &full[s], w.nt * 256 + j * 64, kb * kBK);
        }
      }
      ring_next(s, phase, kStages);
    }
  }
}

// GemmParams::gather_x: unit u of the shared expert's launch copies tokens [u T / units, (u + 1) T / units) of x to
// their K rows of xs and zeroes their output rows, while the consumers compute unit u. Lane 0 of each drain warp is
// a copy chain (every third token: a piece of its row into the chain's bounce buffer by one bulk copy, then K bulk
// copies out of it), the other lanes zero. (One chain of 7 KB pieces measured the same: back to back at 8192 tokens,
// under the power cap, the copies lengthen the shared GEMM 1 by ~250 us either way; docs/moe-notes.md.)
__device__ __forceinline__ void gather_slice(const GemmParams& p, int u, int units, int T, uint8_t* s_gbuf,
                                             uint64_t* gbar, uint32_t& gphase, int e) {
  const int t0 = static_cast<int>(static_cast<long long>(u) * T / units);
  const int t1 = static_cast<int>(static_cast<long long>(u + 1) * T / units);
  const int d = p.k, chain = e / 32, lane = e % 32;
  if (lane == 0) {
    const uint32_t row_bytes = d * 2;
    s_gbuf += chain * kGatherBytes;
    gbar += chain;
    for (int t = t0 + chain; t < t1; t += kGatherChains) {
      const uint8_t* src = reinterpret_cast<const uint8_t*>(p.gather_x + static_cast<long long>(t) * d);
      for (uint32_t off = 0; off < row_bytes; off += kGatherBytes) {
        const uint32_t bytes = min(row_bytes - off, static_cast<uint32_t>(kGatherBytes));
        mbar_arrive_expect_tx(gbar, bytes);
        bulk_load_g2s(s_gbuf, src + off, bytes, gbar);
        mbar_wait(gbar, gphase);
        gphase ^= 1;
        for (int k = 0; k < p.K; ++k) {
          const long long row = p.gather_pair_row[static_cast<long long>(t) * p.K + k];
          bulk_store_s2g(reinterpret_cast<uint8_t*>(p.gather_xs + row * d) + off, s_gbuf, bytes);
        }
        bulk_wait_read();  // the buffer is read: the next piece may land in it
      }
    }
  } else if (p.zero_slot) {
    __half* const zero_out = *p.zero_slot;
    const int per_row = d / 8;
    const long long n = static_cast<long long>(t1 - t0) * per_row;
    for (long long i = chain * 31 + lane - 1; i < n; i += kEpiThreads - kGatherChains)
      reinterpret_cast<uint4*>(zero_out + static_cast<long long>(t0) * d)[i] = make_uint4(0, 0, 0, 0);
  }
}

// GemmParams::gather_lsu: the same slice without the TMA unit, which the GEMM's own loads need (the bulk copies made
// the shared expert's units ~25% longer, docs/moe-notes.md, twenty-fourth session). Each drain warp takes every
// third token, a kGatherBytes piece at a time: cp.async (16 bytes a lane) into its bounce buffer, then 16-byte loads
// from there and stores to each of the token's K rows; then the three warps zero the slice's output rows.
__device__ __forceinline__ void gather_slice_lsu(const GemmParams& p, int u, int units, int T, uint8_t* s_gbuf,
                                                 int e) {
  // (the drain warps have 56 registers: 32-bit offsets, the K rows held one a lane, K <= 32, loops not unrolled)
  const int t0 = static_cast<int>(static_cast<long long>(u) * T / units);
  const int t1 = static_cast<int>(static_cast<long long>(u + 1) * T / units);
  const int lane = e % 32;
  uint8_t* const buf = s_gbuf + (e / 32) * kGatherBytes;
#pragma unroll 1
  for (int t = t0 + e / 32; t < t1; t += kGatherChains) {
    const int my_row = lane < p.K ? p.gather_pair_row[t * p.K + lane] : 0;  // lane k: the sorted row of slot k
#pragma unroll 1
    for (int off = 0; off < 2 * p.k; off += kGatherBytes) {
      const int bytes = min(2 * p.k - off, kGatherBytes);
#pragma unroll 1
      for (int i = lane * 16; i < bytes; i += 32 * 16)
        cp_async_16(buf + i, reinterpret_cast<const uint8_t*>(p.gather_x + static_cast<long long>(t) * p.k) + off + i);
      cp_async_commit();
      cp_async_wait_all();
      __syncwarp();  // every lane's pieces have landed
#pragma unroll 1
      for (int i = lane * 16; i < bytes; i += 32 * 16) {
        const uint4 v = *reinterpret_cast<const uint4*>(buf + i);
#pragma unroll 1
        for (int k = 0; k < p.K; ++k) {
          const int row = __shfl_sync(0xffffffffu, my_row, k);
          *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(p.gather_xs + static_cast<long long>(row) * p.k) + off +
                                    i) = v;
        }
      }
      __syncwarp();  // the buffer is read: the next piece may land in it
    }
  }
  if (p.zero_slot) {
    uint4* const zero_out = reinterpret_cast<uint4*>(*p.zero_slot + static_cast<long long>(t0) * p.k);
    const int n = (t1 - t0) * (p.k / 8);
#pragma unroll 1
    for (int i = e; i < n; i += kEpiThreads) zero_out[i] = make_uint4(0, 0, 0, 0);
  }
}

// kAsync: the producer warpgroup's warps 1-3 (e = 0..95) finish every unit's epilogue from the consumers' staging
// buffers, warpgroup 0's rows then warpgroup 1's, while the consumers run the next unit's MMAs. A warp takes one
// staged row at a time (512 bytes: 16 bytes a lane), so its global writes are whole row segments.
template <bool kGlu>
__device__ __forceinline__ void drain_epilogues(const GemmParams& p, const int* s_meta, const uint8_t* s_stage,
                                                long long* s_off, __half2* s_scale, uint64_t* stg_full,
                                                uint64_t* stg_empty, int units, int e, uint8_t* s_gbuf,
                                                uint64_t* gbar) {
  const bool accumulate = !kGlu && p.out_slot != nullptr;
  __half* const out = accumulate ? *p.out_slot : p.out;
  const int warp = e / 32, lane = e % 32;
  uint32_t phase = 0, gphase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    if (kGlu && p.gather_x && p.gather_lsu) {
      // first, under the unit's MMAs (the slice's copies take ~15 us at the official shapes; the last unit's would
      // otherwise lengthen the launch), and with nothing of the unit live across them (the 56 registers spilled)
      const Unit g = decode(s_meta, p.groups, p.n_tiles, u, p.band);
      if (g.g == p.shared_group) gather_slice_lsu(p, u, units, g.rows, s_gbuf, e);
    }
    named_bar_sync(3, kEpiThreads);  // every warp is done with the previous unit's table
    // (the drain warps decode from group 0: a hint live across the gather spilled their 56 registers; they have a
    // unit's MMAs of slack)
    const Unit w = decode(s_meta, p.groups, p.n_tiles, u, p.band);
    const bool gather = kGlu && p.gather_x && w.g == p.shared_group;
    for (int r = e; r < kBM; r += kEpiThreads)
      s_off[r] = row_target<kGlu>(p, w, w.mt * kBM + r, accumulate, s_scale[r]);
    named_bar_sync(3, kEpiThreads);
    if (gather && !p.gather_lsu) gather_slice(p, u, units, w.rows, s_gbuf, gbar, gphase, e);
    __half* const dst = out + w.nt * (kGlu ? 128 : 256);
    for (int cw = 0; cw < 2; ++cw) {
      mbar_wait(&stg_full[cw], phase);
      for (int r = warp; r < 64; r += kEpiThreads / 32) {
        const long long off = s_off[cw * 64 + r];
        if (off < 0) continue;
        const uint8_t* src = s_stage + cw * kStageCBytes + r * kStagePitch;
        if constexpr (kGlu) {  // H columns 4 lane .. 4 lane + 3: gate at staged columns 0..127, up at 128..255
          uint2 gv = *reinterpret_cast<const uint2*>(src + lane * 8);
          uint2 uv = *reinterpret_cast<const uint2*>(src + 256 + lane * 8);
          const __half* gh = reinterpret_cast<const __half*>(&gv);
          const __half* uh = reinterpret_cast<const __half*>(&uv);
          uint2 hv;
          __half* hh = reinterpret_cast<__half*>(&hv);
#pragma unroll
          for (int j = 0; j < 4; ++j) hh[j] = glu(__half2float(gh[j]), __half2float(uh[j]));
          *reinterpret_cast<uint2*>(dst + off + lane * 4) = hv;
        } else {
          uint4 v = *reinterpret_cast<const uint4*>(src + lane * 16);
          if (accumulate) {  // the reference's out.mul_(score), then its fp16 index_add_
            __half2* h = reinterpret_cast<__half2*>(&v);
            const __half2 sc = s_scale[cw * 64 + r];
#pragma unroll
            for (int j = 0; j < 4; ++j) h[j] = __hmul2(h[j], sc);
            red_add_f16x8(dst + off + lane * 8, v);
          } else {
            *reinterpret_cast<uint4*>(dst + off + lane * 8) = v;
          }
        }
      }
      mbar_arrive(&stg_empty[cw]);  // every thread: its own reads are ordered before the consumers' next writes
    }
    phase ^= 1;
  }
}

template <bool kGlu, int kStages, bool kAsync = false, bool kTrace = false, int kBK = 64>
__global__ void __launch_bounds__(kThreads, 1) grouped_gemm_kernel(const __grid_constant__ GemmParams p) {
  static_assert(kStages >= 2 && kStages <= kMaxStages, "the ring needs two stages and fits eight");
  constexpr GemmSmem L = gemm_smem(kBK, kStages, kAsync);  // the launch asks for L.bytes (moe.cu)
  static_assert(L.bytes <= kSmemLimit, "the ring and staging exceed the 227 KB of a block");
  using R = Ring<kBK>;
  constexpr int kABytes = R::kABytes, kBBytes = R::kBBytes;
  extern __shared__ uint8_t smem_raw[];
  if (p.abort_slot && *p.abort_slot == nullptr) return;  // (uniform: every thread reads the same word)
  // 128B-swizzled TMA tiles and wgmma descriptors both assume 1024-byte aligned tiles.
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_a = base + L.a;
  uint8_t* s_b = base + L.b;
  uint8_t* s_c = base + L.c;  // the epilogue's staging
  uint64_t* full = reinterpret_cast<uint64_t*>(base + L.full);
  uint64_t* empty = reinterpret_cast<uint64_t*>(base + L.empty);
  int* s_meta = reinterpret_cast<int*>(base + L.meta);
  // kAsync only (null otherwise): the row table; per consumer warpgroup, "its staged rows are there" and "the epilogue
  // warps are done with them"; GemmParams::gather_x's bounce buffers and their barriers, one a copy chain
  const auto async_at = [&](int off) { return kAsync ? base + off : nullptr; };
  long long* s_off = reinterpret_cast<long long*>(async_at(L.row_off));
  __half2* s_scale = reinterpret_cast<__half2*>(async_at(L.row_scale));
  uint64_t* stg_full = reinterpret_cast<uint64_t*>(async_at(L.stg_full));
  uint64_t* stg_empty = reinterpret_cast<uint64_t*>(async_at(L.stg_empty));
  uint8_t* s_gbuf = async_at(L.gather);
  uint64_t* gbar = reinterpret_cast<uint64_t*>(async_at(L.gather_bar));

  const int G = p.groups;
  for (int i = threadIdx.x; i < 2 * (G + 1); i += blockDim.x)
    s_meta[i] = p.meta ? p.meta[i <= G ? i : i + p.meta_groups - G] : p.fixed_meta[i];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);  // the producer's arrive_expect_tx (the TMA bytes complete the phase)
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    if constexpr (kAsync) {
      for (int c = 0; c < 2; ++c) {
        mbar_init(&stg_full[c], 128);         // one arrive per consumer thread
        mbar_init(&stg_empty[c], kEpiThreads);  // one arrive per epilogue thread
      }
      for (int c = 0; c < kGatherChains; ++c) mbar_init(&gbar[c], 1);  // its chain's arrive_expect_tx
    }
    fence_mbar_init();
  }
  __syncthreads();
  const int units = s_meta[2 * G + 1] * p.n_tiles;
  const int num_kb = p.k / kBK;
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) produce<kGlu, kStages, kBK>(p, s_meta, s_a, s_b, full, empty, units, num_kb);
    if constexpr (kAsync) {
      if (threadIdx.x >= 32)
        drain_epilogues<kGlu>(p, s_meta, s_c, s_off, s_scale, stg_full, stg_empty, units, threadIdx.x - 32, s_gbuf,
                              gbar);
    }
    return;
  }

  setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1;  // consumer index: rows [64 cw, 64 cw + 64) of the tile
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4;  // accumulator rows frag_row and frag_row + 8 (within 64)
  const int frag_col = 2 * (lane % 4);        // accumulator columns 8c + frag_col + {0, 1}
  uint8_t* my_c = s_c + cw * kCBytes;
  const bool accumulate = !kGlu && p.out_slot != nullptr;
  __half* const out = accumulate ? *p.out_slot : p.out;
  int s = 0;
  uint32_t phase = 0;
  uint32_t stg_phase = 0;  // kAsync

  // Each unit is decoded while the previous one's last MMAs run (wn below): between a hand-over and the next unit's
  // first MMA the consumers only wait for the stage.
  Unit w = decode(s_meta, G, p.n_tiles, blockIdx.x, p.band), wn = w;
  for (int u = blockIdx.x; u < units; u += gridDim.x, w = wn) {
    if (!p.decode_ahead) w = decode(s_meta, G, p.n_tiles, u, p.band);
    // The last m-tile of a group often holds 64 rows or fewer: its second half is empty. With skip_empty_halves
    // that warpgroup only releases the stages (same arrivals), and the other one has the tensor cores to itself.
    // (Broadcast from lane 0: the compiler must see the branch around the wgmma as warp-uniform, or it serializes
    // every wgmma of the kernel, ptxas C7518.)
    const bool idle = __shfl_sync(0xffffffffu, p.skip_empty_halves && w.mt * kBM + cw * 64 >= w.rows, 0);
    float acc[128];
    int prev = -1;
    long long tr_ns[3], tr_clk = 0, tr_wait = 0;  // kTrace only
    if constexpr (kTrace) tr_ns[0] = global_ns();
    for (int kb = 0; kb < num_kb; ++kb) {
      if constexpr (kTrace) {
        const long long c0 = clock64();
        mbar_wait(&full[s], phase);
        const long long c1 = clock64();
        tr_wait += c1 - c0;
        if (kb == 0) tr_ns[1] = global_ns(), tr_clk = c1;
      } else {
        mbar_wait(&full[s], phase);
      }
      if (!idle) {
        const uint64_t da = R::a_desc(s_a + s * kABytes + cw * 64 * (kBK * 2));
        const uint64_t db = make_desc_sw128(s_b + s * kBBytes, R::kBChunk, 1024);
        wgmma_fence();
#pragma unroll
        for (int q = 0; q < R::kSteps; ++q)  // k16 steps: A advances 32 bytes, B 16 rows of 128 bytes
          wgmma_m64n256k16_f16<1>(acc, da + 2 * q, db + (2048 >> 4) * q, kb > 0 || q > 0);
        wgmma_commit();
      }
      if (prev >= 0) release_after_wgmma(&empty[prev], lane);
      prev = s;
      ring_next(s, phase, kStages);
    }
    if (p.decode_ahead && u + static_cast<int>(gridDim.x) < units)  // the next unit, from this one's group on
      wn = decode(s_meta, G, p.n_tiles, u + gridDim.x, p.band, w.g);
    // The epilogue's destination rows: this thread stores 16 bytes of rows t / 8 + 16 i (i < 4) in every pass. GEMM
    // 2's routed rows come from out_rows in global memory: loaded here, while the last MMAs run, not inside the
    // passes (ncu, 2026-11-24: those dependent loads were ~3% of GEMM 2's stall samples).
    const int row_base = w.mt * kBM + cw * 64;  // first row of this warpgroup within the group
    long long out_off[4];                        // element offset of the row's first column, or -1: past the group
    __half2 scale[4];                            // accumulate: the row's score (1 for the shared expert's rows)
    if constexpr (!kAsync) {  // (kAsync: the epilogue warps find the rows)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out_off[i] = row_target<kGlu>(p, w, row_base + t / 8 + 16 * i, accumulate, scale[i]);
        if (out_off[i] >= 0) out_off[i] += (t % 8) * 8;
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) reg_fence(acc[i]);
    long long tr_end_clk = 0;
    if constexpr (kTrace) tr_ns[2] = global_ns(), tr_end_clk = clock64();
    __syncwarp();
    if (lane == 0 && prev >= 0) mbar_arrive(&empty[prev]);
    if constexpr (kAsync) {  // fp16 into the staging buffer once the epilogue warps have drained the last unit's
      mbar_wait(&stg_empty[cw], stg_phase ^ 1);
      if (!idle) {
        uint8_t* rows = s_c + cw * kStageCBytes;
#pragma unroll
        for (int c = 0; c < 32; ++c)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<__half2*>(rows + (frag_row + 8 * h) * kStagePitch + (8 * c + frag_col) * 2) =
                __floats2half2_rn(acc[4 * c + 2 * h], acc[4 * c + 2 * h + 1]);
      }
      mbar_arrive(&stg_full[cw]);  // every thread: its own writes are released to the epilogue warps
      stg_phase ^= 1;
#ifdef KBENCH_DEV
      if constexpr (kTrace) {
        if (cw == 0 && t == 0 && p.trace && u < kTraceUnits) {
          long long* at = p.trace + (static_cast<long long>(p.trace_launch) * kTraceUnits + u) * kTraceFields;
          const int tile_rows = max(0, min(kBM, w.rows - w.mt * kBM));
          at[0] = static_cast<long long>(sm_id() & 255) | (static_cast<long long>(w.g & 255) << 8) |
                  (static_cast<long long>(w.mt & 255) << 16) | (static_cast<long long>(tile_rows) << 24) |
                  (static_cast<long long>(w.nt & 0xffff) << 32);
          at[1] = tr_ns[0];
          at[2] = tr_ns[1];
          at[3] = tr_ns[2];
          at[4] = tr_clk;
          at[5] = tr_end_clk;
          at[6] = tr_wait;
          at[7] = global_ns();
        }
      }
#endif
      continue;
    }
    if (idle) continue;  // no rows of this warpgroup to store

    // Epilogue: 64-column passes through shared memory, so global stores are 128-byte row segments.
    constexpr int kPasses = kGlu ? 2 : 4;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      named_bar_sync(1 + cw, 128);  // the previous pass's readers are done with my_c
#pragma unroll
      for (int cc = 0; cc < 8; ++cc) {
        const int c = pass * 8 + cc;  // 8-column group of the accumulator
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          __half2 v;
          if constexpr (kGlu) {
            v = __halves2half2(glu(acc[4 * c + 2 * h], acc[4 * (c + 16) + 2 * h]),
                               glu(acc[4 * c + 2 * h + 1], acc[4 * (c + 16) + 2 * h + 1]));
          } else {
            v = __floats2half2_rn(acc[4 * c + 2 * h], acc[4 * c + 2 * h + 1]);
          }
          *reinterpret_cast<__half2*>(my_c + (frag_row + 8 * h) * kCPitch + (8 * cc + frag_col) * 2) = v;
        }
      }
      named_bar_sync(1 + cw, 128);
      const int col0 = w.nt * (kGlu ? 128 : 256) + pass * 64;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (out_off[i] < 0) continue;
        uint4 v = *reinterpret_cast<const uint4*>(my_c + (t / 8 + 16 * i) * kCPitch + (t % 8) * 16);
        if (accumulate) {  // the reference's out.mul_(score): the fp16 output times the fp16 score, rounded
          __half2* h = reinterpret_cast<__half2*>(&v);
#pragma unroll
          for (int j = 0; j < 4; ++j) h[j] = __hmul2(h[j], scale[i]);
          red_add_f16x8(out + out_off[i] + col0, v);
        } else {
          *reinterpret_cast<uint4*>(out + out_off[i] + col0) = v;
        }
      }
    }
  }
}

}  // namespace moe
