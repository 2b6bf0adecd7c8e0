// Grouped fp16 GEMM for the MoE layer on Hopper: TMA -> 4-stage shared-memory ring -> wgmma m64n256k16, warp
// specialized (one producer warpgroup, two consumer warpgroups of 64 rows each), persistent over (group, m-tile,
// n-tile) work units whose counts only the device knows (route.cuh writes them).
//
// Slot rows: in H and Y every group's rows start on a 128-row boundary (group g's first row is 128 x its first
// m-tile), so each m-tile is one group's and the epilogue can store whole tiles by TMA: the rows of a group's last
// tile past its end are padding that nothing reads. route_kernel assigns each (token, slot) pair and each token's
// shared output its slot row. XS (GEMM 1's gathered input) keeps the groups back to back instead.
//
// One template, two uses (kGlu):
//   kGlu = true  (GEMM 1): A = the group's token rows [rows][d] (K-major: a routed expert's rows gathered into
//                expert order in XS by gather_kernel, the shared expert's x itself), B = gate and up [d][dexp]
//                (row-major: the N-major wgmma layout), tile = 128 rows x (128 gate + 128 up) columns; the epilogue
//                stores h = silu(gate) * up (fp16, rounded as the reference rounds) into H at the tile's slot rows.
//   kGlu = false (GEMM 2): A = H at the tile's slot rows [rows][dexp], B = down [dexp][d], tile = 128 x 256; the
//                epilogue stores the fp16 expert output into Y at the same slot rows (combine_kernel gathers them).
// The epilogue goes through shared memory (stmatrix into the 128B-swizzled layout TMA reads) and a TMA store, so
// the consumers start the next tile's MMAs while the copy out runs.
// Groups 0..E-1 are the routed experts, group E the shared expert (all T tokens, in token order).
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_fp16.h>

#include "sm90.cuh"
#include "wgmma.cuh"

