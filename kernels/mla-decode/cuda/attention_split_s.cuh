// Absorbed MLA decode attention, the "split S" schedule (MlaConfig::split_s, a candidate): the s-once kernel's CTA,
// TMA ring, rope-first loads and rotators, with each tile's S and softmax shared by the two consumer warpgroups
// (docs/mla-decode-notes.md, finding 26).
//
// Why: in the s-once schedule warpgroup 0 runs S (1150+ cycles of tensor work), the softmax (~530 cycles, the tensor
// cores idle but for warpgroup 1's P V) and its P V in series, and that chain sets the tile's time (~3170 cycles,
// finding 23). Here both warpgroups take half of S's reduction (the 576 key columns: warpgroup 0 columns 0-287,
// warpgroup 1 columns 288-575, the rope block included), so Q and K are still read once, and each finishes the
// scores and the softmax of half the tile's positions (warpgroup w: positions 32w .. 32w + 31):
//   1. S partial, an m64n64 accumulator over this warpgroup's 288 columns;
//   2. the partial of the other half's positions to the other warpgroup (fp32, 8 KB each way: warpgroup 0's through
//      s_x, warpgroup 1's through the stage's rope block, which only warpgroup 1's S reads); bar B1; add;
//   3. each half's row maxima to the other (s_mx); bar B2; both take the same maxima (the lazy rescale's decisions
//      and factors are then the same in both warpgroups, bit for bit);
//   4. P of the own positions (bf16) into registers and into the rope block (stmatrix), O rescaled; bar B3;
//   5. O += P V over this warpgroup's 256 output columns: the own positions' two k-steps are issued before B3, the
//      other warpgroup's two after reading its P (ldmatrix).
// The chain a tile: S (both warpgroups at once) + half a softmax + three barriers + P V, instead of S + a whole
// softmax + P V. Shared-memory traffic a tile rises by the exchanged partials (32 KB) over s-once's ~312 KB.
// Each warpgroup keeps its own share of the row sums; they are added once at the end.
#pragma once
#include "attention_s_once.cuh"

namespace mla {

constexpr int kSplitSSmemBytes = 1024 + kTileBytes * (1 + kStages) + kBlockBytes + 4 * kHG * 4 + 8 * (1 + 3 * kStages);
// Named barriers between the consumer warpgroups (256 threads, both sides sync).
constexpr int kBarPartials = 8;  // B1: the partial scores are exchanged
constexpr int kBarMaxima = 9;    // B2: the tile's half-row maxima are exchanged (and the partials read)
constexpr int kBarHalves = 10;   // B3: each half's P is in the rope block
constexpr int kBarSums = 11;     // the row sums' halves are in shared memory
// Both consumer warpgroups hold O (128), the S partial (32) and P (16): the same budget for each.
constexpr int kSplitSConsumerRegs = 208;
static_assert(2 * (kSplitSConsumerRegs - kLaunchRegs) <= kLaunchRegs - kProducerRegs,
              "setmaxnreg: the consumer warpgroups would wait forever for registers the producer does not free");

// The 18 k-steps (of 36: 9 blocks x 4) of S = Q K^T that warpgroup kW reduces over, into the m64n64 accumulator sc.
template <int kW>
__device__ __forceinline__ void issue_s_half(float* sc, const uint8_t* s_q, const uint8_t* kv) {
#pragma unroll
  for (int k = 18 * kW; k < 18 * kW + 18; ++k) {
    const int blk = k / 4, q = k % 4;
    const uint64_t da = make_desc_sw128(s_q + blk * kBlockBytes) + 2 * q;
    const uint64_t db = make_desc_sw128(kv + blk * kBlockBytes) + 2 * q;
    wgmma_m64n64k16_bf16<0>(sc, da, db, k > 18 * kW);
  }
}

// O += P V for the k-steps (16 positions each) kQ0, kQ0 + 1 of the tile: issues the wgmmas only.
template <int kQ0>
__device__ __forceinline__ void issue_pv_steps(float* o, const uint32_t* pa, uint64_t v_desc) {
#pragma unroll
  for (int q = kQ0; q < kQ0 + 2; ++q) wgmma_m64n256k16_rs_bf16<1>(o, pa + 4 * q, v_desc + (2048 >> 4) * q, 1);
}

// P's k-steps kQ0, kQ0 + 1 (positions 16 kQ0 .. 16 kQ0 + 31) to or from the P layout of attention_s_once.cuh.
template <int kQ0>
__device__ __forceinline__ void store_p_steps(uint8_t* p_block, int warp, int lane, const uint32_t* pa) {
#pragma unroll
  for (int j2 = kQ0; j2 < kQ0 + 2; ++j2)
    stmatrix_x4(p_fragment_row(p_block, warp, lane, j2), pa[4 * j2], pa[4 * j2 + 1], pa[4 * j2 + 2], pa[4 * j2 + 3]);
}
template <int kQ0>
__device__ __forceinline__ void load_p_steps(uint8_t* p_block, int warp, int lane, uint32_t* pa) {
#pragma unroll
  for (int j2 = kQ0; j2 < kQ0 + 2; ++j2)
    ldmatrix_x4(p_fragment_row(p_block, warp, lane, j2), pa[4 * j2], pa[4 * j2 + 1], pa[4 * j2 + 2], pa[4 * j2 + 3]);
}

// The accumulator's columns 8c .. 8c + 7 for c in [kC0, kC0 + 4) (16 floats a thread) to or from an exchange
// buffer of 8 KB laid out [4][128 threads] of float4, so that a warp's accesses are 512 contiguous bytes.
template <int kC0>
__device__ __forceinline__ void put_partial(float4* x, int t, const float* sc) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float* v = sc + 4 * (kC0 + k);
    x[k * 128 + t] = make_float4(v[0], v[1], v[2], v[3]);
  }
}
template <int kC0>
__device__ __forceinline__ void add_partial(const float4* x, int t, float* sc) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 v = x[k * 128 + t];
    float* d = sc + 4 * (kC0 + k);
    d[0] += v.x, d[1] += v.y, d[2] += v.z, d[3] += v.w;
  }
}

