// Absorbed MLA decode attention, the "S once" schedule (MlaConfig::s_once): the same CTA, tiles, TMA ring and
// numerics as attention.cuh, with each tile's S computed once, by one warpgroup (docs/mla-decode-notes.md, finding 10).
//
// Why: the kernel is bound by shared-memory reads, ~9.5 ns per KB of operand traffic a tile in all three schedules
// measured (attention.cuh 296 KB a tile at ~3.1 us, the ping-pong variant 352 KB at ~3.3 us, FlashInfer's 224 KB
// at ~2.1 us). wgmma re-reads the A operand (Q, 72 KB a tile) for every instruction, so splitting S's 64 positions
// over the two warpgroups (m64n32 each, attention.cuh) reads Q twice. Here:
//   consumer warpgroup 0: S = Q K^T over the tile's 64 positions (36 wgmma m64n64k16: Q and K read once), the
//     whole online softmax (no exchange of row maxima), P (bf16) kept in registers for its own O += P V (wgmma with
//     A from registers: an m64n64 accumulator's columns 16j .. 16j+15, packed to bf16 pairs, are the m64k16 A
//     fragment) and written to shared memory with the rescale factors for warpgroup 1;
//   consumer warpgroup 1: waits for P, reads it into registers (ldmatrix) and frees the buffer, rescales its O,
//     O += P V for the other 256 columns with A from registers;
//   producer warpgroup: warp 0 issues the TMA loads, warps 1-3 rotate each landed tile's rope columns and arrive on
//     the stage's `roped` barrier (the consumers wait on it instead of `full`), off the consumers' path. With
//     kRopeFirst the rope block is loaded first, on `full`, and rotated while the latent blocks land, which `roped`
//     also counts: the rotation leaves the chain release -> load -> land -> rotate -> S that sets a tile's time with
//     two stages (finding 17).
// Shared-memory operand traffic a tile: S 144 KB + P V 64 KB, P written and read once (16 KB), the rope block
// rotated (16 KB), the tile landing (72 KB).
// Warpgroup 0's softmax sits between its S and its P V with warpgroup 1 idle, so it is kept short (finding 12):
// MUFU.EX2 without exp2f's range fix-up, the scale folded into the exponent's FMA, the causal-length mask only on
// a split's last tile, and a lazy rescale: the running maxima move (and O, l are rescaled) only when a row's new
// maximum exceeds its running one by more than kRescaleSlack (log2 domain), so P <= 2^kRescaleSlack; the result
// O / l does not depend on which maxima were used, only on their being the same for O and l.
#pragma once
#include "attention.cuh"

