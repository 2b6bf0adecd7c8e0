// The grouped GEMMs with the operands' roles swapped (MoeConfig::swap_ab, a candidate): the expert weights are the
// MMA's M side and the group's tokens its N side, out^T = W^T x^T. grouped_gemm.cuh tiles a group's rows by 128
// (two m64 warpgroups), so a group of 257 rows costs three tiles; wgmma's N runs in steps of 16 up to 256, so here a
// group's rows are split into ceil(rows / 256) tiles of equal width (257 rows: two tiles of 129 -> N = 144) and the
// MMA work follows the rows (docs/moe-notes.md, twenty-first session).
//
// Unit = (group, feature tile, token tile), token tile fastest, so a group's tiles of one feature tile (which share
// the weights' k-blocks through L2) run on neighbouring CTAs at the same time, as in grouped_gemm.cuh.
//   kGlu = true  (GEMM 1): warpgroup 0 multiplies gate columns f0 .. f0 + 63, warpgroup 1 the same up columns,
//                both by the same token tile; the epilogue writes H[row][f0 + j] = silu(gate) * up.
//   kGlu = false (GEMM 2): warpgroups 0 and 1 take down columns f0 .. f0 + 63 and f0 + 64 .. f0 + 127.
// A stage: the two weight boxes (64 k-rows x 64 columns each, N-major in memory = the MMA's M-major A) and up to
// four token boxes (64 rows x 64 k, K-major B). The consumers round their accumulators to fp16 and store them
// transposed ([token][64 columns], stmatrix .trans) into their staging buffers; the producer warpgroup's warps 1-3
// write each token's row out (as grouped_gemm.cuh's kAsync epilogue).
#pragma once
#include "grouped_gemm.cuh"