namespace moe {

using namespace kb::sm90;

constexpr int kMaxGroups = 65;       // kMoeMaxRouted routed experts + the shared one
constexpr int kBM = 128;             // rows per tile: two consumer warpgroups x 64
constexpr int kBN = 256;             // B columns per tile (GEMM 1: 128 gate + 128 up)
constexpr int kBK = 64;              // k per stage: one 128-byte swizzle span of fp16
constexpr int kThreads = 384;        // warpgroup 0 produces, 1 and 2 consume
constexpr int kMaxStages = 4;  // the shared-memory ring's depth is a template parameter: 4 (~211 KB) or 3 (~163 KB)
constexpr int kABytes = kBM * kBK * 2;          // 16 KB
constexpr int kBChunk = kBK * 64 * 2;           // one TMA box of B: 64 k-rows x 64 columns, 8 KB
constexpr int kBBytes = 4 * kBChunk;            // 32 KB
constexpr int kStageBytes = kABytes + kBBytes;  // 48 KB
constexpr int kCBoxBytes = 64 * 64 * 2;        // one TMA store box: 64 rows x 64 columns fp16, 128B-swizzled
constexpr int kCBoxes = 2;                      // boxes a consumer warpgroup stages at once (what fits beside 4 stages)
constexpr int kCBytes = kCBoxes * kCBoxBytes;   // 16 KB per consumer warpgroup
constexpr int smem_bytes(int stages) {
  return 1024 + stages * kStageBytes + 2 * kCBytes + 2 * stages * 8 + 2 * (kMaxGroups + 1) * 4;
}
static_assert(smem_bytes(kMaxStages) <= 227 * 1024, "the ring and the epilogue staging exceed Hopper's 227 KB");

// Slot rows of T tokens x K slots over E routed experts and the shared expert, each group padded to whole tiles
// (fewer than kBM rows of padding a group): a bound for sizing H and Y on the host.
constexpr long long slot_rows_bound(long long T, long long K, long long E) { return T * K + T + (E + 1) * kBM; }

// meta (int32, written by route_kernel): [0, G]: first sorted row of group g (G = groups, so [G] = the end),
// then [G+1, 2G+1]: first m-tile of group g (prefix of ceil(rows_g / 128)).
struct GemmParams {
  CUtensorMap a[2];               // kGlu: [0] XS, [1] x (the shared group); else [0] H (slot rows); 128-row boxes
  CUtensorMap b[2 * kMaxGroups];  // kGlu: gate of group g at [g], up at [kMaxGroups + g]; else down at [g]
  CUtensorMap c;                  // the output by slot rows, 64 x 64 boxes: H (kGlu) or Y
  const int* meta;
  int groups;                     // E + 1
  int n_tiles;                    // output tiles per row block: dexp / 128 (kGlu) or d / 256
  int k;                          // reduction length (multiple of 64)
  int skip_empty_halves;          // a consumer whose 64 rows all lie past its group's end issues no MMAs
};

struct Unit {
  int g, mt, nt, rows;  // group, m-tile within it, n-tile, the group's row count
  int row0;             // the group's first row in XS (expert order, groups back to back)
  int slot0;            // the tile's first slot row: 128 x (the group's first m-tile + mt)
};

// Units go group by group, n-tile by n-tile, m-tile fastest: CTAs working at the same time share B tiles (the
// expert weights, read from DRAM once and from L2 by the group's other m-tiles).
__device__ __forceinline__ Unit decode(const int* s_meta, int G, int n_tiles, int u) {
  const int* mt_off = s_meta + G + 1;
  const int gm = u / n_tiles;  // which m-tile block, counted over all groups (only to find the group)
  int g = 0;
  while (g + 1 < G && mt_off[g + 1] <= gm) ++g;
  const int m_tiles = mt_off[g + 1] - mt_off[g];
  const int local = u - mt_off[g] * n_tiles;
  Unit w;
  w.g = g;
  w.nt = local / m_tiles;
  w.mt = local % m_tiles;
  w.row0 = s_meta[g];
  w.slot0 = (mt_off[g] + w.mt) * kBM;
  w.rows = s_meta[g + 1] - s_meta[g];
  return w;
}

// h = silu(gate) * up with the reference's roundings: the GEMM outputs are fp16 (F.linear), silu computes in fp32
// and rounds to fp16, and the product of two fp16 tensors rounds once more.
__device__ __forceinline__ __half glu(float gate, float up) {
  const float g = __half2float(__float2half_rn(gate));
  const float s = __half2float(__float2half_rn(g / (1.0f + expf(-g))));
  return __float2half_rn(s * __half2float(__float2half_rn(up)));
}

// The producer (one thread): for each of this CTA's units, every k-block's A tile and four B boxes into the next
// free stage.
template <bool kGlu, int kStages>
__device__ __forceinline__ void produce(const GemmParams& p, const int* s_meta, uint8_t* s_a, uint8_t* s_b,
                                        uint64_t* full, uint64_t* empty, int units, int num_kb) {
  const int G = p.groups;
  int s = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = decode(s_meta, G, p.n_tiles, u);
    const bool shared_x = kGlu && w.g == G - 1;  // GEMM 1 reads the shared expert's rows from x itself
    const CUtensorMap* amap = &p.a[shared_x ? 1 : 0];
    // GEMM 1's routed rows: XS has no padding, so a group's last tile reads on into the next group's rows (what it
    // computes there lands in H's padding). Padding rows of zeros made GEMM 1 35% slower (docs/moe-notes.md).
    const int a_row = !kGlu ? w.slot0 : (shared_x ? 0 : w.row0) + w.mt * kBM;
    for (int kb = 0; kb < num_kb; ++kb) {
      mbar_wait(&empty[s], phase ^ 1);
      mbar_arrive_expect_tx(&full[s], kStageBytes);
      tma_load_2d(s_a + s * kABytes, amap, &full[s], kb * kBK, a_row);
      uint8_t* sb = s_b + s * kBBytes;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (kGlu) {  // chunks 0, 1: gate columns n0 .. n0 + 127; chunks 2, 3: the same up columns
          const CUtensorMap* bmap = &p.b[(j < 2 ? 0 : kMaxGroups) + w.g];
          tma_load_2d(sb + j * kBChunk, bmap, &full[s], w.nt * 128 + (j & 1) * 64, kb * kBK);
        } else {
          tma_load_2d(sb + j * kBChunk, &p.b[w.g], &full[s], w.nt * 256 + j * 64, kb * kBK);
        }
      }
      if (++s == kStages) {
        s = 0;
        phase ^= 1;
      }
    }
  }
}