namespace mla {

constexpr int kRotators = 96;  // producer warps 1..3
constexpr int kRopeItems = kTile * 4;  // (row, group of 8 frequencies) pairs a tile
constexpr int kItemsPerRotator = (kRopeItems + kRotators - 1) / kRotators;
constexpr int kSOnceSmemBytes = 1024 + kTileBytes * (1 + kStages) + kBlockBytes + 3 * kHG * 4 + 16 + 8 * (2 + 5 * kStages);
// Named barriers between the consumer warpgroups (256 threads: one side syncs, the other arrives).
constexpr int kBarPReady = 5;  // P and the rescale factors of the current tile are in shared memory
constexpr int kBarPFree = 6;   // warpgroup 1 has read them (its P V done): warpgroup 0 may write the next
constexpr int kBarRows = 7;    // the final row maxima and sums are in shared memory
constexpr int kBarStaged = 8;  // + w: warpgroup w's output columns are staged (MlaConfig::bulk_store)
// The staged output rows (bulk_store): 64 heads x 512 bf16, rows 1040 bytes apart so that a warp's fragment writes
// (8 rows x 16 bytes) fall in distinct banks; they take the ring's room once both warpgroups' last P V is done.
constexpr int kOutRowBytes = kLatent * 2 + 16;
static_assert(kHG * kOutRowBytes <= kStages * kTileBytes, "the staged rows must fit in the ring");
constexpr float kRescaleSlack = 8.0f;  // P up to 256: exact in bf16's exponent range, fp32 sums far from overflow
// Registers a thread after setmaxnreg, per warpgroup. The CTA starts with kLaunchRegs a thread (ptxas's count under
// __launch_bounds__(384, 1)) and setmaxnreg.inc waits until the pool can give what it asks for: if the consumers took
// more than the producer gave back, the kernel would hang (it did, with 200 / 200 / 112). Warpgroup 0 holds O (128),
// S (32) and P (16) with the softmax's temporaries; warpgroup 1 only O and P. (232 / 184 / 88 against 200 / 200 /
// 104: attention -2%, docs/mla-decode-notes.md finding 19.)
constexpr int kLaunchRegs = 168, kWg0Regs = 232, kWg1Regs = 184, kProducerRegs = 88;
static_assert((kWg0Regs - kLaunchRegs) + (kWg1Regs - kLaunchRegs) <= kLaunchRegs - kProducerRegs,
              "setmaxnreg: the consumer warpgroups would wait forever for registers the producer does not free");
// The persistent kernel's producer walks its items' tiles and rows as well: at 88 registers it spilled 4 bytes.
constexpr int kPersistentWg0Regs = 224, kPersistentProducerRegs = 96;
static_assert((kPersistentWg0Regs - kLaunchRegs) + (kWg1Regs - kLaunchRegs) <= kLaunchRegs - kPersistentProducerRegs,
              "setmaxnreg: the persistent kernel's budget");

// P of a tile in shared memory (64 heads x 64 positions, bf16, 128-byte swizzled rows), as stmatrix / ldmatrix move
// it: pa[2c + h] holds rows frag_row + 8h, columns 8c + frag_col, +1 (the 8x8 matrix (c, h) of this warp's 16 rows);
// call j2 moves matrices (2 j2, 0), (2 j2, 1), (2 j2 + 1, 0), (2 j2 + 1, 1), lane l addressing row l % 8 of matrix
// l / 8: row 16 warp + 8 ((l / 8) % 2) + l % 8, 16-byte chunk 2 j2 + l / 16. The registers are the A fragments of
// O += P V (pa[4j .. 4j+3]: positions 16j ..).
// One split's output rows through shared memory (MlaConfig::bulk_store): warpgroup w writes its 256 columns of the
// CTA's 64 heads, normalised and rounded to bf16, into s_out, then 64 of its threads each copy one head's 512 bytes
// to out [bs][128][512] with a bulk copy. The direct stores (store_rows) send 8 half-filled 32-byte sectors a warp
// instruction, 4096 a CTA, which took 5-10 us at the end of every work item (finding 34).
__device__ __forceinline__ void store_rows_staged(const Params& p, const CtaWork& c, const float* o, int w, int t,
                                                  int frag_row, int frag_col, const float* l, uint8_t* s_out) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = 1.0f / l[h];
    uint8_t* row = s_out + (frag_row + 8 * h) * kOutRowBytes + 512 * w + 2 * frag_col;
#pragma unroll
    for (int col = 0; col < 32; ++col)
      *reinterpret_cast<__nv_bfloat162*>(row + 16 * col) =
          __floats2bfloat162_rn(o[4 * col + 2 * h] * inv, o[4 * col + 2 * h + 1] * inv);
  }
  if (!p.staged_st) fence_proxy_async_smem();  // the bulk copies read s_out through the async proxy
  named_bar_sync(kBarStaged + w, 128);
  if (threadIdx.x == 0) trace_clock(p, 2, 1);  // (dev builds) warpgroup 0's columns staged
  __nv_bfloat16* rows = p.out + (static_cast<long long>(c.b) * kHeads + c.hg * kHG) * kLatent + 256 * w;
  if (p.staged_st) {
    // Each warp writes one head's 512 bytes a step: 16-byte stores, whole 128-byte lines. The CTA need not wait for
    // them to land before it exits (the bulk copies' smem reads are waited for: 2.5-4.9 us, finding 36).
#pragma unroll 4
    for (int k = 0; k < kHG * 32 / 128; ++k) {
      const int chunk = t + 128 * k, head = chunk / 32, col16 = chunk % 32;
      const uint4 v = *reinterpret_cast<const uint4*>(s_out + head * kOutRowBytes + 512 * w + 16 * col16);
      *reinterpret_cast<uint4*>(rows + static_cast<long long>(head) * kLatent + 8 * col16) = v;
    }
  } else if (t < kHG) {
    bulk_store_s2g(rows + static_cast<long long>(t) * kLatent, s_out + t * kOutRowBytes + 512 * w, 512);
    bulk_wait_read();
  }
}

// One warpgroup's 256 output columns of the CTA's 64 heads straight from the accumulator, normalised and rounded to
// bf16 as store_rows_staged does (the same bits), for the persistent kernel, whose ring holds the next item's tiles
// while this one's rows leave. The quad's four lanes hold 8 consecutive columns of a row, 2 each (o[4c + 2h + e]:
// row frag_row + 8h, column 8c + frag_col + e); a 4 x 4 transpose of 32-bit words within the quad (two shuffle
// rounds) gives lane j the 16 bytes of column group c0 + j, so one warp store writes 8 rows x 64 contiguous bytes:
// whole sectors, where the register stores of store_rows (4 bytes a lane) filled half of each (finding 34).
__device__ __forceinline__ void store_rows_direct(const Params& p, const CtaWork& c, const float* o, int w, int lane,
                                                  int frag_row, const float* l) {
  const int j = lane & 3;
  const bool hi2 = j & 2, hi1 = j & 1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = 1.0f / l[h];
    __nv_bfloat16* row = p.out + (static_cast<long long>(c.b) * kHeads + c.hg * kHG + frag_row + 8 * h) * kLatent + 256 * w;
#pragma unroll
    for (int c0 = 0; c0 < 32; c0 += 4) {
      uint32_t m[4];  // this lane's 2 columns of groups c0 .. c0 + 3
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(o[4 * (c0 + k) + 2 * h] * inv, o[4 * (c0 + k) + 2 * h + 1] * inv);
        m[k] = *reinterpret_cast<const uint32_t*>(&v);
      }
      // lanes 0, 1 trade their groups 2, 3 for lanes 2, 3's groups 0, 1
      const uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi2 ? m[0] : m[2], 2);
      const uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi2 ? m[1] : m[3], 2);
      const uint32_t a0 = hi2 ? r0 : m[0], a1 = hi2 ? r1 : m[1], a2 = hi2 ? m[2] : r0, a3 = hi2 ? m[3] : r1;
      // then within each pair of lanes, words 1 and 3 for the partner's 0 and 2
      const uint32_t q0 = __shfl_xor_sync(0xffffffffu, hi1 ? a0 : a1, 1);
      const uint32_t q1 = __shfl_xor_sync(0xffffffffu, hi1 ? a2 : a3, 1);
      const uint4 v = hi1 ? make_uint4(q0, a1, q1, a3) : make_uint4(a0, q0, a2, q1);
      *reinterpret_cast<uint4*>(row + 8 * (c0 + j)) = v;
    }
  }
}