namespace moe {
namespace swap {

constexpr int kTileN = 256;                      // tokens a tile at most: wgmma's widest N
constexpr int kBox = 64 * kBK * 2;               // one TMA box: 64 rows of 128 bytes, 8 KB
constexpr int kStageW = 2 * kBox;                // the two weight boxes
constexpr int kStageX = (kTileN / 64) * kBox;    // up to four token boxes
constexpr int kStage = kStageW + kStageX;        // 48 KB, as grouped_gemm.cuh's
constexpr int kStages = 3;
constexpr int kPitch = 64 * 2 + 16;              // a staged token: 64 fp16 columns + 16 bytes (conflict-free rows)
constexpr int kStaging = kTileN * kPitch;        // per consumer warpgroup
constexpr int kRowTab = kTileN * 16;             // per token of the tile: its output offset and scale
constexpr int smem_bytes() {
  return 1024 + kStages * kStage + 2 * kStaging + kRowTab + (2 * kStages + 4) * 8 +
         6 * (kMaxGroups + 1) * 4;  // s_meta, s_group, s_tiles, s_size and its scratch
}
static_assert(smem_bytes() <= 227 * 1024, "the swap GEMM's shared memory exceeds an H100 block's");

// The MMA width a tile of `size` tokens runs at (the instantiations consume_tile has).
__host__ __device__ constexpr int tile_n(int size) {
  return size <= 64 ? 64 : size <= 96 ? 96 : size <= 128 ? 128 : (size + 15) / 16 * 16;
}

struct Unit {
  int g, ft;        // group, feature tile
  int rows, row0;   // the group's row count and first sorted row
  int t0, size;     // the tile's first token within the group, and its width (the group's rows split evenly)
  int n;            // tile_n(size): the MMA's N
};

// The groups' order in the unit sequence and their tiles, in shared memory: s_group[i] the group at position i,
// s_tiles[i] the first token tile of position i (s_tiles[G]: all tiles), s_size[g] the width of group g's tiles.
struct Schedule {
  const int* s_meta;
  const int* s_group;
  const int* s_tiles;
  const int* s_size;
};

__device__ __forceinline__ Unit decode(const Schedule& sc, int G, int f_tiles, int u) {
  const int gt = u / f_tiles;
  int i = 0;
  while (i + 1 < G && sc.s_tiles[i + 1] <= gt) ++i;
  const int tiles = sc.s_tiles[i + 1] - sc.s_tiles[i];
  const int local = u - sc.s_tiles[i] * f_tiles;
  const int g = sc.s_group[i];
  const int* s_meta = sc.s_meta;
  const int* s_size = sc.s_size;
  Unit w;
  w.g = g;
  w.ft = local / tiles;
  w.size = s_size[g];
  w.t0 = (local % tiles) * w.size;
  w.row0 = s_meta[g];
  w.rows = s_meta[g + 1] - s_meta[g];
  w.n = tile_n(w.size);
  return w;
}

// The producer (one thread): every k-block's two weight boxes and the tile's token boxes into the next free stage.
template <bool kGlu>
__device__ __forceinline__ void produce(const GemmParams& p, const Schedule& sc, uint8_t* s_ring, uint64_t* full,
                                        uint64_t* empty, int units, int num_kb) {
  int s = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = decode(sc, p.groups, p.n_tiles, u);
    const bool shared_x = kGlu && w.g == p.shared_group;  // GEMM 1 reads the shared expert's rows from x itself
    const CUtensorMap* xmap = &p.a[shared_x ? 1 : 0];
    const int x_row = (shared_x ? 0 : w.row0) + w.t0;  // a tile may read on into the next group (never stored)
    const int boxes = (w.n + 63) / 64;
    const CUtensorMap* w0 = &p.b[w.g];
    const CUtensorMap* w1 = kGlu ? &p.b[kMaxGroups + w.g] : &p.b[w.g];
    const int c0 = kGlu ? w.ft * 64 : w.ft * 128, c1 = kGlu ? c0 : c0 + 64;
    for (int kb = 0; kb < num_kb; ++kb) {
      mbar_wait(&empty[s], phase ^ 1);
      mbar_arrive_expect_tx(&full[s], kStageW + boxes * kBox);
      uint8_t* st = s_ring + s * kStage;
      tma_load_2d(st, w0, &full[s], c0, kb * kBK);
      tma_load_2d(st + kBox, w1, &full[s], c1, kb * kBK);
      for (int j = 0; j < boxes; ++j) tma_load_2d(st + kStageW + j * kBox, xmap, &full[s], kb * kBK, x_row + 64 * j);
      ring_next(s, phase, kStages);
    }
  }
}

template <int N, int kTransA>
__device__ __forceinline__ void mma_k64_n(float* acc, uint64_t da, uint64_t db, bool first) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // k16 steps: the weights advance 16 rows of 128 bytes, the tokens 32 bytes
    const uint64_t a = da + (2048 >> 4) * q, b = db + 2 * q;
    const int accumulate = !first || q > 0;
    if constexpr (N == 64) wgmma_m64n64k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 96) wgmma_m64n96k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 128) wgmma_m64n128k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 144) wgmma_m64n144k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 160) wgmma_m64n160k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 176) wgmma_m64n176k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 192) wgmma_m64n192k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 208) wgmma_m64n208k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 224) wgmma_m64n224k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 240) wgmma_m64n240k16_f16<0, kTransA>(acc, a, b, accumulate);
    if constexpr (N == 256) wgmma_m64n256k16_f16<0, kTransA>(acc, a, b, accumulate);
  }
}

// The ring's position and the staging handshake of one consumer warpgroup, carried from unit to unit.
struct ConsumerState {
  int s = 0;
  uint32_t phase = 0;
  uint32_t stg_phase = 0;
};

// Every k-block of one unit at width N: wait for the stage, issue its MMAs, hand back the stage before it.
template <int N, int kTransA>
__device__ __forceinline__ void mma_loop(float* acc, uint8_t* s_ring, uint64_t* full, uint64_t* empty,
                                         ConsumerState& st, int num_kb, int cw, int lane, int& prev) {
  for (int kb = 0; kb < num_kb; ++kb) {
    mbar_wait(&full[st.s], st.phase);
    const uint8_t* stage = s_ring + st.s * kStage;
    const uint64_t da = make_desc_sw128(stage + cw * kBox, kBox, 1024);
    const uint64_t db = make_desc_sw128(stage + kStageW);
    wgmma_fence();
    mma_k64_n<N, kTransA>(acc, da, db, kb == 0);
    wgmma_commit();
    if (prev >= 0) release_after_wgmma(&empty[prev], lane);
    prev = st.s;
    ring_next(st.s, st.phase, kStages);
  }
}

