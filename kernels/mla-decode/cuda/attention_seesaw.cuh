// Absorbed MLA decode attention, the "seesaw" schedule (MlaConfig::seesaw): the two consumer warpgroups take turns
// computing S and the softmax, so that one warpgroup's softmax runs while the other's S keeps the tensor cores busy
// (docs/mla-decode-notes.md, finding 20; the schedule is the one FlashMLA's write-up describes, its code not used).
//
// Why: in the s-once schedule (attention_s_once.cuh) warpgroup 0 computes every tile's S and softmax, and its own
// chain S -> softmax -> P -> P V is the tile's period (3298 cycles; the tensor cores idle ~800 of them, finding 18).
// Here the tiles go in pairs (a, b) = (2k, 2k + 1), a in stage 0 and b in stage 1; warpgroup 0 owns a (its S and
// softmax), warpgroup 1 owns b. O stays split by columns (warpgroup w holds output columns 256w .. 256w + 255 of
// every tile), so each tile's P goes to the other warpgroup through shared memory, in one P buffer the two
// warpgroups write in turn (a first version used the tile's rope block, which then stayed busy until the other
// warpgroup had read P, and the next rope block landed and was rotated late: finding 20). The running row maxima
// are shared: a tile's softmax starts from the previous tile's maxima, published with P, and both warpgroups add
// the tiles to their O in order, rescaling by every tile's factors.
//   warpgroup 0: S(a); softmax(a), P(a) published; O += P(a) V(a); P(b) read; O += P(b) V(b)
//   warpgroup 1: S(b); P(a) read; O += P(a) V(a) (running while:) softmax(b), P(b) published; O += P(b) V(b)
// so S(b) runs under softmax(a), and P(a) V(a) under softmax(b). Each warpgroup reads the other's P into registers
// (ldmatrix). A stage is released in three parts, each loaded again once free: the rope block (the owner's S done),
// latent blocks 0-3 (warpgroup 0's P V and the owner's S done), 4-7 (warpgroup 1's); S reads the parts as they land,
// the one released first first (FlashMLA's fine-grained copies).
// Registers: warpgroup 1 holds O (128), S (32), its P (16) and the other's P (16) at once.
// Status: a candidate (KBENCH_MLA_SEESAW=1). With P in the rope block it was 2-4% slower than s-once on an H100
// (finding 20); with its own P buffer: finding 30.
#pragma once
#include <type_traits>

#include "attention_s_once.cuh"