__device__ __forceinline__ uint8_t* p_fragment_row(uint8_t* p_block, int warp, int lane, int j2) {
  return p_block + sw128_offset(warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7), 2 * j2 + (lane >> 4));
}
// kChunks: the 16-position chunks moved (4; 1 for a narrow tile's positions 0 .. 15).
template <int kChunks>
__device__ __forceinline__ void store_p(uint8_t* p_block, int warp, int lane, const uint32_t* pa) {
#pragma unroll
  for (int j2 = 0; j2 < kChunks; ++j2)
    stmatrix_x4(p_fragment_row(p_block, warp, lane, j2), pa[4 * j2], pa[4 * j2 + 1], pa[4 * j2 + 2], pa[4 * j2 + 3]);
}
template <int kChunks>
__device__ __forceinline__ void load_p(uint8_t* p_block, int warp, int lane, uint32_t* pa) {
#pragma unroll
  for (int j2 = 0; j2 < kChunks; ++j2)
    ldmatrix_x4(p_fragment_row(p_block, warp, lane, j2), pa[4 * j2], pa[4 * j2 + 1], pa[4 * j2 + 2], pa[4 * j2 + 3]);
}

// O += P V over 256 output columns: o the m64n256 accumulator, pa P's A fragments (above), v_desc the descriptor of
// the tile's 4 latent blocks for these columns (N-major). Issues kSteps wgmmas (4; 1 for a narrow tile: positions
// 0 .. 15) only: the caller fences and commits.
template <int kSteps>
__device__ __forceinline__ void issue_pv_from_registers(float* o, const uint32_t* pa, uint64_t v_desc) {
#pragma unroll
  for (int q = 0; q < kSteps; ++q) wgmma_m64n256k16_rs_bf16<1>(o, pa + 4 * q, v_desc + (2048 >> 4) * q, 1);
}