// One unit of consumer warpgroup cw: its 64 columns x n tokens over every k-block, then the fp16 tile into its
// staging buffer as [token][column]. (kTransA = 0 reads the weights as if K-major: wrong products, the same data
// movement; a timing diagnostic, KBENCH_MOE_SWAP=4.)
template <int kTransA>
__device__ __forceinline__ void consume(uint8_t* s_ring, uint8_t* staging, uint64_t* full, uint64_t* empty,
                                        uint64_t* stg_full, uint64_t* stg_empty, ConsumerState& st, int num_kb,
                                        int n, int cw, int warp, int lane) {
  float acc[kTileN / 2];
  int prev = -1;
  // The whole k-loop per width, each writing a prefix of the one accumulator array: the registers are the same
  // whichever runs (an array per width made ptxas spill and serialize the wgmma, C7512), and the loop has no branch.
  switch (n) {
    case 64: mma_loop<64, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 96: mma_loop<96, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 128: mma_loop<128, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 144: mma_loop<144, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 160: mma_loop<160, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 176: mma_loop<176, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 192: mma_loop<192, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 208: mma_loop<208, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 224: mma_loop<224, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    case 240: mma_loop<240, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev); break;
    default: mma_loop<256, kTransA>(acc, s_ring, full, empty, st, num_kb, cw, lane, prev);
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kTileN / 2; ++i) reg_fence(acc[i]);
  __syncwarp();
  if (lane == 0 && prev >= 0) mbar_arrive(&empty[prev]);
  mbar_wait(&stg_empty[cw], st.stg_phase ^ 1);
  // Accumulator register 4c + 2h + j of this lane: column (weight) 16 warp + lane / 4 + 8 h, token 8c + 2 (lane % 4)
  // + j. Matrices (c, 0), (c, 1), (c + 1, 0), (c + 1, 1) go out in one stmatrix: lane l addresses the staged row of
  // token 8 (c + l / 16) + l % 8, columns 16 warp + 8 ((l / 8) % 2) onwards.
  const int mat = lane / 8;
  uint8_t* dst = staging + (8 * (mat / 2) + lane % 8) * kPitch + (16 * warp + 8 * (mat % 2)) * 2;
#pragma unroll
  for (int c = 0; c < kTileN / 8; c += 2) {
    if (c >= n / 8) break;
    uint32_t r[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const __half2 v = __floats2half2_rn(acc[4 * (c + m / 2) + 2 * (m % 2)], acc[4 * (c + m / 2) + 2 * (m % 2) + 1]);
      r[m] = *reinterpret_cast<const uint32_t*>(&v);
    }
    stmatrix_x4_trans(dst + 8 * c * kPitch, r[0], r[1], r[2], r[3]);
  }
  mbar_arrive(&stg_full[cw]);  // every thread: its own writes are released to the epilogue warps
  st.stg_phase ^= 1;
}

