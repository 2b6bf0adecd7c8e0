// How swap_gemm.cuh tiles a group's tokens and numbers its work units, in plain C++ (CPU-tested:
// tests/test_moe_swap_tiles.py), so that its producer, consumers and epilogue warps agree.
//
// The weights are the MMA's M side there and a group's tokens its N side, so a tile's width follows the group's rows
// in steps of 16 instead of grouped_gemm.cuh's 128-row m-tiles. A group of up to kTileN + kFold rows is one tile: the
// first 256 tokens in one m64n256 MMA a k16 step and the rest (the 2048-token case's groups end 1-23 rows past 256)
// in a second, narrow one (n16 or n32) beside it, so the group's weights are read by one unit per feature tile and
// no unit waits on another's loads (the twenty-first session's even split made two half-width units read each
// weight tile: docs/moe-notes.md).
#pragma once

#ifdef __CUDACC__
#define SWAP_HD __host__ __device__ __forceinline__
#else
#define SWAP_HD inline
#endif

namespace moe {
namespace swap {

constexpr int kTileN = 256;  // tokens of a tile's main MMA at most: wgmma's widest N
constexpr int kFold = 32;    // more tokens a group's last tile takes in its narrow MMA

// Token tiles of a group of `rows` rows: 256 each, but the last, which takes the rest (1 .. kTileN + kFold).
SWAP_HD int group_tiles(int rows) {
  if (rows <= 0) return 0;
  if (rows <= kTileN + kFold) return 1;
  return (rows - kFold + kTileN - 1) / kTileN;
}

// The main MMA's N for a tile of `size` tokens (the instantiations swap_gemm.cuh has) and the narrow MMA's (0: none).
SWAP_HD int main_n(int size) {
  const int s = size < kTileN ? size : kTileN;
  return s <= 64 ? 64 : s <= 96 ? 96 : s <= 128 ? 128 : (s + 15) / 16 * 16;
}
SWAP_HD int fold_n(int size) { return size <= kTileN ? 0 : size - kTileN <= 16 ? 16 : 32; }

struct SwapUnit {
  int g, ft, tt;   // group, feature tile, token tile
  int row0, rows;  // the group's first sorted row and its row count
  int t0, size;    // the tile's first token within the group and its token count
};

// row_start: [0, G] the groups' first sorted rows ([G]: the end); tile_start: [0, G] the prefix of group_tiles.
// Units go group by group, feature tile by feature tile, token tile fastest. g_from: a group the unit's is known not
// to precede (every role walks its units in increasing order), where the scan starts.
SWAP_HD SwapUnit decode_swap(const int* row_start, const int* tile_start, int G, int f_tiles, int u, int g_from = 0) {
  const int gt = u / f_tiles;
  int g = g_from;
  while (g + 1 < G && tile_start[g + 1] <= gt) ++g;
  const int tiles = tile_start[g + 1] - tile_start[g];
  const int local = u - tile_start[g] * f_tiles;
  SwapUnit w;
  w.g = g;
  w.ft = local / tiles;
  w.tt = local % tiles;
  w.row0 = row_start[g];
  w.rows = row_start[g + 1] - row_start[g];
  w.t0 = w.tt * kTileN;
  w.size = w.tt + 1 < tiles ? kTileN : w.rows - w.t0;
  return w;
}

}  // namespace swap
}  // namespace moe