// The online softmax of one tile (log2 domain) over an m64n64 S accumulator: sc[4c + 2h + e] = head frag_row + 8h,
// position 8c + frag_col + e of the tile. m_run, l_run: the running row maxima and this thread's share of the row
// sums (its 16 positions a tile), updated; alpha: the factors O and the sums are rescaled by (1 where they did not
// move); pa: P as bf16 pairs, pa[4j .. 4j+3] the A fragment of positions 16j .. 16j+15. Returns whether this warp's
// rows moved their maxima (one decision per warp, so that an O rescale is skipped or done by whole warps).
// kGroups: the groups of 8 positions S holds (8; 2 for a narrow tile, whose accumulator is m64n16: sc[0 .. 7] and
// pa[0 .. 3] only).
template <int kGroups>
__device__ __forceinline__ bool softmax_tile(float* sc, int tile, int kv_len, float scale_log2, int frag_col,
                                             float* m_run, float* l_run, float* alpha, uint32_t* pa) {
  if (tile * kTile + 8 * kGroups > kv_len) {  // the split's last tile: positions past the cache do not count
#pragma unroll
    for (int c = 0; c < kGroups; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (tile * kTile + 8 * c + frag_col + (j & 1) >= kv_len) sc[4 * c + j] = -INFINITY;
  }
  float m_new[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < kGroups; ++c) mx = fmaxf(mx, fmaxf(sc[4 * c + 2 * h], sc[4 * c + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    m_new[h] = fmaxf(m_run[h], mx * scale_log2);  // scale_log2 > 0: the maximum commutes with it
  }
  const bool rescale =
      __any_sync(0xffffffff, m_new[0] > m_run[0] + kRescaleSlack || m_new[1] > m_run[1] + kRescaleSlack);
  alpha[0] = alpha[1] = 1.0f;
  if (rescale) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      alpha[h] = ex2_approx(m_run[h] - m_new[h]);
      m_run[h] = m_new[h];
      l_run[h] *= alpha[h];
    }
  }
#pragma unroll
  for (int c = 0; c < kGroups; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = ex2_approx(fmaf(sc[4 * c + 2 * h], scale_log2, -m_run[h]));
      const float p1 = ex2_approx(fmaf(sc[4 * c + 2 * h + 1], scale_log2, -m_run[h]));
      l_run[h] += p0 + p1;
      const __nv_bfloat162 pair = __floats2bfloat162_rn(p0, p1);
      pa[2 * c + h] = *reinterpret_cast<const uint32_t*>(&pair);
    }
  return rescale;
}

// Rotator u's items of one tile (rows past the cache left alone), in the tile's rope block: all of this thread's
// shared-memory reads first, then the arithmetic, then the writes: one round trip through shared memory, which the
// consumers' wgmma operand reads keep busy (a rotation item after item took ~2400 cycles a tile, on the tile's
// critical path: finding 17). tab: the cos/sin of the items.
__device__ __forceinline__ void rotate_items(int u, int tile, int kv_len, const Params& p, uint8_t* rope_block,
                                             const RopeTables* tab) {
  RopePair x[kItemsPerRotator];
  bool mine[kItemsPerRotator];
#pragma unroll
  for (int k = 0; k < kItemsPerRotator; ++k) {
    const int item = u + kRotators * k;
    mine[k] = item < kRopeItems && tile * kTile + item / 4 < kv_len && !dev_skips(p).rope;
    if (mine[k]) x[k] = load_rope_pair(rope_block, item / 4, item % 4);
  }
#pragma unroll
  for (int k = 0; k < kItemsPerRotator; ++k) {
    const int item = u + kRotators * k;
    if (mine[k]) store_rope_pair(rope_block, item / 4, item % 4, rotate_pair(x[k], tab[k]));
  }
  fence_proxy_async_smem();  // the consumers' wgmma reads the block (the async proxy)
}

// Rotator u's cos/sin for its items of a tile.
__device__ __forceinline__ void load_item_tables(int u, int tile, int kv_len, const Params& p, RopeTables* tab) {
#pragma unroll
  for (int k = 0; k < kItemsPerRotator; ++k) {
    const int item = u + kRotators * k, pos = tile * kTile + item / 4;
    if (item < kRopeItems && pos < kv_len) tab[k] = load_rope_tables(pos, item % 4, p);
  }
}

// The producer warpgroup's warps 1-3 (rotator u of kRotators): each landed tile's rope block (full[s]) rotated in
// place, then an arrive on roped[s]. Rotator u takes items u, u + 96, u + 192 of a tile; item i = (row i / 4,
// frequencies 8 (i % 4) ..). The cos/sin of the next tile's items are loaded while this tile waits and rotates.
// s, phase: the ring's position, carried from one work item to the next by the persistent kernel.
__device__ __forceinline__ void rotate_tiles(int u, const CtaWork& work, const Params& p, uint8_t* s_kv, uint64_t* full,
                                             uint64_t* roped, int& s, uint32_t& phase) {
  const int kv_len = work.kv_len, tile0 = work.tile0, tile1 = work.tile1;
  RopeTables tab[kItemsPerRotator];
  if (tile0 < tile1) load_item_tables(u, tile0, kv_len, p, tab);
  for (int tile = tile0; tile < tile1; ++tile) {
    if (u == 0) trace_stamp(p, kTraceRotator, tile - tile0, 0);
    mbar_wait(&full[s], phase);
    if (u == 0) trace_stamp(p, kTraceRotator, tile - tile0, 1);
    rotate_items(u, tile, kv_len, p, s_kv + s * kTileBytes + 8 * kBlockBytes, tab);
    mbar_arrive(&roped[s]);
    if (u == 0) trace_stamp(p, kTraceRotator, tile - tile0, 2);
    if (tile + 1 < tile1) load_item_tables(u, tile + 1, kv_len, p, tab);
    ring_next(s, phase, kStages);
  }
}
__device__ __forceinline__ void rotate_tiles(int u, const CtaWork& work, const Params& p, uint8_t* s_kv, uint64_t* full,
                                             uint64_t* roped) {
  int s = 0;
  uint32_t phase = 0;
  rotate_tiles(u, work, p, s_kv, full, roped, s, phase);
}

// The persistent kernel's producer thread (MlaConfig::persistent): the CTA's work items one after the other through
// one ring, so that the next item's first tiles load while this item's last ones are worked on. An item's Q goes
// behind its first tile, once warpgroup 0 has read the previous Q for the last time (q_free: its last S landed).
// hi_full, hi_empty (MlaConfig::split_release; non-null with rope_landed only): each stage loaded in two halves, the
// rope block and latent blocks 0-3 once warpgroup 0 has released the stage (empty), blocks 4-7 on hi_full once
// warpgroup 1 has (hi_empty).
__device__ __forceinline__ void load_items(const CUtensorMap* tm_q, const CUtensorMap* tm_kv, uint8_t* s_q,
                                           uint8_t* s_kv, uint64_t* q_full, uint64_t* q_free, uint64_t* full,
                                           uint64_t* empty, uint64_t* rope_landed, const Params& p, int items,
                                           const CUtensorMap* tm_tail, uint64_t* hi_full = nullptr,
                                           uint64_t* hi_empty = nullptr) {
  tma_prefetch_desc(tm_q);
  tma_prefetch_desc(tm_kv);
  if (tm_tail) tma_prefetch_desc(tm_tail);
  int s = 0;
  uint32_t phase = 0;
  for (int item = blockIdx.x, k = 0; item < items; item += gridDim.x, ++k) {
    const CtaWork c = cta_work(p, item);
    if (k == 0) load_q(tm_q, s_q, q_full, c);
    for (int tile = c.tile0; tile < c.tile1; ++tile) {
      mbar_wait(&empty[s], phase ^ 1);
      if (hi_full) {
        load_tile<0, 4>(tm_kv, s_kv, full, rope_landed, s, c, tile, p.max_seq, tm_tail);
        mbar_wait(&hi_empty[s], phase ^ 1);
        load_tile<4, 8>(tm_kv, s_kv, hi_full, nullptr, s, c, tile, p.max_seq, tm_tail);
      } else {
        load_tile(tm_kv, s_kv, full, rope_landed, s, c, tile, p.max_seq, tm_tail);
      }
      if (k > 0 && tile == c.tile0) {
        mbar_wait(q_free, (k - 1) & 1);
        load_q(tm_q, s_q, q_full, c);
      }
      ring_next(s, phase, kStages);
    }
  }
}

// Both s-once kernels' shared memory: Q, the ring, P and the rescale factors, the final row statistics, barriers.
struct SOnceSmem {
  uint8_t* q;        // Q [64 heads][576], 9 swizzled blocks
  uint8_t* kv;       // the ring's kStages tiles
  uint8_t* p;        // P [64 heads][64 positions] bf16, swizzled rows
  float* alpha;      // [64] this tile's rescale factors
  float* m;          // [64] final row maxima (log2 domain)
  float* l;          // [64] final row sums
  int* rescale;      // [4] per warp: this tile moved its rows' maxima
  uint64_t* q_full;  // Q landed
  uint64_t* full;    // [kStages] TMA landed (kRopeFirst: the rope block landed)
  uint64_t* roped;   // [kStages] ... and the rope columns rotated (kRopeFirst: and the latent blocks landed)
  uint64_t* empty;   // [kStages] both consumer warpgroups done with the stage
  uint64_t* q_free;  // the persistent kernel: warpgroup 0's last S of an item landed, Q may be replaced
  uint64_t* hi_full;   // [kStages] split_release: latent blocks 4-7 landed (roped then counts blocks 0-3 only)
  uint64_t* hi_empty;  // [kStages] split_release: warpgroup 1 done with blocks 4-7 (empty: warpgroup 0 with the rest)
};

// The layout in the dynamic allocation (tiles 1024-byte aligned), and (thread 0) the barriers initialised.
template <bool kRopeFirst, bool kSplit = false>
__device__ __forceinline__ SOnceSmem s_once_smem(uint8_t* smem_raw, const Params& p, bool persistent) {
  SOnceSmem m;
  m.q = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  m.kv = m.q + kTileBytes;
  m.p = m.kv + kStages * kTileBytes;
  m.alpha = reinterpret_cast<float*>(m.p + kBlockBytes);
  m.m = m.alpha + kHG;
  m.l = m.m + kHG;
  m.rescale = reinterpret_cast<int*>(m.l + kHG);
  m.q_full = reinterpret_cast<uint64_t*>(m.rescale + 4);
  m.full = m.q_full + 1;
  m.roped = m.full + kStages;
  m.empty = m.roped + kStages;
  m.q_free = m.empty + kStages;
  m.hi_full = m.q_free + 1;
  m.hi_empty = m.hi_full + kStages;
  if (threadIdx.x == 0) {
    trace_clock(p, 4);  // (dev builds) the CTA's entry
    mbar_init(m.q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&m.full[s], 1);
      mbar_init(&m.roped[s], kRotators + (kRopeFirst ? 1 : 0));
      mbar_init(&m.empty[s], kSplit ? 4 : 8);  // one arrive per consumer warp (split: warpgroup 0's)
      mbar_init(&m.hi_full[s], 1);
      mbar_init(&m.hi_empty[s], 4);
    }
    if (persistent) mbar_init(m.q_free, 4);  // one arrive per warp of warpgroup 0
    fence_mbar_init();
  }
  __syncthreads();
  return m;
}

