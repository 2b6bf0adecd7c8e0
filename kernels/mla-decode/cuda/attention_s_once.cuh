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
// Shared memory: Q, the ring, P, then s_alpha [64], s_m [2][64], s_l [2][64] (by piece parity), s_rescale [4],
// s_last (+ padding), and the barriers q_full, q_free, full/roped/empty [kStages].
constexpr int kSOnceSmemBytes =
    1024 + kTileBytes * (1 + kStages) + kBlockBytes + 5 * kHG * 4 + 16 + 16 + 8 * (2 + 3 * kStages);
// Named barriers between the consumer warpgroups (256 threads: one side syncs, the other arrives).
constexpr int kBarPReady = 5;  // P and the rescale factors of the current tile are in shared memory
constexpr int kBarPFree = 6;   // warpgroup 1 has read them (its P V done): warpgroup 0 may write the next
constexpr int kBarRows = 7;    // the final row maxima and sums are in shared memory
constexpr int kBarPart = 8;    // balanced schedule: a partial piece written (then: whether this CTA combines it)
constexpr float kRescaleSlack = 8.0f;  // P up to 256: exact in bf16's exponent range, fp32 sums far from overflow
// Registers a thread after setmaxnreg, per warpgroup. The CTA starts with kLaunchRegs a thread (ptxas's count under
// __launch_bounds__(384, 1)) and setmaxnreg.inc waits until the pool can give what it asks for: if the consumers took
// more than the producer gave back, the kernel would hang (it did, with 200 / 200 / 112). Warpgroup 0 holds O (128),
// S (32) and P (16) with the softmax's temporaries; warpgroup 1 only O and P. (232 / 184 / 88 against 200 / 200 /
// 104: attention -2%, docs/mla-decode-notes.md finding 19.)
constexpr int kLaunchRegs = 168, kWg0Regs = 232, kWg1Regs = 184, kProducerRegs = 88;
static_assert((kWg0Regs - kLaunchRegs) + (kWg1Regs - kLaunchRegs) <= kLaunchRegs - kProducerRegs,
              "setmaxnreg: the consumer warpgroups would wait forever for registers the producer does not free");

// P of a tile in shared memory (64 heads x 64 positions, bf16, 128-byte swizzled rows), as stmatrix / ldmatrix move
// it: pa[2c + h] holds rows frag_row + 8h, columns 8c + frag_col, +1 (the 8x8 matrix (c, h) of this warp's 16 rows);
// call j2 moves matrices (2 j2, 0), (2 j2, 1), (2 j2 + 1, 0), (2 j2 + 1, 1), lane l addressing row l % 8 of matrix
// l / 8: row 16 warp + 8 ((l / 8) % 2) + l % 8, 16-byte chunk 2 j2 + l / 16. The registers are the A fragments of
// O += P V (pa[4j .. 4j+3]: positions 16j ..).
__device__ __forceinline__ uint8_t* p_fragment_row(uint8_t* p_block, int warp, int lane, int j2) {
  return p_block + sw128_offset(warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7), 2 * j2 + (lane >> 4));
}
__device__ __forceinline__ void store_p(uint8_t* p_block, int warp, int lane, const uint32_t* pa) {
#pragma unroll
  for (int j2 = 0; j2 < 4; ++j2)
    stmatrix_x4(p_fragment_row(p_block, warp, lane, j2), pa[4 * j2], pa[4 * j2 + 1], pa[4 * j2 + 2], pa[4 * j2 + 3]);
}
__device__ __forceinline__ void load_p(uint8_t* p_block, int warp, int lane, uint32_t* pa) {
#pragma unroll
  for (int j2 = 0; j2 < 4; ++j2)
    ldmatrix_x4(p_fragment_row(p_block, warp, lane, j2), pa[4 * j2], pa[4 * j2 + 1], pa[4 * j2 + 2], pa[4 * j2 + 3]);
}

