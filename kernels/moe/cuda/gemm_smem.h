// Where each region of a grouped GEMM block's dynamic shared memory lies (grouped_gemm.cuh), in plain C++: the
// kernel takes its pointers from here and the host its allocation size, so the two cannot disagree (a region the
// kernel touched past the size the host asked for was an illegal address: docs/moe-notes.md, twenty-eighth session).
// CPU-tested (tests/test_moe_gemm_smem.py): regions in order, disjoint, aligned as TMA and wgmma need, within 227 KB.
#pragma once

#ifdef __CUDACC__
#define MOE_SMEM_HD __host__ __device__ __forceinline__
#else
#define MOE_SMEM_HD inline
#endif

namespace moe {

constexpr int kMaxGroups = 65;  // kMoeMaxRouted routed experts + the shared one
constexpr int kBM = 128;        // rows per tile: two consumer warpgroups x 64
constexpr int kCPitch = 64 * 2 + 16;            // epilogue staging row: 64 fp16 + 16 bytes (conflict-free writes)
constexpr int kCBytes = 64 * kCPitch;           // per consumer warpgroup
constexpr int kStagePitch = 256 * 2 + 16;       // kAsync staging row: 256 fp16 + 16 bytes (conflict-free writes)
constexpr int kStageCBytes = 64 * kStagePitch;  // kAsync: per consumer warpgroup, its 64 rows x 256 columns
constexpr int kEpiThreads = 96;                 // kAsync: the producer warpgroup's warps 1-3
constexpr int kGatherChains = kEpiThreads / 32;  // kAsync: the gather's copy chains, one a drain warp (its lane 0)
constexpr int kGatherBytes = 4096;              // kAsync: a chain's bounce buffer (a row goes in pieces of this)
constexpr int kSmemLimit = 232448;              // the dynamic shared memory a block may have on sm_90 (227 KB)

// A ring stage's A tile (kBM rows x bk of k, fp16) and B tile (four TMA boxes of bk k-rows x 64 columns).
MOE_SMEM_HD constexpr int a_tile_bytes(int bk) { return kBM * bk * 2; }
MOE_SMEM_HD constexpr int b_tile_bytes(int bk) { return 4 * bk * 64 * 2; }

// Byte offsets from the block's 1024-aligned base (the allocation's start moved up to the next multiple of 1024, so
// `bytes` holds 1024 more than the regions' end). Regions that a configuration does not have are -1.
struct GemmSmem {
  int a;          // the ring's A tiles, stages of them (1024-aligned: TMA's 128-byte swizzle, wgmma descriptors)
  int b;          // the ring's B tiles, stages of them (1024-aligned)
  int c;          // the epilogue's staging: 2 x kCBytes, or (async) one kStageCBytes a consumer warpgroup
  int row_off;    // async: each tile row's output offset (int64), kBM of them
  int row_scale;  // async: each tile row's score (half2), kBM of them
  int full;       // the ring's full barriers, stages of them (uint64)
  int empty;      // the ring's empty barriers, stages of them
  int stg_full;   // async: the staged rows are there, one barrier a consumer warpgroup
  int stg_empty;  // async: the epilogue warps are done with them
  int meta;       // the launch's group meta, 2 (kMaxGroups + 1) int32
  int gather;     // async: the gather chains' bounce buffers, kGatherChains x kGatherBytes (128-aligned)
  int gather_bar; // async: their barriers, one a chain
  int end;        // the regions' end
  int bytes;      // the allocation the launch asks for: 1024 + end
};

MOE_SMEM_HD constexpr GemmSmem gemm_smem(int bk, int stages, bool async) {
  GemmSmem s{};
  s.a = 0;
  s.b = s.a + stages * a_tile_bytes(bk);
  s.c = s.b + stages * b_tile_bytes(bk);
  int at = s.c + (async ? 2 * kStageCBytes : 2 * kCBytes);
  s.row_off = async ? at : -1;
  s.row_scale = async ? at + kBM * 8 : -1;
  if (async) at += kBM * 16;  // (12 bytes a row used, 16 kept: the layout the kernels were measured with)
  s.full = at;
  s.empty = s.full + stages * 8;
  at = s.empty + stages * 8;
  s.stg_full = async ? at : -1;
  s.stg_empty = async ? at + 2 * 8 : -1;
  if (async) at += 4 * 8;
  s.meta = at;
  at += 2 * (kMaxGroups + 1) * 4;
  s.gather = async ? (at + 127) / 128 * 128 : -1;
  s.gather_bar = async ? s.gather + kGatherChains * kGatherBytes : -1;
  if (async) at = s.gather_bar + kGatherChains * 8;
  s.end = at;
  s.bytes = 1024 + at;
  return s;
}

}  // namespace moe