// A consumer thread's place: its warpgroup w (output columns 256w .. 256w + 255), its thread t in it, and the
// accumulator rows (heads frag_row, frag_row + 8 of the CTA's 64) and column pair (frag_col) it holds.
struct Consumer {
  int w, t, warp, lane, frag_row, frag_col;
};
__device__ __forceinline__ Consumer consumer() {
  Consumer c;
  c.w = threadIdx.x / 128;
  c.t = threadIdx.x % 128;
  c.warp = c.t / 32;
  c.lane = c.t % 32;
  c.frag_row = c.warp * 16 + c.lane / 4;
  c.frag_col = 2 * (c.lane % 4);
  return c;
}

// After a warpgroup's last read of stage s (its P V waited for): hand the stage back to the producer, go to the next.
__device__ __forceinline__ void release_stage(float* o, int lane, uint64_t* empty, int& s, uint32_t& phase) {
#pragma unroll
  for (int j = 0; j < 128; ++j) reg_fence(o[j]);
  __syncwarp();
  if (lane == 0) mbar_arrive(&empty[s]);
  ring_next(s, phase, kStages);
}

// Warpgroup 0's tile i (cache tile `tile`, in stage s): waits until it is ready, S = Q K^T over its 64 positions (Q
// and K read once), the softmax, P and the rescale factors handed to warpgroup 1 once it has read the previous
// tile's, its own O += P V over columns 0 .. 255, the stage released. sc, pa: S's accumulator and P's A fragments
// (pa[4j .. 4j+3]: positions 16j .. 16j+15). q_free: non-null on an item's last tile in the persistent kernel, whose
// producer may then load the next item's Q. kNarrow: the tile is narrow (narrow_tile): positions 0 .. 15 only.
template <bool kNarrow, bool kSplit>
__device__ __forceinline__ void wg0_tile(const Params& p, const SOnceSmem& sm, const Consumer& c, int i, int tile,
                                         int kv_len, uint64_t* q_free, float* o, float* sc, uint32_t* pa,
                                         float* m_run, float* l_run, int& s, uint32_t& phase) {
  const int t = c.t, warp = c.warp, lane = c.lane, frag_row = c.frag_row;
  uint8_t* kv = sm.kv + s * kTileBytes;
  if (t == 0) trace_stamp(p, kTraceWg0, i, 0);
  mbar_wait(&sm.roped[s], phase);
  if (t == 0) trace_stamp(p, kTraceWg0, i, 1);
  if (dev_skips(p).math) {  // (dev builds, timing only) the stage waited for and released, P's barriers kept in step
    if (kSplit) mbar_wait(&sm.hi_full[s], phase);
    if (q_free) {
      __syncwarp();
      if (lane == 0) mbar_arrive(q_free);
    }
    named_bar_sync(kBarPFree, 256);
    named_bar_arrive(kBarPReady, 256);
    release_stage(o, lane, sm.empty, s, phase);
    return;
  }
  wgmma_fence();
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    if (kSplit && blk == 4) {  // blocks 4-7 land on their own barrier (split_release); S's order stays 0 .. 8
      mbar_wait(&sm.hi_full[s], phase);
      wgmma_fence();
    }
    const uint64_t da = make_desc_sw128(sm.q + blk * kBlockBytes);
    const uint64_t db = make_desc_sw128(kv + blk * kBlockBytes);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (kNarrow)
        wgmma_m64n16k16_bf16<0>(sc, da + 2 * q, db + 2 * q, blk > 0 || q > 0);
      else
        wgmma_m64n64k16_bf16<0>(sc, da + 2 * q, db + 2 * q, blk > 0 || q > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  constexpr int kGroups = kNarrow ? kTailRows / 8 : kTile / 8, kChunks = kGroups / 2;
#pragma unroll
  for (int j = 0; j < 4 * kGroups; ++j) reg_fence(sc[j]);
  if (t == 0) trace_stamp(p, kTraceWg0, i, 2);
  if (q_free) {  // this item's Q is read for the last time: the next one may land
    __syncwarp();
    if (lane == 0) mbar_arrive(q_free);
  }

  float alpha[2];
  const bool rescale = softmax_tile<kGroups>(sc, tile, kv_len, p.scale_log2, c.frag_col, m_run, l_run, alpha, pa);
  if (t == 0) trace_stamp(p, kTraceWg0, i, 3);
  named_bar_sync(kBarPFree, 256);
  if (t == 0) trace_stamp(p, kTraceWg0, i, 4);
  store_p<kChunks>(sm.p, warp, lane, pa);
  if ((lane & 3) == 0) {
    sm.alpha[frag_row] = alpha[0];
    sm.alpha[frag_row + 8] = alpha[1];
  }
  if (lane == 0) sm.rescale[warp] = rescale;
  // Warpgroup 1 reads P with ldmatrix (the generic proxy, like these writes): the named barrier orders them, no proxy
  // fence on this path.
  named_bar_arrive(kBarPReady, 256);
  if (rescale) {
#pragma unroll
    for (int j = 0; j < 128; ++j) o[j] *= alpha[(j >> 1) & 1];
  }
  // O += P V, columns 0 .. 255 (blocks 0 .. 3), P from registers.
  const uint64_t db = make_desc_sw128(kv, kBlockBytes, 1024);
  if (t == 0) trace_stamp(p, kTraceWg0, i, 5);
  wgmma_fence();
  issue_pv_from_registers<kChunks>(o, pa, db);
  wgmma_commit();
  wgmma_wait<0>();
  if (t == 0) trace_stamp(p, kTraceWg0, i, 6);
  release_stage(o, lane, sm.empty, s, phase);
}

// Warpgroup 1's tile i of an item of ntiles (in stage s): waits for P, reads it and the rescale factors into
// registers (ldmatrix) and frees the buffer (but after the item's last tile: the next item's start frees it), then O
// += P V over columns 256 .. 511 and the stage released. kNarrow: as wg0_tile's.
template <bool kNarrow, bool kSplit>
__device__ __forceinline__ void wg1_tile(const Params& p, const SOnceSmem& sm, const Consumer& c, int i, int ntiles,
                                         float* o, int& s, uint32_t& phase) {
  const int t = c.t, warp = c.warp, lane = c.lane, frag_row = c.frag_row;
  uint8_t* kv = sm.kv + s * kTileBytes;
  if (t == 0) trace_stamp(p, kTraceWg1, i, 0);
  mbar_wait(&sm.roped[s], phase);
  if (kSplit) mbar_wait(&sm.hi_full[s], phase);
  if (t == 0) trace_stamp(p, kTraceWg1, i, 1);
  named_bar_sync(kBarPReady, 256);
  if (t == 0) trace_stamp(p, kTraceWg1, i, 2);
  constexpr int kChunks = kNarrow ? kTailRows / 16 : kTile / 16;
  uint32_t pb[16];
  load_p<kChunks>(sm.p, warp, lane, pb);
  const bool rescale = sm.rescale[warp];  // warpgroup 0's warp of the same 16 rows moved their maxima
  const float alpha0 = sm.alpha[frag_row], alpha1 = sm.alpha[frag_row + 8];
  if (i + 1 < ntiles) named_bar_arrive(kBarPFree, 256);
  if (dev_skips(p).math) {  // (dev builds, timing only)
    release_stage(o, lane, kSplit ? sm.hi_empty : sm.empty, s, phase);
    return;
  }
  if (rescale) {
#pragma unroll
    for (int j = 0; j < 128; ++j) o[j] *= (j >> 1) & 1 ? alpha1 : alpha0;
  }
  // O += P V, columns 256 .. 511 (blocks 4 .. 7), P from registers.
  const uint64_t db = make_desc_sw128(kv + 4 * kBlockBytes, kBlockBytes, 1024);
  wgmma_fence();
  issue_pv_from_registers<kChunks>(o, pb, db);
  wgmma_commit();
  wgmma_wait<0>();
  if (t == 0) trace_stamp(p, kTraceWg1, i, 3);
  release_stage(o, lane, kSplit ? sm.hi_empty : sm.empty, s, phase);
}

// A work item's tile count, how many of them are wide, and whether its last one is narrow (narrow_tile).
struct ItemTiles {
  int count, wide;
  bool narrow_last;
};
__device__ __forceinline__ ItemTiles item_tiles(const Params& p, const CtaWork& work) {
  ItemTiles t;
  t.count = work.tile1 - work.tile0;
  t.narrow_last = t.count > 0 && narrow_tile(p, work.kv_len, work.tile1 - 1);
  t.wide = t.count - (t.narrow_last ? 1 : 0);
  return t;
}

// A work item's tiles in warpgroup 0: the wide ones, then the narrow last one where narrow_tile says so (with S and
// P arrays of its own: reusing the wide tiles' made ptxas serialize the kernel's wgmmas, C7511). q_free: as
// wg0_tile's, given with the item's last tile.
template <bool kSplit = false>
__device__ __forceinline__ void wg0_item(const Params& p, const SOnceSmem& sm, const Consumer& c, const CtaWork& work,
                                         uint64_t* q_free, float* o, float* sc, uint32_t* pa, float* m_run,
                                         float* l_run, int& s, uint32_t& phase) {
  const ItemTiles t = item_tiles(p, work);
  for (int i = 0; i < t.wide; ++i)
    wg0_tile<false, kSplit>(p, sm, c, i, work.tile0 + i, work.kv_len, i == t.count - 1 ? q_free : nullptr, o, sc,
                            pa, m_run, l_run, s, phase);
  if (t.narrow_last) {
    float sn[4 * kTailRows / 8];
    uint32_t pn[kTailRows / 4];
    wg0_tile<true, kSplit>(p, sm, c, t.wide, work.tile1 - 1, work.kv_len, q_free, o, sn, pn, m_run, l_run, s,
                           phase);
  }
}

// The same item's tiles in warpgroup 1.
template <bool kSplit = false>
__device__ __forceinline__ void wg1_item(const Params& p, const SOnceSmem& sm, const Consumer& c, const CtaWork& work,
                                         float* o, int& s, uint32_t& phase) {
  const ItemTiles t = item_tiles(p, work);
  for (int i = 0; i < t.wide; ++i) wg1_tile<false, kSplit>(p, sm, c, i, t.count, o, s, phase);
  if (t.narrow_last) wg1_tile<true, kSplit>(p, sm, c, t.wide, t.count, o, s, phase);
}

// An item's end in both warpgroups: the final row maxima and sums from warpgroup 0 (m_run, l_run: its running
// state) to both, read back as m_row, l_row for heads frag_row and frag_row + 8.
__device__ __forceinline__ void share_row_stats(const Params& p, const SOnceSmem& sm, const Consumer& c,
                                                float* m_run, float* l_run, float* m_row, float* l_row) {
  if (c.w == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 1);
      l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 2);
      if ((c.lane & 3) == 0) {
        sm.m[c.frag_row + 8 * h] = m_run[h];
        sm.l[c.frag_row + 8 * h] = l_run[h];
      }
    }
  }
  named_bar_sync(kBarRows, 256);
  if (threadIdx.x == 0) trace_clock(p, 0, 1);  // (dev builds) warpgroup 1's last P V done, the sums shared
  m_row[0] = sm.m[c.frag_row];
  m_row[1] = sm.m[c.frag_row + 8];
  l_row[0] = sm.l[c.frag_row];
  l_row[1] = sm.l[c.frag_row + 8];
}