// One consumer warpgroup kW of the split-S schedule over the CTA's tiles. o: its m64n256 accumulator (output columns
// 256 kW ..); m_run, l_run: the running row maxima (log2 domain, the same in both warpgroups) and this thread's share
// of the row sums over its warpgroup's positions.
template <int kW>
__device__ __forceinline__ void split_s_consumer(const CtaWork& work, const Params& p, const uint8_t* s_q, uint8_t* s_kv,
                                                 float4* s_x, float* s_mx, uint64_t* roped, uint64_t* empty, float* o,
                                                 float* m_run, float* l_run) {
  constexpr int kC0 = 4 * kW, kOtherC0 = 4 - kC0;  // this warpgroup's 8-position column groups of the tile
  constexpr int kQ0 = 2 * kW, kOtherQ0 = 2 - kQ0;  // ... and its P k-steps (16 positions each)
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4, frag_col = 2 * (lane % 4);
  const int kv_len = work.kv_len;
  float sc[32];
  uint32_t pa[16];
  int s = 0;
  uint32_t phase = 0;
  for (int tile = work.tile0; tile < work.tile1; ++tile) {
    uint8_t* kv = s_kv + s * kTileBytes;
    uint8_t* rope_block = kv + 8 * kBlockBytes;  // rotated keys, then warpgroup 1's partial, then both halves of P
    mbar_wait(&roped[s], phase);
    wgmma_fence();
    issue_s_half<kW>(sc, s_q, kv);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 32; ++j) reg_fence(sc[j]);

    // 2. The other half's partial scores out, this half's in. Warpgroup 1's S was the rope block's last reader.
    put_partial<kOtherC0>(kW == 0 ? s_x : reinterpret_cast<float4*>(rope_block), t, sc);
    named_bar_sync(kBarPartials, 256);
    add_partial<kC0>(kW == 0 ? reinterpret_cast<const float4*>(rope_block) : s_x, t, sc);

    // 3. This half's row maxima (the split's last tile masks positions past the cache first).
    if (tile * kTile + kTile > kv_len) {
#pragma unroll
      for (int c = kC0; c < kC0 + 4; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (tile * kTile + 8 * c + frag_col + (j & 1) >= kv_len) sc[4 * c + j] = -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int c = kC0; c < kC0 + 4; ++c) mx = fmaxf(mx, fmaxf(sc[4 * c + 2 * h], sc[4 * c + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
      if ((lane & 3) == 0) s_mx[kW * kHG + frag_row + 8 * h] = mx;
    }
    named_bar_sync(kBarMaxima, 256);
    // Both warpgroups read both halves in the same order: the same maxima, the same rescale decisions, bit for bit.
    float m_new[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = frag_row + 8 * h;
      m_new[h] = fmaxf(m_run[h], fmaxf(s_mx[row], s_mx[kHG + row]) * p.scale_log2);
    }
    const bool rescale =
        __any_sync(0xffffffff, m_new[0] > m_run[0] + kRescaleSlack || m_new[1] > m_run[1] + kRescaleSlack);
    float alpha[2] = {1.0f, 1.0f};
    if (rescale) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        alpha[h] = ex2_approx(m_run[h] - m_new[h]);
        m_run[h] = m_new[h];
        l_run[h] *= alpha[h];
      }
    }
    // 4. P of this half (pa[2c + h], c in this half: the A fragments of k-steps kQ0, kQ0 + 1).
#pragma unroll
    for (int c = kC0; c < kC0 + 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = ex2_approx(fmaf(sc[4 * c + 2 * h], p.scale_log2, -m_run[h]));
        const float p1 = ex2_approx(fmaf(sc[4 * c + 2 * h + 1], p.scale_log2, -m_run[h]));
        l_run[h] += p0 + p1;
        const __nv_bfloat162 pair = __floats2bfloat162_rn(p0, p1);
        pa[2 * c + h] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    // The rope block's partial was read before B2: it takes this half's P now.
    store_p_steps<kQ0>(rope_block, warp, lane, pa);
    if (rescale) {
#pragma unroll
      for (int j = 0; j < 128; ++j) o[j] *= alpha[(j >> 1) & 1];
    }
    // 5. O += P V over this warpgroup's 4 latent blocks: this half's positions now, the other's after B3.
    const uint64_t v_desc = make_desc_sw128(kv + 4 * kW * kBlockBytes, kBlockBytes, 1024);
    wgmma_fence();
    issue_pv_steps<kQ0>(o, pa, v_desc);
    wgmma_commit();
    named_bar_sync(kBarHalves, 256);
    load_p_steps<kOtherQ0>(rope_block, warp, lane, pa);
    wgmma_fence();
    issue_pv_steps<kOtherQ0>(o, pa, v_desc);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 128; ++j) reg_fence(o[j]);
    // Generic writes (the partial, P) into the rope block that the next TMA load overwrites: order them first.
    fence_proxy_async_smem();
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
    ring_next(s, phase, kStages);
  }
}

