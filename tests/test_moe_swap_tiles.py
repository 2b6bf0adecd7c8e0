"""CPU tier: how the swap candidate's GEMMs tile a group's tokens and number their units (kernels/moe/cuda/
swap_tiles.h, which every role of swap_gemm.cuh decodes with), compiled with the host compiler: each token of each
group in exactly one tile of each feature tile, a group of up to 288 rows in one tile (256 in the main MMA, the rest
in the narrow one), the MMA widths covering the tile, and the scan from a walk's previous group finding the same
units."""
import subprocess

import pytest

from host_cpp import ROOT, build_program

MOE = ROOT / "kernels" / "moe" / "cuda"

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "swap_tiles.h"
int main(int argc, char** argv) {
  // argv: f_tiles rows_0 rows_1 ...: the groups' row counts
  using namespace moe::swap;
  const int f_tiles = atoi(argv[1]), G = argc - 2;
  std::vector<int> rows_at(G + 1), tiles_at(G + 1);
  for (int g = 0; g < G; ++g) {
    const int rows = atoi(argv[2 + g]);
    rows_at[g + 1] = rows_at[g] + rows;
    tiles_at[g + 1] = tiles_at[g] + group_tiles(rows);
  }
  const int units = tiles_at[G] * f_tiles;
  for (int u = 0; u < units; ++u) {
    const SwapUnit w = decode_swap(rows_at.data(), tiles_at.data(), G, f_tiles, u);
    printf("%d %d %d %d %d %d %d %d %d\n", w.g, w.ft, w.tt, w.row0, w.rows, w.t0, w.size, main_n(w.size),
           fold_n(w.size));
  }
  for (const int grid : {1, 7, 132}) {
    for (int c = 0; c < grid; ++c) {
      int g = 0;
      for (int u = c; u < units; u += grid) {
        const SwapUnit a = decode_swap(rows_at.data(), tiles_at.data(), G, f_tiles, u);
        const SwapUnit b = decode_swap(rows_at.data(), tiles_at.data(), G, f_tiles, u, g);
        if (a.g != b.g || a.ft != b.ft || a.tt != b.tt || a.t0 != b.t0 || a.size != b.size)
          fprintf(stderr, "grid %d unit %d: hinted decode differs\n", grid, u);
        g = b.g;
      }
    }
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    exe = build_program(tmp_path_factory.mktemp("swap_tiles"), PROGRAM, MOE)

    def run(rows, f_tiles):
        proc = subprocess.run([str(exe), str(f_tiles), *map(str, rows)], capture_output=True, text=True, check=True)
        assert not proc.stderr, proc.stderr
        return [tuple(int(v) for v in line.split()) for line in proc.stdout.splitlines()]
    return run


# the 2048-token case's groups (228-279 rows), the shared expert at 2048 tokens in GEMM 2, an empty group, one row,
# the fold's edges (256, 257, 272, 273, 288, 289) and a group of many tiles
@pytest.mark.parametrize("rows", [[228, 279, 256, 2048], [0, 1, 0, 7], [256, 257, 272, 273, 288, 289],
                                  [1100, 544, 545]])
def test_every_token_once_a_feature_tile_in_the_documented_order(decoder, rows):
    f_tiles = 3
    units = decoder(rows, f_tiles)
    row0, i = 0, 0
    for g, r in enumerate(rows):
        tiles = 0 if r == 0 else 1 if r <= 288 else -(-(r - 32) // 256)
        for ft in range(f_tiles):
            covered = []
            for tt in range(tiles):
                ug, uft, utt, urow0, urows, t0, size, n, nf = units[i]
                i += 1
                assert (ug, uft, utt, urow0, urows) == (g, ft, tt, row0, r)
                assert 1 <= size <= 288 and (size == 256 or tt == tiles - 1)
                assert n >= min(size, 256) and n % 16 == 0 and n <= 256  # the main MMA covers the first 256
                assert nf == (0 if size <= 256 else 16 if size <= 272 else 32)
                covered += range(t0, t0 + size)
            assert covered == list(range(r))
        row0 += r
    assert i == len(units)


def test_the_2048_token_groups_are_one_tile_each(decoder):
    """The candidate's point: a group of 228-279 rows is one unit a feature tile (grouped_gemm.cuh gives 257-279 rows
    a third m-tile), its first 256 tokens in an m64n256 MMA and the tail in an n16 / n32 one."""
    units = decoder([228, 257, 279], 1)
    assert [(u[6], u[7], u[8]) for u in units] == [(228, 240, 0), (257, 256, 16), (279, 256, 32)]