// The cache's maps the loading thread reads: a moving graph's in device memory (written by its first kernel, which
// this one follows), acquired by the tensormap proxy, or the kernel's own parameters.
struct CacheMaps {
  const CUtensorMap* kv;
  const CUtensorMap* tail;
};
__device__ __forceinline__ CacheMaps cache_maps(const Params& p, const CUtensorMap* tm_kv, const CUtensorMap* tm_tail) {
  if (!p.bound_kv) return {tm_kv, tm_tail};
  kb::tensormap_acquire(p.bound_kv);
  kb::tensormap_acquire(p.bound_tail);
  return {p.bound_kv, p.bound_tail};
}

template <bool kRopeFirst>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_s_once_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                                           const __grid_constant__ CUtensorMap tm_kv,
                                                                           const __grid_constant__ CUtensorMap tm_tail,
                                                                           const Params p) {
  extern __shared__ uint8_t smem_raw[];
  const CtaWork work = cta_work(p);
  const SOnceSmem sm = s_once_smem<kRopeFirst>(smem_raw, p, false);

  if (threadIdx.x >= 256) {  // producer warpgroup: warp 0 loads, warps 1-3 rotate
    setmaxnreg_dec<kProducerRegs>();
    const int pt = threadIdx.x - 256;
    if (pt == 0) {
      const CacheMaps maps = cache_maps(p, &tm_kv, &tm_tail);
      load_q_and_tiles(&tm_q, maps.kv, sm.q, sm.kv, sm.q_full, kRopeFirst ? sm.roped : sm.full, sm.empty, work,
                       p.max_seq, kRopeFirst ? sm.full : nullptr, &p, p.narrow_tail ? maps.tail : nullptr);
    } else if (pt >= 32) {
      rotate_tiles(pt - 32, work, p, sm.kv, sm.full, sm.roped);
    }
    return;
  }

  const Consumer c = consumer();
  const int ntiles = work.tile1 - work.tile0;

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  // Warpgroup 0's softmax state. m_run: the row maxima (log2 domain); l_run: this thread's share of the row sums
  // (its 16 positions of each tile), summed across the quad once at the end.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  // One loop per warpgroup (their work differs; a shared loop branches around every wgmma).
  int s = 0;
  uint32_t phase = 0;
  if (c.w == 0) {
    setmaxnreg_inc<kWg0Regs>();
    uint32_t pa[16];
    float sc[32];
    mbar_wait(sm.q_full, 0);
    if (c.t == 0) trace_clock(p, 0);
    wg0_item(p, sm, c, work, nullptr, o, sc, pa, m_run, l_run, s, phase);
    if (c.t == 0) trace_clock(p, 2);
  } else {
    setmaxnreg_inc<kWg1Regs>();
    if (ntiles > 0) named_bar_arrive(kBarPFree, 256);  // the P buffer starts free
    wg1_item(p, sm, c, work, o, s, phase);
  }

  float m_row[2], l_row[2];
  share_row_stats(p, sm, c, m_run, l_run, m_row, l_row);
  // Both warpgroups' last P V is done (kBarRows), so the ring's stages are free for the staged rows.
  if (p.bulk_store)
    store_rows_staged(p, work, o, c.w, c.t, c.frag_row, c.frag_col, l_row, sm.kv);
  else
    store_rows(p, work, o, c.w, c.frag_row, c.frag_col, m_row, l_row, c.w == 0 && (c.lane & 3) == 0);
  if (threadIdx.x == 0) trace_clock(p, 6);  // (dev builds) its rows stored (issued; bulk: read from shared memory)
}