// O += P V over 256 output columns: o the m64n256 accumulator, pa P's A fragments (above), v_desc the descriptor of
// the tile's 4 latent blocks for these columns (N-major). Issues the 4 wgmmas only: the caller fences and commits.
__device__ __forceinline__ void issue_pv_from_registers(float* o, const uint32_t* pa, uint64_t v_desc) {
#pragma unroll
  for (int q = 0; q < 4; ++q) wgmma_m64n256k16_rs_bf16<1>(o, pa + 4 * q, v_desc + (2048 >> 4) * q, 1);
}

// The online softmax of one tile (log2 domain) over an m64n64 S accumulator: sc[4c + 2h + e] = head frag_row + 8h,
// position 8c + frag_col + e of the tile. m_run, l_run: the running row maxima and this thread's share of the row
// sums (its 16 positions a tile), updated; alpha: the factors O and the sums are rescaled by (1 where they did not
// move); pa: P as bf16 pairs, pa[4j .. 4j+3] the A fragment of positions 16j .. 16j+15. Returns whether this warp's
// rows moved their maxima (one decision per warp, so that an O rescale is skipped or done by whole warps).
__device__ __forceinline__ bool softmax_tile(float* sc, int tile, int kv_len, float scale_log2, int frag_col,
                                             float* m_run, float* l_run, float* alpha, uint32_t* pa) {
  if (tile * kTile + kTile > kv_len) {  // the split's last tile: positions past the cache do not count
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (tile * kTile + 8 * c + frag_col + (j & 1) >= kv_len) sc[4 * c + j] = -INFINITY;
  }
  float m_new[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 8; ++c) mx = fmaxf(mx, fmaxf(sc[4 * c + 2 * h], sc[4 * c + 2 * h + 1]));
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
  for (int c = 0; c < 8; ++c)
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
    mine[k] = item < kRopeItems && tile * kTile + item / 4 < kv_len && !rope_skipped(p);
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

// The CTA's tiles as one range of "global tiles" g = b * nt + tile of its head group hg (nt = the tiles of one batch
// row); an "item" is a (batch row, head group), 2 b + hg. Without kBalanced: the one item (or split of it) cta_work
// names. With kBalanced (MlaConfig::balanced) the CTAs go in pairs, 2k for head group 0 and 2k + 1 for head group 1,
// and pair k takes the k-th of gridDim.x / 2 equal runs of the bs nt tiles: a CTA walks several batch rows
// ("pieces": a row's tiles within the run), a row may be shared by consecutive pairs, whose partial outputs the
// last CTA to finish combines, and no CTA waits for a second wave. The two CTAs of a pair read the same cache rows
// at about the same time, so the second finds them in L2 (a first version walked the items 2b, 2b + 1 one after the
// other in one CTA: the cache was read twice from DRAM, and the kernel took 1.8x as long; finding 29).
struct TileRange {
  int kv_len, nt, hg, g0, g1, per;  // per: tiles a pair (kBalanced)
};

// A walk over a TileRange that divides once, not once a tile (warpgroup 0's softmax path is issue-bound: a division
// and a remainder a tile in each role cost the shipped kernel ~3%, finding 29): global tile g, its batch row b
// and its tile within the row. Without kBalanced the range is one piece of one row: no wrap to test.
template <bool kBalanced>
struct TileCursor {
  int g, b, tile;
  __device__ __forceinline__ explicit TileCursor(const TileRange& r) : g(r.g0), b(r.g0 / r.nt), tile(r.g0 % r.nt) {}
  __device__ __forceinline__ bool starts(const TileRange& r) const { return g == r.g0 || (kBalanced && tile == 0); }
  __device__ __forceinline__ bool ends(const TileRange& r) const {
    return g + 1 == r.g1 || (kBalanced && tile + 1 == r.nt);
  }
  __device__ __forceinline__ void next(const TileRange& r) {
    ++g;
    if (++tile == r.nt && kBalanced) tile = 0, ++b;
  }
};

template <bool kBalanced>
__device__ __forceinline__ TileRange cta_tiles(const Params& p, const CtaWork& work) {
  TileRange r;
  r.kv_len = work.kv_len;
  r.nt = (work.kv_len + kTile - 1) / kTile;
  if constexpr (kBalanced) {
    const int total = p.bs * r.nt, pairs = gridDim.x / 2, k = blockIdx.x / 2;
    r.hg = blockIdx.x & 1;
    // whole rows: no row shared between pairs (no partials, no combine), at the cost of the balance
    r.per = p.balance_whole_rows ? (p.bs + pairs - 1) / pairs * r.nt : (total + pairs - 1) / pairs;
    r.g0 = k < pairs ? min(total, k * r.per) : total;
    r.g1 = min(total, r.g0 + r.per);
  } else {
    r.hg = work.hg;
    r.per = 0;
    r.g0 = work.b * r.nt + work.tile0;
    r.g1 = work.b * r.nt + work.tile1;
  }
  return r;
}

// The producer warpgroup's warps 1-3 (rotator u of kRotators): each landed tile's rope block (full[s]) rotated in
// place, then an arrive on roped[s]. Rotator u takes items u, u + 96, u + 192 of a tile; item i = (row i / 4,
// frequencies 8 (i % 4) ..). The cos/sin of the next tile's items are loaded while this tile waits and rotates.
template <bool kBalanced>
__device__ __forceinline__ void rotate_tiles(int u, const TileRange& r, const Params& p, uint8_t* s_kv, uint64_t* full,
                                             uint64_t* roped) {
  RopeTables tab[kItemsPerRotator];
  int s = 0;
  uint32_t phase = 0;
  TileCursor<kBalanced> c(r);
  if (r.g0 < r.g1) load_item_tables(u, c.tile, r.kv_len, p, tab);
  for (; c.g < r.g1; c.next(r)) {
    const int g = c.g, tile = c.tile;
    if (u == 0) trace_stamp(p, kTraceRotator, g - r.g0, 0);
    mbar_wait(&full[s], phase);
    if (u == 0) trace_stamp(p, kTraceRotator, g - r.g0, 1);
    rotate_items(u, tile, r.kv_len, p, s_kv + s * kTileBytes + 8 * kBlockBytes, tab);
    mbar_arrive(&roped[s]);
    if (u == 0) trace_stamp(p, kTraceRotator, g - r.g0, 2);
    if (g + 1 < r.g1) load_item_tables(u, tile + 1 == r.nt ? 0 : tile + 1, r.kv_len, p, tab);
    ring_next(s, phase, kStages);
  }
}

// The same for one CTA's split of one item (the seesaw kernel).
__device__ __forceinline__ void rotate_tiles(int u, const CtaWork& work, const Params& p, uint8_t* s_kv,
                                             uint64_t* full, uint64_t* roped) {
  rotate_tiles<false>(u, cta_tiles<false>(p, work), p, s_kv, full, roped);
}

// The producer thread: each piece's Q (64 heads x 576: rows 64 (2 b + hg) of q viewed as [bs 128][576]) and the CTA's
// cache tiles through the kStages ring (full: bytes landed; empty: the consumers' 8 warps are done with the stage).
// The first piece's Q loads before its first tile; a later piece's once warpgroup 0 has read the previous Q for the
// last time (q_free), after the piece's first tile is on its way. With rope_landed, each tile's rope block (block
// 8) is loaded first, on rope_landed[s], and full[s] counts only the 8 latent blocks.
template <bool kBalanced>
__device__ __forceinline__ void load_pieces(const CUtensorMap* tm_q, const CUtensorMap* tm_kv, uint8_t* s_q,
                                            uint8_t* s_kv, uint64_t* q_full, uint64_t* q_free, uint64_t* full,
                                            uint64_t* empty, const TileRange& r, int max_seq, uint64_t* rope_landed,
                                            const Params& p) {
  tma_prefetch_desc(tm_q);
  tma_prefetch_desc(tm_kv);
  auto load_q = [&](int item) {
    mbar_arrive_expect_tx(q_full, kTileBytes);
    for (int j = 0; j < kBlocks; ++j) tma_load_2d(s_q + j * kBlockBytes, tm_q, q_full, j * 64, item * kHG);
  };
  int s = 0, pieces = 0;
  uint32_t phase = 0;
  for (TileCursor<kBalanced> c(r); c.g < r.g1; c.next(r)) {
    const int g = c.g, b = c.b, tile = c.tile, item = 2 * b + r.hg;
    const bool starts = c.starts(r);
    if (starts && pieces == 0) load_q(item);
    trace_stamp(p, kTraceLoader, g - r.g0, 0);
    mbar_wait(&empty[s], phase ^ 1);
    trace_stamp(p, kTraceLoader, g - r.g0, 1);
    const int row = b * max_seq + tile * kTile;
    uint8_t* stage = s_kv + s * kTileBytes;
    if (rope_landed) {
      mbar_arrive_expect_tx(&full[s], kTileBytes - kBlockBytes);
      mbar_arrive_expect_tx(&rope_landed[s], kBlockBytes);
      tma_load_2d(stage + (kBlocks - 1) * kBlockBytes, tm_kv, &rope_landed[s], (kBlocks - 1) * 64, row);
      for (int j = 0; j < kBlocks - 1; ++j) tma_load_2d(stage + j * kBlockBytes, tm_kv, &full[s], j * 64, row);
    } else {
      mbar_arrive_expect_tx(&full[s], kTileBytes);
      for (int j = 0; j < kBlocks; ++j) tma_load_2d(stage + j * kBlockBytes, tm_kv, &full[s], j * 64, row);
    }
    if (starts && pieces > 0) {
      mbar_wait(q_free, (pieces - 1) & 1);
      load_q(item);
    }
    pieces += starts;
    ring_next(s, phase, kStages);
  }
}

// Balanced schedule, a piece that is not a whole item: O (m64n256 accumulator of warpgroup w) and, from warpgroup 0,
// the rows' (max, sum) into this CTA's partial slot (0: its first piece, 1: its last), fp32.
__device__ __forceinline__ void store_partial(const Params& p, int slot, const float* o, int w, int frag_row,
                                              int frag_col, const float* m, const float* l, bool write_ml) {
  const long long base = (static_cast<long long>(blockIdx.x) * 2 + slot) * kHG;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = frag_row + 8 * h;
    float* dst = p.part_o + (base + row) * kLatent + 256 * w;
#pragma unroll
    for (int col = 0; col < 32; ++col)
      __stcg(reinterpret_cast<float2*>(dst + 8 * col + frag_col), make_float2(o[4 * col + 2 * h], o[4 * col + 2 * h + 1]));
    if (write_ml) __stcg(reinterpret_cast<float2*>(p.part_ml + (base + row) * 2), make_float2(m[h], l[h]));
  }
}

