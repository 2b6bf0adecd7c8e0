// Absorbed MLA decode attention, the "rope ring" schedule (MlaConfig::rope_ring, a candidate): s-once's warpgroups,
// numerics and wgmma (attention_s_once.cuh), with each tile's rope block in a ring of its own, loaded ahead of the
// tile's latent blocks (docs/mla-decode-notes.md, finding 23).
//
// Why: with two stages of whole tiles, tile i + 2 loads into the stage tile i frees, so a tile's period is half of
// (load issue -> landed -> rotated) + (S -> the stage released): ~(2700 + 3540) / 2 cycles on an H100, close to the
// measured 3200 (phase trace, 2026-11-24 ninth session), and the keys' rotation (~900 cycles after the tile lands;
// all nine boxes land together) is on that chain. Here the 8 rope columns' block of a tile has one of 3 slots of
// 8 KB; the latent blocks keep 2 stages of 64 KB. The loader issues the rope block of tile j + 1 before the latent
// blocks of tile j, so the rotators finish a tile's rope block about a period before its latent blocks land, and
// the chain becomes load issue -> landed. P goes into the tile's rope slot once S has read it (the separate P buffer
// is what pays for the third slot in shared memory).
#pragma once
#include "attention_s_once.cuh"

namespace mla {

constexpr int kRopeSlots = 3;
constexpr int kLatentBytes = kTileBytes - kBlockBytes;  // a tile's 8 latent blocks
constexpr int kRingSmemBytes = 1024 + kTileBytes + kStages * kLatentBytes + kRopeSlots * kBlockBytes + 3 * kHG * 4 +
                               16 + 8 * (1 + 2 * kStages + 3 * kRopeSlots);
static_assert(kRingSmemBytes <= 232448, "227 KB of shared memory a block");

// The loader thread: Q, then per tile j the rope block of tile j + 1 (slot (j + 1) % 3, free once both consumer
// warpgroups are done with tile j - 2) and the latent blocks of tile j (stage j % 2, free once they are done with
// tile j - 2). A fresh barrier's "previous phase" counts as complete, so the first waits pass. prefetch: the latent
// blocks of tile j + 2 are also requested into L2 when tile j's are issued (its landing, ~1700 cycles from DRAM,
// is on the chain that sets the period with two stages).
__device__ __forceinline__ void load_ring(const CUtensorMap* tm_q, const CUtensorMap* tm_kv, uint8_t* s_q,
                                          uint8_t* s_lat, uint8_t* s_rope, uint64_t* q_full, uint64_t* lat_full,
                                          uint64_t* lat_empty, uint64_t* rope_full, uint64_t* rope_empty,
                                          const CtaWork& c, int max_seq, const Params& p, bool prefetch) {
  tma_prefetch_desc(tm_q);
  tma_prefetch_desc(tm_kv);
  mbar_arrive_expect_tx(q_full, kTileBytes);
  for (int j = 0; j < kBlocks; ++j) tma_load_2d(s_q + j * kBlockBytes, tm_q, q_full, j * 64, c.b * kHeads + c.hg * kHG);
  const int ntiles = c.tile1 - c.tile0;
  auto rope = [&](int j) {
    const int slot = j % kRopeSlots;
    mbar_wait(&rope_empty[slot], ((j / kRopeSlots) & 1) ^ 1);
    mbar_arrive_expect_tx(&rope_full[slot], kBlockBytes);
    tma_load_2d(s_rope + slot * kBlockBytes, tm_kv, &rope_full[slot], kLatent, c.b * max_seq + (c.tile0 + j) * kTile);
  };
  auto prefetch_latent = [&](int j) {
    for (int b = 0; b < kBlocks - 1; ++b) tma_prefetch_2d(tm_kv, b * 64, c.b * max_seq + (c.tile0 + j) * kTile);
  };
  if (ntiles > 0) rope(0);
  for (int j = 0; j < ntiles; ++j) {
    if (j + 1 < ntiles) rope(j + 1);
    const int st = j % kStages;
    trace_stamp(p, kTraceLoader, j, 0);
    mbar_wait(&lat_empty[st], ((j / kStages) & 1) ^ 1);
    trace_stamp(p, kTraceLoader, j, 1);
    mbar_arrive_expect_tx(&lat_full[st], kLatentBytes);
    for (int b = 0; b < kBlocks - 1; ++b)
      tma_load_2d(s_lat + st * kLatentBytes + b * kBlockBytes, tm_kv, &lat_full[st], b * 64,
                  c.b * max_seq + (c.tile0 + j) * kTile);
    if (prefetch && j + 2 < ntiles) prefetch_latent(j + 2);  // issued itself once tile j is released
  }
}

// Rotator u of kRotators: each tile's rope block rotated in its slot once landed, then an arrive on roped.
__device__ __forceinline__ void rotate_ring(int u, const CtaWork& work, const Params& p, uint8_t* s_rope,
                                            uint64_t* rope_full, uint64_t* roped) {
  const int kv_len = work.kv_len, tile0 = work.tile0, tile1 = work.tile1;
  RopeTables tab[kItemsPerRotator];
  if (tile0 < tile1) load_item_tables(u, tile0, kv_len, p, tab);
  for (int tile = tile0; tile < tile1; ++tile) {
    const int i = tile - tile0, slot = i % kRopeSlots;
    if (u == 0) trace_stamp(p, kTraceRotator, i, 0);
    mbar_wait(&rope_full[slot], (i / kRopeSlots) & 1);
    if (u == 0) trace_stamp(p, kTraceRotator, i, 1);
    rotate_items(u, tile, kv_len, p, s_rope + slot * kBlockBytes, tab);
    mbar_arrive(&roped[slot]);
    if (u == 0) trace_stamp(p, kTraceRotator, i, 2);
    if (tile + 1 < tile1) load_item_tables(u, tile + 1, kv_len, p, tab);
  }
}

__global__ void __launch_bounds__(kThreads, 1) mla_attention_rope_ring_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                                              const __grid_constant__ CUtensorMap tm_kv,
                                                                              const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_q = base;                                           // Q: 8 latent blocks, rope block
  uint8_t* s_lat = s_q + kTileBytes;                             // [2] a tile's latent blocks
  uint8_t* s_rope = s_lat + kStages * kLatentBytes;              // [3] a tile's rope block, then its P
  float* s_alpha = reinterpret_cast<float*>(s_rope + kRopeSlots * kBlockBytes);  // [64] this tile's rescale factors
  float* s_m = s_alpha + kHG;                                    // [64] final row maxima (log2 domain)
  float* s_l = s_m + kHG;                                        // [64] final row sums
  int* s_rescale = reinterpret_cast<int*>(s_l + kHG);            // [4] per warp: this tile moved its rows' maxima
  uint64_t* q_full = reinterpret_cast<uint64_t*>(s_rescale + 4);
  uint64_t* lat_full = q_full + 1;             // latent blocks landed
  uint64_t* lat_empty = lat_full + kStages;    // both consumer warpgroups done with them
  uint64_t* rope_full = lat_empty + kStages;   // rope block landed
  uint64_t* roped = rope_full + kRopeSlots;    // ... and rotated
  uint64_t* rope_empty = roped + kRopeSlots;   // both consumer warpgroups done with the slot (its P read)

