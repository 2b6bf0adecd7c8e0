// Which (group, m-tile, n-tile) a grouped GEMM's work unit stands for, in plain C++ (CPU-tested:
// tests/test_moe_unit_order.py): grouped_gemm.cuh's roles all decode units here, so producer, consumers and epilogue
// warps agree.
#pragma once

#ifdef __CUDACC__
#define MOE_HD __host__ __device__ __forceinline__
#else
#define MOE_HD inline
#endif

namespace moe {

struct Unit {
  int g, mt, nt, rows;  // group, m-tile within it, n-tile, the group's row count
  int row0;             // the group's first sorted row
};

// meta: [0, G] the groups' first sorted rows (meta[G]: the end), then [G + 1, 2 G + 1] their first m-tiles. Units go
// group by group, n-tile by n-tile, m-tile fastest: CTAs working at the same time share B tiles (the expert weights,
// read from DRAM once and from L2 by the group's other m-tiles). band > 0 (GemmParams::band): a group of more m-tiles
// than that goes in bands of `band` m-tiles, each band n-tile by n-tile, so that a wave's CTAs read a few m-tiles' A
// rows and a few n-tiles' B instead of all of the group's A for two n-tiles (the shared expert at 8192 tokens: 64
// m-tiles, x's 117 MB from DRAM again every wave; docs/moe-notes.md, twenty-fourth session).
// g_from: a group the unit's is known not to precede (the group of a smaller unit: every role walks its units in
// increasing order), where the scan for the unit's group starts. From 0 the scan was a chain of up to G dependent
// shared-memory loads between one unit's hand-over and the next unit's MMAs (~1.3 us a unit at 33 groups, against
// ~0.5 at one group: docs/moe-notes.md, twenty-seventh session).
MOE_HD Unit decode(const int* meta, int G, int n_tiles, int u, int band = 0, int g_from = 0) {
  const int* mt_off = meta + G + 1;
  const int gm = u / n_tiles;  // which m-tile block, counted over all groups (only to find the group)
  int g = g_from;
  while (g + 1 < G && mt_off[g + 1] <= gm) ++g;
  const int m_tiles = mt_off[g + 1] - mt_off[g];
  const int local = u - mt_off[g] * n_tiles;
  Unit w;
  w.g = g;
  if (band > 0 && m_tiles > band) {
    const int m0 = local / (band * n_tiles) * band;  // the band's first m-tile
    const int in_band = local - m0 * n_tiles;
    const int band_m = band < m_tiles - m0 ? band : m_tiles - m0;
    w.nt = in_band / band_m;
    w.mt = m0 + in_band % band_m;
  } else {
    w.nt = local / m_tiles;
    w.mt = local % m_tiles;
  }
  w.row0 = meta[g];
  w.rows = meta[g + 1] - meta[g];
  return w;
}

}  // namespace moe