// The producer warpgroup's warps 1-3 (e = 0..95): each unit's staged tokens out to their rows, once both consumer
// warpgroups have staged theirs.
template <bool kGlu>
__device__ __forceinline__ void drain(const GemmParams& p, const Schedule& sc, const uint8_t* s_stage, long long* s_off, __half2* s_scale, uint64_t* stg_full,
                                      uint64_t* stg_empty, int units, int e) {
  const bool accumulate = !kGlu && p.out_slot != nullptr;
  __half* const out = accumulate ? *p.out_slot : p.out;
  const int warp = e / 32, lane = e % 32;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = decode(sc, p.groups, p.n_tiles, u);
    const int valid = min(w.size, w.rows - w.t0);  // the tile's tokens (the MMA ran on N >= size)
    moe::Unit group{w.g, 0, 0, w.rows, w.row0};
    named_bar_sync(3, kEpiThreads);  // every warp is done with the previous unit's table
    for (int r = e; r < valid; r += kEpiThreads) s_off[r] = row_target<kGlu>(p, group, w.t0 + r, accumulate, s_scale[r]);
    named_bar_sync(3, kEpiThreads);
    mbar_wait(&stg_full[0], phase);
    mbar_wait(&stg_full[1], phase);
    if constexpr (kGlu) {  // 8 lanes a token, 8 columns a lane: gate staged by warpgroup 0, up by warpgroup 1
      __half* const dst = out + w.ft * 64 + (lane % 8) * 8;
      for (int r = warp * 4 + lane / 8; r < valid; r += 4 * (kEpiThreads / 32)) {
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
      for (int r = warp * 2 + lane / 16; r < valid; r += 2 * (kEpiThreads / 32)) {
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

template <bool kGlu, int kTransA = 1>
__global__ void __launch_bounds__(kThreads, 1) swap_gemm_kernel(const __grid_constant__ GemmParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* s_ring = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // TMA and wgmma: 1024-aligned
  uint8_t* s_stage = s_ring + kStages * kStage;
  long long* s_off = reinterpret_cast<long long*>(s_stage + 2 * kStaging);
  __half2* s_scale = reinterpret_cast<__half2*>(s_off + kTileN);
  uint64_t* full = reinterpret_cast<uint64_t*>(s_stage + 2 * kStaging + kRowTab);
  uint64_t* empty = full + kStages;
  uint64_t* stg_full = empty + kStages;  // per consumer warpgroup: its staged tokens are there
  uint64_t* stg_empty = stg_full + 2;    // the epilogue warps are done with them
  int* s_meta = reinterpret_cast<int*>(stg_empty + 2);
  int* s_group = s_meta + kMaxGroups + 1;
  int* s_tiles = s_meta + 2 * (kMaxGroups + 1);
  int* s_size = s_tiles + kMaxGroups + 1;  // 2 (kMaxGroups + 1): the second half is the prefix's scratch
  const Schedule sc{s_meta, s_group, s_tiles, s_size};

  const int G = p.groups;
  for (int i = threadIdx.x; i <= G; i += blockDim.x)  // the groups' first rows (the meta's m-tile half is for
    s_meta[i] = p.meta ? p.meta[i] : p.fixed_meta[i];  // grouped_gemm.cuh's 128-row tiles)
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int g = 0; g < G; ++g) {  // ceil(rows / 256) tiles a group, the rows split evenly over them
      const int rows = s_meta[g + 1] - s_meta[g];
      const int n = (rows + kTileN - 1) / kTileN;
      s_size[g] = p.fixed_tile ? p.fixed_tile : n ? (rows + n - 1) / n : 0;
      s_tiles[g] = n;  // (the count, for now)
    }
    // The groups widest tile first (insertion sort, stable): units of one width follow each other, so CTAs that
    // walk them stay in step with the neighbours they share operands with (p.group_order: as numbered).
    for (int i = 0; i < G; ++i) {
      int j = i;
      if (!p.group_order)
        for (; j > 0 && tile_n(s_size[s_group[j - 1]]) < tile_n(s_size[i]); --j) s_group[j] = s_group[j - 1];
      s_group[j] = i;
    }
    int tiles = 0;
    for (int i = 0; i < G; ++i) {
      const int n = s_tiles[s_group[i]];
      s_size[G + 1 + i] = tiles;  // (scratch past s_size's groups)
      tiles += n;
    }
    for (int i = 0; i < G; ++i) s_tiles[i] = s_size[G + 1 + i];
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
  const int num_kb = p.k / kBK;
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    setmaxnreg_dec<56>();
    if (threadIdx.x == 0) produce<kGlu>(p, sc, s_ring, full, empty, units, num_kb);
    if (threadIdx.x >= 32)
      drain<kGlu>(p, sc, s_stage, s_off, s_scale, stg_full, stg_empty, units, threadIdx.x - 32);
    return;
  }

  setmaxnreg_inc<224>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  uint8_t* staging = s_stage + cw * kStaging;
  ConsumerState st;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    // (from lane 0: the compiler must see the branches to each MMA width as warp-uniform, or ptxas serializes the
    // wgmma, C7518)
    const int n = __shfl_sync(0xffffffffu, decode(sc, G, p.n_tiles, u).n, 0);
    consume<kTransA>(s_ring, staging, full, empty, stg_full, stg_empty, st, num_kb, n, cw, warp, lane);
  }
}

}  // namespace swap
}  // namespace moe