// The persistent s-once kernel (MlaConfig::persistent, one split only; a candidate, docs/mla-decode-notes.md finding
// 37): gridDim.x CTAs (one an SM) each walk the work items blockIdx.x, blockIdx.x + gridDim.x, ... with the ring and
// its barriers carried across items, the next item's first tiles loading under this one's last, and write each
// item's rows straight from registers (store_rows_direct). The same per-tile steps as the kernel above.
// kSplit (with kRopeFirst): MlaConfig::split_release.
template <bool kRopeFirst, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_s_once_persistent_kernel(
    const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
    const __grid_constant__ CUtensorMap tm_tail, const Params p) {
  extern __shared__ uint8_t smem_raw[];
  static_assert(kRopeFirst || !kSplit, "split_release loads the rope block first");
  const SOnceSmem sm = s_once_smem<kRopeFirst, kSplit>(smem_raw, p, true);
  const int items = kHeadGroups * p.bs;  // work items (b, hg); this CTA takes blockIdx.x and every gridDim.x-th after

  if (threadIdx.x >= 256) {  // producer warpgroup: warp 0 loads, warps 1-3 rotate
    setmaxnreg_dec<kPersistentProducerRegs>();
    const int pt = threadIdx.x - 256;
    if (pt == 0) {
      const CacheMaps maps = cache_maps(p, &tm_kv, &tm_tail);
      load_items(&tm_q, maps.kv, sm.q, sm.kv, sm.q_full, sm.q_free, kRopeFirst ? sm.roped : sm.full, sm.empty,
                 kRopeFirst ? sm.full : nullptr, p, items, p.narrow_tail ? maps.tail : nullptr,
                 kSplit ? sm.hi_full : nullptr, kSplit ? sm.hi_empty : nullptr);
    } else if (pt >= 32) {
      int s = 0;
      uint32_t phase = 0;
      for (int item = blockIdx.x; item < items; item += gridDim.x)
        rotate_tiles(pt - 32, cta_work(p, item), p, sm.kv, sm.full, sm.roped, s, phase);
    }
    return;
  }

  const Consumer c = consumer();
  float o[128];
  float m_run[2], l_run[2];  // warpgroup 0's softmax state, as in the kernel above
  int s = 0;
  uint32_t phase = 0;
  // An item's start: O and the softmax state cleared.
  auto start_item = [&]() {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
  };
  // An item's end, in both warpgroups. (Warpgroup 1 reads the row sums right after the barrier, before its next
  // item's first P, which warpgroup 0 publishes only after writing them again.)
  auto finish_item = [&](const CtaWork& work) {
    float m_row[2], l_row[2];
    share_row_stats(p, sm, c, m_run, l_run, m_row, l_row);
    store_rows_direct(p, work, o, c.w, c.lane, c.frag_row, l_row);
  };

  // Each warpgroup's own item loop (setmaxnreg sets a register budget per branch; a loop shared past the branches'
  // merge would be compiled under the smaller one).
  if (c.w == 0) {
    setmaxnreg_inc<kPersistentWg0Regs>();
    for (int item = blockIdx.x, k = 0; item < items; item += gridDim.x, ++k) {
      const CtaWork work = cta_work(p, item);
      start_item();
      uint32_t pa[16];
      float sc[32];
      mbar_wait(sm.q_full, k & 1);
      if (c.t == 0) trace_clock(p, 0);
      wg0_item<kSplit>(p, sm, c, work, sm.q_free, o, sc, pa, m_run, l_run, s, phase);
      if (c.t == 0) trace_clock(p, 2);
      finish_item(work);
    }
  } else {
    setmaxnreg_inc<kWg1Regs>();
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const CtaWork work = cta_work(p, item);
      const int ntiles = work.tile1 - work.tile0;
      start_item();
      if (ntiles > 0) named_bar_arrive(kBarPFree, 256);  // the P buffer starts free
      wg1_item<kSplit>(p, sm, c, work, o, s, phase);
      finish_item(work);
    }
  }
}

}  // namespace mla