  const CtaWork work = cta_work(p);
  const int kv_len = work.kv_len, tile0 = work.tile0, ntiles = work.tile1 - work.tile0;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&lat_full[s], 1);
      mbar_init(&lat_empty[s], 8);  // one arrive per consumer warp
    }
    for (int s = 0; s < kRopeSlots; ++s) {
      mbar_init(&rope_full[s], 1);
      mbar_init(&roped[s], kRotators);
      mbar_init(&rope_empty[s], 8);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (threadIdx.x >= 256) {  // producer warpgroup: warp 0 loads, warps 1-3 rotate
    setmaxnreg_dec<kProducerRegs>();
    const int pt = threadIdx.x - 256;
    if (pt == 0) {
      load_ring(&tm_q, &tm_kv, s_q, s_lat, s_rope, q_full, lat_full, lat_empty, rope_full, rope_empty, work, p.max_seq,
                p, p.ring_prefetch);
    } else if (pt >= 32) {
      rotate_ring(pt - 32, work, p, s_rope, rope_full, roped);
    }
    return;
  }

  const int w = threadIdx.x / 128;  // this warpgroup's output columns: 256w .. 256w + 255
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4;
  const int frag_col = 2 * (lane % 4);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  // After a warpgroup's last access to tile i's stage and slot (its P V waited for): both handed back. Warpgroup 0
  // wrote P into the slot (the generic proxy) and TMA overwrites it next: its writes are fenced first. Warpgroup 1
  // only read P, and a wgmma has consumed what it read.
  auto release_tile = [&](int i) {
#pragma unroll
    for (int j = 0; j < 128; ++j) reg_fence(o[j]);
    if (w == 0) fence_proxy_async_smem();
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(&lat_empty[i % kStages]);
      mbar_arrive(&rope_empty[i % kRopeSlots]);
    }
  };
  if (w == 0) {
    setmaxnreg_inc<kWg0Regs>();
    uint32_t pa[16];
    float sc[32];
    mbar_wait(q_full, 0);
    if (t == 0) trace_clock(p, 0);
    for (int i = 0; i < ntiles; ++i) {
      const int tile = tile0 + i, st = i % kStages, slot = i % kRopeSlots;
      uint8_t* lat = s_lat + st * kLatentBytes;
      uint8_t* rope = s_rope + slot * kBlockBytes;
      if (t == 0) trace_stamp(p, kTraceWg0, i, 0);
      mbar_wait(&roped[slot], (i / kRopeSlots) & 1);
      mbar_wait(&lat_full[st], (i / kStages) & 1);
      if (t == 0) trace_stamp(p, kTraceWg0, i, 1);
      wgmma_fence();
#pragma unroll
      for (int blk = 0; blk < kBlocks; ++blk) {
        const uint64_t da = make_desc_sw128(s_q + blk * kBlockBytes);
        const uint64_t db = make_desc_sw128(blk < kBlocks - 1 ? lat + blk * kBlockBytes : rope);
#pragma unroll
        for (int q = 0; q < 4; ++q) wgmma_m64n64k16_bf16<0>(sc, da + 2 * q, db + 2 * q, blk > 0 || q > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < 32; ++j) reg_fence(sc[j]);
      if (t == 0) trace_stamp(p, kTraceWg0, i, 2);

      float alpha[2];
      const bool rescale = softmax_tile(sc, tile, kv_len, p.scale_log2, frag_col, m_run, l_run, alpha, pa);
      if (t == 0) trace_stamp(p, kTraceWg0, i, 3);
      named_bar_sync(kBarPFree, 256);  // warpgroup 1 has read the previous tile's factors
      if (t == 0) trace_stamp(p, kTraceWg0, i, 4);
      store_p(rope, warp, lane, pa);  // S has read the slot's rope block
      if ((lane & 3) == 0) {
        s_alpha[frag_row] = alpha[0];
        s_alpha[frag_row + 8] = alpha[1];
      }
      if (lane == 0) s_rescale[warp] = rescale;
      named_bar_arrive(kBarPReady, 256);
      if (rescale) {
#pragma unroll
        for (int j = 0; j < 128; ++j) o[j] *= alpha[(j >> 1) & 1];
      }
      const uint64_t db = make_desc_sw128(lat, kBlockBytes, 1024);
      if (t == 0) trace_stamp(p, kTraceWg0, i, 5);
      wgmma_fence();
      issue_pv_from_registers(o, pa, db);
      wgmma_commit();
      wgmma_wait<0>();
      if (t == 0) trace_stamp(p, kTraceWg0, i, 6);
      release_tile(i);
    }
    if (t == 0) trace_clock(p, 2);
  } else {
    setmaxnreg_inc<kWg1Regs>();
    if (ntiles > 0) named_bar_arrive(kBarPFree, 256);
    for (int i = 0; i < ntiles; ++i) {
      const int st = i % kStages, slot = i % kRopeSlots;
      uint8_t* lat = s_lat + st * kLatentBytes;
      if (t == 0) trace_stamp(p, kTraceWg1, i, 0);
      mbar_wait(&lat_full[st], (i / kStages) & 1);
      if (t == 0) trace_stamp(p, kTraceWg1, i, 1);
      named_bar_sync(kBarPReady, 256);
      if (t == 0) trace_stamp(p, kTraceWg1, i, 2);
      uint32_t pb[16];
      load_p(s_rope + slot * kBlockBytes, warp, lane, pb);
      const bool rescale = s_rescale[warp];
      const float alpha0 = s_alpha[frag_row], alpha1 = s_alpha[frag_row + 8];
      if (i + 1 < ntiles) named_bar_arrive(kBarPFree, 256);  // the factors read; P's slot is released below
      if (rescale) {
#pragma unroll
        for (int j = 0; j < 128; ++j) o[j] *= (j >> 1) & 1 ? alpha1 : alpha0;
      }
      const uint64_t db = make_desc_sw128(lat + 4 * kBlockBytes, kBlockBytes, 1024);
      wgmma_fence();
      issue_pv_from_registers(o, pb, db);
      wgmma_commit();
      wgmma_wait<0>();
      if (t == 0) trace_stamp(p, kTraceWg1, i, 3);
      release_tile(i);  // after a wgmma has consumed the ldmatrix'd P (finding 20: an arrive behind the ldmatrix
                        // could let TMA overwrite P before the load has read it)
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (w == 0) {
      l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 1);
      l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 2);
      if ((lane & 3) == 0) {
        s_m[frag_row + 8 * h] = m_run[h];
        s_l[frag_row + 8 * h] = l_run[h];
      }
    }
  }
  named_bar_sync(kBarRows, 256);
  const float m_row[2] = {s_m[frag_row], s_m[frag_row + 8]}, l_row[2] = {s_l[frag_row], s_l[frag_row + 8]};
  store_rows(p, work, o, w, frag_row, frag_col, m_row, l_row, w == 0 && (lane & 3) == 0);
}

}  // namespace mla