__global__ void __launch_bounds__(kThreads, 1) mla_attention_split_s_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                                            const __grid_constant__ CUtensorMap tm_kv,
                                                                            const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_q = base;
  uint8_t* s_kv = s_q + kTileBytes;
  float4* s_x = reinterpret_cast<float4*>(s_kv + kStages * kTileBytes);  // warpgroup 0's partial for warpgroup 1
  float* s_mx = reinterpret_cast<float*>(s_x) + kBlockBytes / 4;         // [2][64] the tile's half-row maxima
  float* s_l = s_mx + 2 * kHG;                                            // [2][64] the final half-row sums
  uint64_t* q_full = reinterpret_cast<uint64_t*>(s_l + 2 * kHG);
  uint64_t* full = q_full + 1;        // the rope block landed
  uint64_t* roped = full + kStages;   // ... rotated, and the latent blocks landed
  uint64_t* empty = roped + kStages;  // both consumer warpgroups done with the stage

  const CtaWork work = cta_work(p);
  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&roped[s], kRotators + 1);
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (threadIdx.x >= 256) {  // producer warpgroup: warp 0 loads (rope block first), warps 1-3 rotate
    setmaxnreg_dec<kProducerRegs>();
    const int pt = threadIdx.x - 256;
    if (pt == 0) {
      load_q_and_tiles(&tm_q, &tm_kv, s_q, s_kv, q_full, roped, empty, work, p.max_seq, full, &p);
    } else if (pt >= 32) {
      rotate_tiles(pt - 32, work, p, s_kv, full, roped);
    }
    return;
  }

  setmaxnreg_inc<kSplitSConsumerRegs>();
  const int w = threadIdx.x / 128;
  const int t = threadIdx.x % 128, lane = t % 32;
  const int frag_row = (t / 32) * 16 + lane / 4, frag_col = 2 * (lane % 4);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  mbar_wait(q_full, 0);
  if (w == 0)
    split_s_consumer<0>(work, p, s_q, s_kv, s_x, s_mx, roped, empty, o, m_run, l_run);
  else
    split_s_consumer<1>(work, p, s_q, s_kv, s_x, s_mx, roped, empty, o, m_run, l_run);

  // The row sums: each warpgroup's share over its positions, added in the same order by both.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffff, l_run[h], 2);
    if ((lane & 3) == 0) s_l[w * kHG + frag_row + 8 * h] = l_run[h];
  }
  named_bar_sync(kBarSums, 256);
  const float l_row[2] = {s_l[frag_row] + s_l[kHG + frag_row], s_l[frag_row + 8] + s_l[kHG + frag_row + 8]};
  store_rows(p, work, o, w, frag_row, frag_col, m_run, l_row, w == 0 && (lane & 3) == 0);
}

}  // namespace mla