namespace mla {

// The two published slots (one per warpgroup's tiles): row maxima after the tile, the tile's rescale factors, and
// per warp whether its rows moved (warp k of both warpgroups holds the same 16 rows).
struct SeesawSlot {  // slot s: the tile in stage s
  float m[kHG];
  float alpha[kHG];
  int rescale[4];
};
constexpr int kSeesawBarriers = 1 + 7 * kStages;  // q_full; per stage rope_landed, roped, lo, hi, and three empties
constexpr int kSeesawSmemBytes = 1024 + kTileBytes * (1 + kStages) + kBlockBytes + 8 * kSeesawBarriers +
                                 2 * static_cast<int>(sizeof(SeesawSlot)) + 2 * kHG * 4;
static_assert(kSeesawSmemBytes <= 227 * 1024, "the seesaw layout must fit one CTA's shared memory");
constexpr int kBarPublished = 8;  // + w: warpgroup w's tile: P, maxima and factors are in shared memory
constexpr int kBarSeesawRows = 10;
// Registers a thread per warpgroup after setmaxnreg: warpgroup 1 runs its softmax with its P V in flight (O, the
// other's P, S and its own P at once), warpgroup 0 with nothing in flight.
constexpr int kSeesawWg0Regs = 192, kSeesawWg1Regs = 224, kSeesawProducerRegs = 88;
static_assert((kSeesawWg0Regs - kLaunchRegs) + (kSeesawWg1Regs - kLaunchRegs) <= kLaunchRegs - kSeesawProducerRegs,
              "setmaxnreg: the consumer warpgroups would wait forever for registers the producer does not free");

// The loader thread: Q once, then each pair of tiles (a in stage 0, b in stage 1) in three parts a tile, each part
// after its own release: both rope blocks first (free once their owner's S has read them; the rotators wait for
// them), then each tile's latent halves in the order they are released (the stage owner's own half first). A loop
// tile by tile issued b's rope block only behind a's latent halves, which wait for both warpgroups' P V of the
// previous a: warpgroup 1 then waited ~2300 cycles a pair for its rope block (finding 30).
__device__ __forceinline__ void load_seesaw_tiles(const CUtensorMap* tm_q, const CUtensorMap* tm_kv, uint8_t* s_q,
                                                  uint8_t* s_kv, uint64_t* q_full, uint64_t* rope_landed,
                                                  uint64_t* lo, uint64_t* hi, uint64_t* empty_rope, uint64_t* empty_lo,
                                                  uint64_t* empty_hi, const CtaWork& c, int max_seq,
                                                  const Params* trace = nullptr) {
  tma_prefetch_desc(tm_q);
  tma_prefetch_desc(tm_kv);
  mbar_arrive_expect_tx(q_full, kTileBytes);
  for (int j = 0; j < kBlocks; ++j) tma_load_2d(s_q + j * kBlockBytes, tm_q, q_full, j * 64, c.b * kHeads + c.hg * kHG);
  const int ntiles = c.tile1 - c.tile0;
  for (int j0 = 0; j0 < ntiles; j0 += kStages) {
    const uint32_t phase = (j0 / kStages) & 1;
    const int in_pair = min(kStages, ntiles - j0);
    for (int s = 0; s < in_pair; ++s) {
      const int j = j0 + s, row = c.b * max_seq + (c.tile0 + j) * kTile;
      if (trace) trace_stamp(*trace, kTraceLoader, j, 0);
      mbar_wait(&empty_rope[s], phase ^ 1);
      mbar_arrive_expect_tx(&rope_landed[s], kBlockBytes);
      tma_load_2d(s_kv + s * kTileBytes + (kBlocks - 1) * kBlockBytes, tm_kv, &rope_landed[s], (kBlocks - 1) * 64,
                  row);
      if (trace) trace_stamp(*trace, kTraceLoader, j, 1);
    }
    for (int s = 0; s < in_pair; ++s) {
      const int j = j0 + s, row = c.b * max_seq + (c.tile0 + j) * kTile;
      uint8_t* stage = s_kv + s * kTileBytes;
      for (int h = 0; h < 2; ++h) {
        const int half = s == 0 ? h : 1 - h;  // 0: blocks 0-3, 1: blocks 4-7
        uint64_t* landed = half == 0 ? &lo[s] : &hi[s];
        mbar_wait(half == 0 ? &empty_lo[s] : &empty_hi[s], phase ^ 1);
        mbar_arrive_expect_tx(landed, 4 * kBlockBytes);
        for (int b = 4 * half; b < 4 * half + 4; ++b) tma_load_2d(stage + b * kBlockBytes, tm_kv, landed, b * 64, row);
        if (trace) trace_stamp(*trace, kTraceLoader, j, 2 + h);
      }
    }
  }
}

// The kernel's shared memory, from its 1024-byte aligned base.
struct SeesawSmem {
  uint8_t* q;             // Q [64 heads][576], nine 128-byte swizzled blocks
  uint8_t* kv;            // kStages cache tiles, same layout
  uint8_t* p;             // P of the latest published tile [64 heads][64 positions] (both warpgroups' in turn)
  uint64_t* q_full;
  uint64_t* rope_landed;  // [kStages] the rope block landed (the rotators wait on it)
  uint64_t* roped;        // ... and rotated
  uint64_t* lo;           // latent blocks 0-3 landed
  uint64_t* hi;           // latent blocks 4-7 landed
  uint64_t* empty_rope;   // the owner's S done with the rope block (its 4 warps)
  uint64_t* empty_lo;     // all 8 consumer warps done with blocks 0-3
  uint64_t* empty_hi;     // ... with blocks 4-7
  SeesawSlot* slots;      // [2], slot w for warpgroup w's tiles
  float* l;               // [2][64] each warpgroup's row sums
  __device__ __forceinline__ explicit SeesawSmem(uint8_t* base)
      : q(base), kv(base + kTileBytes), p(kv + kStages * kTileBytes),
        q_full(reinterpret_cast<uint64_t*>(p + kBlockBytes)),
        rope_landed(q_full + 1), roped(rope_landed + kStages), lo(roped + kStages), hi(lo + kStages),
        empty_rope(hi + kStages), empty_lo(empty_rope + kStages), empty_hi(empty_lo + kStages),
        slots(reinterpret_cast<SeesawSlot*>(empty_hi + kStages)), l(reinterpret_cast<float*>(slots + 2)) {}
};

__global__ void __launch_bounds__(kThreads, 1) mla_attention_seesaw_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                                           const __grid_constant__ CUtensorMap tm_kv,
                                                                           const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const SeesawSmem sm(base);
  uint8_t* s_q = sm.q;
  uint8_t* s_kv = sm.kv;
  uint64_t *q_full = sm.q_full, *rope_landed = sm.rope_landed, *roped = sm.roped, *lo = sm.lo, *hi = sm.hi;
  uint64_t *empty_rope = sm.empty_rope, *empty_lo = sm.empty_lo, *empty_hi = sm.empty_hi;