// Balanced schedule: the 64 output rows of batch row b, head group r.hg = sum_k 2^(m_k - M) O_k / sum_k 2^(m_k - M)
// l_k over the row's pieces, in CTA order (deterministic). The pieces are those of pairs k0 .. k1 (CTAs 2k + hg);
// a CTA's piece sits in its slot 0 when its run starts inside the row, else in slot 1 (its last piece). Run by the
// 256 consumer threads: thread t takes head t / 4, columns 128 (t % 4) .. + 127 in four chunks of 32.
__device__ __forceinline__ void combine_row(const Params& p, const TileRange& r, int b) {
  const int start = b * r.nt, k0 = start / r.per, k1 = (start + r.nt - 1) / r.per;
  const int row = threadIdx.x >> 2, col0 = 128 * (threadIdx.x & 3);
  auto slot_row = [&](int k) { return (2LL * (2 * k + r.hg) + (k * r.per >= start ? 0 : 1)) * kHG + row; };
  float m_max = -INFINITY, l_sum = 0.0f;
  for (int k = k0; k <= k1; ++k) m_max = fmaxf(m_max, __ldcg(p.part_ml + slot_row(k) * 2));
  for (int k = k0; k <= k1; ++k) {
    const float2 ml = __ldcg(reinterpret_cast<const float2*>(p.part_ml + slot_row(k) * 2));
    l_sum += exp2f(ml.x - m_max) * ml.y;
  }
  const float inv = 1.0f / l_sum;
  __nv_bfloat16* dst = p.out + (static_cast<long long>(2 * b + r.hg) * kHG + row) * kLatent + col0;
#pragma unroll 1
  for (int chunk = 0; chunk < 4; ++chunk) {
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    for (int k = k0; k <= k1; ++k) {
      const float f = exp2f(__ldcg(p.part_ml + slot_row(k) * 2) - m_max);
      const float4* src = reinterpret_cast<const float4*>(p.part_o + slot_row(k) * kLatent + col0 + 32 * chunk);
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const float4 x = __ldcg(src + v);
        acc[4 * v] += f * x.x;
        acc[4 * v + 1] += f * x.y;
        acc[4 * v + 2] += f * x.z;
        acc[4 * v + 3] += f * x.w;
      }
    }
#pragma unroll
    for (int i = 0; i < 32; i += 2)
      *reinterpret_cast<__nv_bfloat162*>(dst + 32 * chunk + i) = __floats2bfloat162_rn(acc[i] * inv, acc[i + 1] * inv);
  }
}