template <bool kGlu, int kStages>
__global__ void __launch_bounds__(kThreads, 1) grouped_gemm_kernel(const __grid_constant__ GemmParams p) {
  static_assert(kStages >= 2 && kStages <= kMaxStages, "the ring needs two stages and fits four");
  extern __shared__ uint8_t smem_raw[];
  // 128B-swizzled TMA tiles and wgmma descriptors both assume 1024-byte aligned tiles.
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_a = base;
  uint8_t* s_b = s_a + kStages * kABytes;
  uint8_t* s_c = s_b + kStages * kBBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + 2 * kCBytes);  // s_c: 1024-aligned (whole 16 KB tiles above)
  uint64_t* empty = full + kStages;
  int* s_meta = reinterpret_cast<int*>(empty + kStages);

  const int G = p.groups;
  for (int i = threadIdx.x; i < 2 * (G + 1); i += blockDim.x) s_meta[i] = p.meta[i];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);  // the producer's arrive_expect_tx (the TMA bytes complete the phase)
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    fence_mbar_init();
  }
  __syncthreads();
  const int units = s_meta[2 * G + 1] * p.n_tiles;
  const int num_kb = p.k / kBK;
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    setmaxnreg_dec<56>();
    if (threadIdx.x == 0) produce<kGlu, kStages>(p, s_meta, s_a, s_b, full, empty, units, num_kb);
    return;
  }

  setmaxnreg_inc<224>();
  const int cw = wg - 1;  // consumer index: rows [64 cw, 64 cw + 64) of the tile
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  // stmatrix: lane l addresses row l % 8 of matrix l / 8; matrices 0, 1 are rows 0-7 and 8-15 of the warp's 16
  // (accumulator registers 4c + {0,1} and 4c + {2,3}) of one 8-column group, matrices 2, 3 the same of the next.
  const int st_row = warp * 16 + ((lane / 8) & 1) * 8 + lane % 8;
  const int st_chunk = lane / 16;
  uint8_t* my_c = s_c + cw * kCBytes;
  int s = 0;
  uint32_t phase = 0;

  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = decode(s_meta, G, p.n_tiles, u);
    // The last m-tile of a group often holds 64 rows or fewer: its second half is empty. With skip_empty_halves
    // that warpgroup only releases the stages (same arrivals), and the other one has the tensor cores to itself.
    // (Broadcast from lane 0: the compiler must see the branch around the wgmma as warp-uniform, or it serializes
    // every wgmma of the kernel, ptxas C7518.)
    const bool idle = __shfl_sync(0xffffffffu, p.skip_empty_halves && w.mt * kBM + cw * 64 >= w.rows, 0);
    float acc[128];
    int prev = -1;
    for (int kb = 0; kb < num_kb; ++kb) {
      mbar_wait(&full[s], phase);
      if (!idle) {
        const uint64_t da = make_desc_sw128(s_a + s * kABytes + cw * 64 * 128);
        const uint64_t db = make_desc_sw128(s_b + s * kBBytes, kBChunk, 1024);
        wgmma_fence();
#pragma unroll
        for (int q = 0; q < 4; ++q)  // k16 steps: A advances 32 bytes, B 16 rows of 128 bytes
          wgmma_m64n256k16_f16<1>(acc, da + 2 * q, db + (2048 >> 4) * q, kb > 0 || q > 0);
        wgmma_commit();
      }
      if (prev >= 0) {  // the previous stage's MMAs are done once at most this group is in flight
        wgmma_wait<1>();  // (unconditional: with nothing in flight it returns at once)
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[prev]);
      }
      prev = s;
      if (++s == kStages) {
        s = 0;
        phase ^= 1;
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) reg_fence(acc[i]);
    __syncwarp();
    if (lane == 0 && prev >= 0) mbar_arrive(&empty[prev]);
    if (idle) continue;  // no rows of this warpgroup to store

    // Epilogue: kCBoxes 64-column boxes at a time into the staging buffer, then one thread stores them by TMA and
    // the warpgroup goes on; the buffer is rewritten only once the store before has read it (the previous tile's
    // store, a whole tile ago, or GEMM 2's first round just issued).
    constexpr int kBoxes = kGlu ? 2 : 4;  // output columns of this warpgroup / 64
    const int col0 = w.nt * (kGlu ? 128 : 256);
#pragma unroll
    for (int round = 0; round < kBoxes / kCBoxes; ++round) {
      if (t == 0) bulk_wait_read<0>();
      named_bar_sync(1 + cw, 128);
#pragma unroll
      for (int bx = 0; bx < kCBoxes; ++bx) {
        uint8_t* box = my_c + bx * kCBoxBytes;
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // 16-byte chunks 2j and 2j + 1 of the box's rows
          const int c = (round * kCBoxes + bx) * 8 + 2 * j;  // the first of the two 8-column groups
          uint32_t r[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int a = 4 * (c + q / 2) + 2 * (q % 2);  // accumulator registers a, a + 1
            __half2 v;
            if constexpr (kGlu) {
              v = __halves2half2(glu(acc[a], acc[a + 64]), glu(acc[a + 1], acc[a + 65]));  // up: 128 columns on
            } else {
              v = __floats2half2_rn(acc[a], acc[a + 1]);
            }
            r[q] = *reinterpret_cast<uint32_t*>(&v);
          }
          stmatrix_x4(box + sw128_offset(st_row, 2 * j + st_chunk), r[0], r[1], r[2], r[3]);
        }
      }
      fence_proxy_async_smem();
      named_bar_sync(1 + cw, 128);
      if (t == 0) {
#pragma unroll
        for (int bx = 0; bx < kCBoxes; ++bx)
          tma_store_2d(&p.c, my_c + bx * kCBoxBytes, col0 + (round * kCBoxes + bx) * 64, w.slot0 + cw * 64);
        bulk_commit();
      }
    }
  }
  if (t == 0) bulk_wait<0>();  // the stores have left shared memory and landed before the CTA exits
}

}  // namespace moe