  const CtaWork work = cta_work(p);
  const int kv_len = work.kv_len, tile0 = work.tile0;
  const int ntiles = work.tile1 - work.tile0;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&rope_landed[s], 1);
      mbar_init(&roped[s], kRotators);
      mbar_init(&lo[s], 1);
      mbar_init(&hi[s], 1);
      mbar_init(&empty_rope[s], 4);
      mbar_init(&empty_lo[s], 8);
      mbar_init(&empty_hi[s], 8);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (threadIdx.x >= 256) {  // producer warpgroup: warp 0 loads, warps 1-3 rotate
    setmaxnreg_dec<kSeesawProducerRegs>();
    const int pt = threadIdx.x - 256;
    if (pt == 0)
      load_seesaw_tiles(&tm_q, &tm_kv, s_q, s_kv, q_full, rope_landed, lo, hi, empty_rope, empty_lo, empty_hi, work,
                        p.max_seq, &p);
    else if (pt >= 32)
      rotate_tiles(pt - 32, work, p, s_kv, rope_landed, roped);
    return;
  }

  const int w = threadIdx.x / 128;  // this warpgroup's output columns 256w .. 256w + 255; it owns tiles j % 2 == w
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4;  // heads frag_row and frag_row + 8 (within the CTA's 64)
  const int frag_col = 2 * (lane % 4);
  // Warp-level arrive on a stage barrier, after all of this warp's reads of the part it guards.
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  // m_run: the row maxima (log2 domain) after the latest tile this warpgroup knows of; l_run: this thread's share of
  // the row sums of this warpgroup's own tiles, rescaled by every tile's factors.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float sc[32];     // S of this warpgroup's tile (m64n64 accumulator)
  uint32_t pa[16];  // P of this warpgroup's tile, bf16 pairs (the A fragments of its P V)
  uint32_t pb[16];  // P of the other warpgroup's tile

  // Every shared-memory address comes from a base made opaque once a pair: as loop invariants the compiler hoists
  // them all (S's 72 operand descriptors, P's rows, the barriers) into registers that O, S and P leave no room for
  // (it spilled); recomputing them costs a few integer instructions a pair.
  auto layout = [&]() {
    uint8_t* pair_base = base;
    asm volatile("" : "+l"(pair_base));
    return SeesawSmem(pair_base);
  };
  // S = Q K^T of the tile in stage kSt, one commit group, each part of the tile issued once it has landed, the part
  // released first going first (FlashMLA's order): the rope block (free once the other warpgroup has read P), then
  // the owner's own latent half (free once its P V is done), then the other half (free only after the other
  // warpgroup's P V). A wgmma fence after each wait keeps ptxas from serializing the wgmmas (C7520).
  auto stamp = [&](int k, int event) {  // dev builds: the trace of benchmarks/mla_decode.py --phase-trace
    if (t == 0) trace_stamp(p, w == 0 ? kTraceWg0 : kTraceWg1, k, event);
  };
  auto issue_s = [&](const SeesawSmem& sm, auto stage_tag, uint32_t ph, int k) {
    constexpr int kSt = decltype(stage_tag)::value;
    const uint64_t q_desc = make_desc_sw128(sm.q), k_desc = make_desc_sw128(sm.kv + kSt * kTileBytes);
    constexpr uint64_t kBlockDesc = kBlockBytes >> 4;  // one block further in a descriptor's address field
    auto blocks = [&](int b0, int b1, bool first) {
      wgmma_fence();
#pragma unroll
      for (int blk = b0; blk < b1; ++blk) {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          wgmma_m64n64k16_bf16<0>(sc, q_desc + blk * kBlockDesc + 2 * q, k_desc + blk * kBlockDesc + 2 * q,
                                  !first || blk > b0 || q > 0);
      }
    };
    mbar_wait(&sm.roped[kSt], ph);
    stamp(k, 1);
    blocks(8, 9, true);
    mbar_wait(kSt == 0 ? &sm.lo[kSt] : &sm.hi[kSt], ph);
    stamp(k, 2);
    blocks(4 * kSt, 4 * kSt + 4, false);
    mbar_wait(kSt == 0 ? &sm.hi[kSt] : &sm.lo[kSt], ph);
    stamp(k, 3);
    blocks(4 - 4 * kSt, 8 - 4 * kSt, false);
    wgmma_commit();
  };
  // After S of the tile in stage st has landed: the softmax from m_run, P into the tile's rope block, the maxima and
  // factors into slot st, published on barrier kBarPublished + st. Returns whether this warp's rows moved.
  auto softmax_and_publish = [&](const SeesawSmem& sm, int st, int tile, float* alpha) {
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(sc[i]);
    const bool rescale = softmax_tile<8>(sc, tile, kv_len, p.scale_log2, frag_col, m_run, l_run, alpha, pa);
    // One P buffer serves both warpgroups in turn: W0(a) -> R1(a) -> W1(b) -> R0(b) -> W0(a') ..., each write after
    // the writer's own read of the other's P (program order; a warp touches only its own 16 rows) and each read after
    // the writer's publish barrier. The tile's rope block is thus free once its owner's S has read it.
    __syncwarp();
    store_p<4>(sm.p, warp, lane, pa);
    SeesawSlot& slot = sm.slots[st];
    if ((lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        slot.m[frag_row + 8 * h] = m_run[h];
        slot.alpha[frag_row + 8 * h] = alpha[h];
      }
    }
    if (lane == 0) slot.rescale[warp] = rescale;
    named_bar_arrive(kBarPublished + st, 256);  // ldmatrix reads P: the generic proxy, ordered by the barrier
    return rescale;
  };
  // The other warpgroup's tile in stage st: P into pb, its factors applied to the sums (to O by the caller), its
  // maxima taken.
  auto read_published = [&](const SeesawSmem& sm, int st, float* alpha) {
    named_bar_sync(kBarPublished + st, 256);
    load_p<4>(sm.p, warp, lane, pb);
    const SeesawSlot& slot = sm.slots[st];
    const bool rescale = slot.rescale[warp];
    alpha[0] = slot.alpha[frag_row];
    alpha[1] = slot.alpha[frag_row + 8];
    m_run[0] = slot.m[frag_row];
    m_run[1] = slot.m[frag_row + 8];
    // The sums are rescaled here, O by the caller.
    l_run[0] *= alpha[0];
    l_run[1] *= alpha[1];
    return rescale;
  };
  // O += P V over this warpgroup's columns of the tile in stage st, P from registers; one commit group.
  // For the other warpgroup's tile the caller first waits on the barrier of the half it reads (long completed): it
  // never waited for that tile's blocks itself, and the wait makes them visible to it.
  auto issue_pv = [&](const SeesawSmem& sm, int st, const uint32_t* pr) {
    wgmma_fence();
    issue_pv_from_registers<4>(o, pr,
                               make_desc_sw128(sm.kv + st * kTileBytes + 4 * w * kBlockBytes, kBlockBytes, 1024));
    wgmma_commit();
  };
  auto o_done = [&]() {
#pragma unroll
    for (int i = 0; i < 128; ++i) reg_fence(o[i]);
  };
  auto rescale_o = [&](bool rescale, const float* alpha) {
    if (rescale) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
  };

  // One pair k: tiles a = 2k (stage 0) and, with kB, b = 2k + 1 (stage 1). Only the last pair may lack b, so it is
  // peeled at compile time: no wgmma sits behind a runtime branch (ptxas serializes those: C7520).
  auto pair_wg0 = [&](int k, auto has_b) {
    constexpr bool kB = decltype(has_b)::value;
    const SeesawSmem sm = layout();
    const uint32_t ph = k & 1;
    stamp(k, 0);
    issue_s(sm, std::integral_constant<int, 0>{}, ph, k);
    wgmma_wait<0>();
    stamp(k, 4);
    release(&sm.empty_hi[0]);  // S was this warpgroup's only read of a's blocks 4-7
    release(&sm.empty_rope[0]);  // ... and of its rope block
    float alpha[2];
    const bool rescale = softmax_and_publish(sm, 0, tile0 + 2 * k, alpha);
    stamp(k, 5);
    rescale_o(rescale, alpha);
    issue_pv(sm, 0, pa);
    if constexpr (kB) {
      mbar_wait(&sm.lo[1], ph);
      wgmma_wait<0>();
      o_done();
      release(&sm.empty_lo[0]);
      float beta[2];
      const bool moved = read_published(sm, 1, beta);
      stamp(k, 6);
      rescale_o(moved, beta);
      release(&sm.empty_hi[1]);  // b's blocks 4-7 are warpgroup 1's
      issue_pv(sm, 1, pb);
      wgmma_wait<0>();
      o_done();
      stamp(k, 7);
      release(&sm.empty_lo[1]);
    } else {
      wgmma_wait<0>();
      o_done();
      release(&sm.empty_lo[0]);
    }
  };
  auto pair_wg1 = [&](int k, auto has_b) {
    constexpr bool kB = decltype(has_b)::value;
    const SeesawSmem sm = layout();
    const uint32_t ph = k & 1;
    stamp(k, 0);
    if constexpr (kB) issue_s(sm, std::integral_constant<int, 1>{}, ph, k);
    mbar_wait(&sm.hi[0], ph);
    float beta[2];
    const bool moved = read_published(sm, 0, beta);
    stamp(k, 4);
    release(&sm.empty_lo[0]);  // a's blocks 0-3 are warpgroup 0's
    if constexpr (kB) {
      // S(b) landed before O is rescaled (ptxas would wait here anyway, O being a wgmma's: C7517); P(a) V(a) then
      // runs under the softmax of b.
      wgmma_wait<0>();
      stamp(k, 5);
      release(&sm.empty_lo[1]);  // S was this warpgroup's only read of b's blocks 0-3
      release(&sm.empty_rope[1]);  // ... and of its rope block
    }
    rescale_o(moved, beta);
    issue_pv(sm, 0, pb);
    if constexpr (kB) {
      float alpha[2];
      const bool rescale = softmax_and_publish(sm, 1, tile0 + 2 * k + 1, alpha);
      stamp(k, 6);
      wgmma_wait<0>();
      o_done();
      release(&sm.empty_hi[0]);
      rescale_o(rescale, alpha);
      issue_pv(sm, 1, pa);
      wgmma_wait<0>();
      o_done();
      stamp(k, 7);
      release(&sm.empty_hi[1]);
    } else {
      wgmma_wait<0>();
      o_done();
      release(&sm.empty_hi[0]);
    }
  };
  using yes = std::true_type;
  using no = std::false_type;
  mbar_wait(q_full, 0);
  const int pairs = ntiles / 2;  // full pairs; an odd tile count leaves a last pair with only a
  if (w == 0) {
    setmaxnreg_inc<kSeesawWg0Regs>();
    if (t == 0) trace_clock(p, 0);
    for (int k = 0; k < pairs; ++k) pair_wg0(k, yes{});
    if (ntiles & 1) pair_wg0(pairs, no{});
    if (t == 0) trace_clock(p, 2);
  } else {
    setmaxnreg_inc<kSeesawWg1Regs>();
    for (int k = 0; k < pairs; ++k) pair_wg1(k, yes{});
    if (ntiles & 1) pair_wg1(pairs, no{});
  }

  // Both warpgroups end with the final maxima (the last tile's owner computed them, the other read them with its
  // P); the row sums are the two warpgroups' shares added.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 2);
    if ((lane & 3) == 0) sm.l[w * kHG + frag_row + 8 * h] = l_run[h];
  }
  named_bar_sync(kBarSeesawRows, 256);
  const float l_row[2] = {sm.l[frag_row] + sm.l[kHG + frag_row], sm.l[frag_row + 8] + sm.l[kHG + frag_row + 8]};
  store_rows(p, work, o, w, frag_row, frag_col, m_run, l_row, w == 0 && (lane & 3) == 0);
}

}  // namespace mla