template <bool kRopeFirst, bool kBalanced>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_s_once_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                                           const __grid_constant__ CUtensorMap tm_kv,
                                                                           const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_q = base;
  uint8_t* s_kv = s_q + kTileBytes;
  uint8_t* s_p = s_kv + kStages * kTileBytes;                    // P [64 heads][64 positions] bf16, swizzled rows
  float* s_alpha = reinterpret_cast<float*>(s_p + kBlockBytes);  // [64] this tile's rescale factors
  float* s_m = s_alpha + kHG;                                    // [2][64] a piece's final row maxima (log2 domain)
  float* s_l = s_m + 2 * kHG;                                    // [2][64] a piece's final row sums
  int* s_rescale = reinterpret_cast<int*>(s_l + 2 * kHG);        // [4] per warp: this tile moved its rows' maxima
  int* s_last = s_rescale + 4;                                   // balanced: this CTA combines the piece's item
  uint64_t* q_full = reinterpret_cast<uint64_t*>(s_last + 4);
  uint64_t* q_free = q_full + 1;      // warpgroup 0 has read a piece's Q for the last time
  uint64_t* full = q_free + 1;        // TMA landed (kRopeFirst: the rope block landed)
  uint64_t* roped = full + kStages;   // ... and the rope columns rotated (kRopeFirst: and the latent blocks landed)
  uint64_t* empty = roped + kStages;  // both consumer warpgroups done with the stage

  const CtaWork work = cta_work(p);
  const TileRange r = cta_tiles<kBalanced>(p, work);

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_free, 4);  // one arrive per warp of warpgroup 0
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&roped[s], kRotators + (kRopeFirst ? 1 : 0));
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (threadIdx.x >= 256) {  // producer warpgroup: warp 0 loads, warps 1-3 rotate
    setmaxnreg_dec<kProducerRegs>();
    const int pt = threadIdx.x - 256;
    if (pt == 0) {
      load_pieces<kBalanced>(&tm_q, &tm_kv, s_q, s_kv, q_full, q_free, kRopeFirst ? roped : full, empty, r, p.max_seq,
                  kRopeFirst ? full : nullptr, p);
    } else if (pt >= 32) {
      rotate_tiles<kBalanced>(pt - 32, r, p, s_kv, full, roped);
    }
    return;
  }

  const int w = threadIdx.x / 128;  // this warpgroup's output columns: 256w .. 256w + 255
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4;  // heads frag_row and frag_row + 8 (within the CTA's 64)
  const int frag_col = 2 * (lane % 4);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  // Warpgroup 0's softmax state. m_run: the row maxima (log2 domain); l_run: this thread's share of the row sums
  // (its 16 positions of each tile), summed across the quad at the end of a piece.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  // One loop per warpgroup (their work differs; a shared loop branches around every wgmma).
  int s = 0, pieces = 0;
  uint32_t phase = 0;
  // After a warpgroup's last read of stage s (its P V waited for): hand the stage back to the producer, go to the next.
  auto release_stage = [&]() {
#pragma unroll
    for (int j = 0; j < 128; ++j) reg_fence(o[j]);
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    ring_next(s, phase, kStages);
  };
  // The end of a piece (of batch row b; whole: all of the row's tiles; first: the CTA's first), both warpgroups: warpgroup 0's final row maxima and sums to
  // both (shared memory by piece parity: the other warpgroup may still read the previous piece's), then the output:
  // normalised rows (a whole item, or without kBalanced store_rows' split partials), or (kBalanced) this piece's
  // partial, and the item's combine by the CTA that writes its last partial. O and the softmax state start over.
  auto finish_piece = [&](int b, bool whole, bool first) {
    float* pm = s_m + (pieces & 1) * kHG;
    float* pl = s_l + (pieces & 1) * kHG;
    if (w == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 2);
        if ((lane & 3) == 0) {
          pm[frag_row + 8 * h] = m_run[h];
          pl[frag_row + 8 * h] = l_run[h];
        }
      }
    }
    named_bar_sync(kBarRows, 256);
    const float m_row[2] = {pm[frag_row], pm[frag_row + 8]}, l_row[2] = {pl[frag_row], pl[frag_row + 8]};
    const int item = 2 * b + r.hg;
    const bool write_ml = w == 0 && (lane & 3) == 0;
    if (!kBalanced || whole) {
      CtaWork c = work;
      if (kBalanced) c.b = b, c.hg = r.hg, c.split = 0;
      store_rows(p, c, o, w, frag_row, frag_col, m_row, l_row, write_ml);
    } else {
      store_partial(p, first ? 0 : 1, o, w, frag_row, frag_col, m_row, l_row, write_ml);
      __threadfence();
      named_bar_sync(kBarPart, 256);
      if (threadIdx.x == 0) {
        const int start = b * r.nt, pieces_of_row = (start + r.nt - 1) / r.per - start / r.per + 1;
        const bool last = atomicAdd(&p.pieces_done[item], 1) == pieces_of_row - 1;
        if (last) p.pieces_done[item] = 0;  // every other piece has counted: ready for the next launch
        __threadfence();
        *s_last = last;
      }
      named_bar_sync(kBarPart, 256);
      if (*s_last) combine_row(p, r, b);
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
    ++pieces;
  };
  if (w == 0) {
    setmaxnreg_inc<kWg0Regs>();
    uint32_t pa[16];  // P as bf16 pairs: pa[4j .. 4j+3] = the A fragment of positions 16j .. 16j+15
    float sc[32];  // S of the tile being worked on (m64n64 accumulator)
    // Waits until tile i (in stage st) is ready, then issues its S = Q K^T over the tile's 64 positions (one group).
    auto issue_s = [&](int i, int st, uint32_t ph) {
      if (t == 0) trace_stamp(p, kTraceWg0, i, 0);
      mbar_wait(&roped[st], ph);
      if (t == 0) trace_stamp(p, kTraceWg0, i, 1);
      const uint8_t* kv = s_kv + st * kTileBytes;
      wgmma_fence();
#pragma unroll
      for (int blk = 0; blk < kBlocks; ++blk) {
        const uint64_t da = make_desc_sw128(s_q + blk * kBlockBytes);
        const uint64_t db = make_desc_sw128(kv + blk * kBlockBytes);
#pragma unroll
        for (int q = 0; q < 4; ++q) wgmma_m64n64k16_bf16<0>(sc, da + 2 * q, db + 2 * q, blk > 0 || q > 0);
      }
      wgmma_commit();
    };
    auto s_landed = [&](int i) {  // after wgmma_wait: S of tile i in sc
#pragma unroll
      for (int j = 0; j < 32; ++j) reg_fence(sc[j]);
      if (t == 0) trace_stamp(p, kTraceWg0, i, 2);
    };
    bool from_zero = false, first = true;  // the current piece starts at the row's tile 0; is the CTA's first
    for (TileCursor<kBalanced> c(r); c.g < r.g1; c.next(r)) {
      const int g = c.g, tile = c.tile, i = g - r.g0;
      uint8_t* kv = s_kv + s * kTileBytes;
      const bool ends = c.ends(r);
      if (c.starts(r)) {
        from_zero = tile == 0, first = g == r.g0;
        mbar_wait(q_full, pieces & 1);
        if (t == 0 && g == r.g0) trace_clock(p, 0);
      }
      issue_s(i, s, phase);
      wgmma_wait<0>();
      s_landed(i);
      if (kBalanced && ends) {  // Q may be replaced by the next piece's
        __syncwarp();
        if (lane == 0) mbar_arrive(q_free);
      }

      float alpha[2];
      const bool rescale = softmax_tile(sc, tile, r.kv_len, p.scale_log2, frag_col, m_run, l_run, alpha, pa);
      // Hand P and the rescale factors to warpgroup 1 once it has read the previous tile's.
      if (t == 0) trace_stamp(p, kTraceWg0, i, 3);
      named_bar_sync(kBarPFree, 256);
      if (t == 0) trace_stamp(p, kTraceWg0, i, 4);
      store_p(s_p, warp, lane, pa);
      if ((lane & 3) == 0) {
        s_alpha[frag_row] = alpha[0];
        s_alpha[frag_row + 8] = alpha[1];
      }
      if (lane == 0) s_rescale[warp] = rescale;
      // Warpgroup 1 reads P with ldmatrix (the generic proxy, like these writes): the named barrier orders them, no
      // proxy fence on this path.
      named_bar_arrive(kBarPReady, 256);
      if (rescale) {
#pragma unroll
        for (int j = 0; j < 128; ++j) o[j] *= alpha[(j >> 1) & 1];
      }
      // O += P V, columns 0 .. 255 (blocks 0 .. 3), P from registers.
      const uint64_t db = make_desc_sw128(kv, kBlockBytes, 1024);
      if (t == 0) trace_stamp(p, kTraceWg0, i, 5);
      wgmma_fence();
      issue_pv_from_registers(o, pa, db);
      wgmma_commit();
      wgmma_wait<0>();
      if (t == 0) trace_stamp(p, kTraceWg0, i, 6);
      release_stage();
      if (ends) finish_piece(c.b, from_zero && tile + 1 == r.nt, first);
    }
    if (!kBalanced && r.g0 >= r.g1) finish_piece(0, false, true);  // an empty split still writes its (empty) partial
    if (t == 0) trace_clock(p, 2);
  } else {
    setmaxnreg_inc<kWg1Regs>();
    if (r.g0 < r.g1) named_bar_arrive(kBarPFree, 256);  // the P buffer starts free
    bool from_zero = false, first = true;
    for (TileCursor<kBalanced> c(r); c.g < r.g1; c.next(r)) {
      const int g = c.g, i = g - r.g0;
      if (c.starts(r)) from_zero = c.tile == 0, first = g == r.g0;
      uint8_t* kv = s_kv + s * kTileBytes;
      if (t == 0) trace_stamp(p, kTraceWg1, i, 0);
      mbar_wait(&roped[s], phase);
      if (t == 0) trace_stamp(p, kTraceWg1, i, 1);
      named_bar_sync(kBarPReady, 256);
      if (t == 0) trace_stamp(p, kTraceWg1, i, 2);
      // P and the rescale factors into registers, then the buffer back to warpgroup 0 before this P V.
      uint32_t pb[16];
      load_p(s_p, warp, lane, pb);
      const bool rescale = s_rescale[warp];  // warpgroup 0's warp of the same 16 rows moved their maxima
      const float alpha0 = s_alpha[frag_row], alpha1 = s_alpha[frag_row + 8];
      if (g + 1 < r.g1) named_bar_arrive(kBarPFree, 256);
      if (rescale) {
#pragma unroll
        for (int j = 0; j < 128; ++j) o[j] *= (j >> 1) & 1 ? alpha1 : alpha0;
      }
      // O += P V, columns 256 .. 511 (blocks 4 .. 7), P from registers.
      const uint64_t db = make_desc_sw128(kv + 4 * kBlockBytes, kBlockBytes, 1024);
      wgmma_fence();
      issue_pv_from_registers(o, pb, db);
      wgmma_commit();
      wgmma_wait<0>();
      if (t == 0) trace_stamp(p, kTraceWg1, i, 3);
      const bool ends = c.ends(r);
      release_stage();
      if (ends) finish_piece(c.b, from_zero && c.tile + 1 == r.nt, first);
    }
    if (!kBalanced && r.g0 >= r.g1) finish_piece(0, false, true);
  }
}

}  // namespace mla
