"""CPU tier: the moe grouped GEMMs' unit order (kernels/moe/cuda/unit_order.h, which every role of grouped_gemm.cuh
decodes units with), compiled with the host compiler: every (group, m-tile, n-tile) exactly once, in the order the
notes give (group by group; within a group n-tile by n-tile, m-tile fastest, or in bands of `band` m-tiles where the
group has more); the scan a walk starts from its previous unit's group finds the same units."""
import subprocess

import pytest

from host_cpp import ROOT, build_program

MOE = ROOT / "kernels" / "moe" / "cuda"
KBM = 128  # rows an m-tile (grouped_gemm.cuh kBM)

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "unit_order.h"
int main(int argc, char** argv) {
  // argv: n_tiles band rows_0 rows_1 ...: the groups' row counts
  const int n_tiles = atoi(argv[1]), band = atoi(argv[2]), G = argc - 3;
  std::vector<int> meta(2 * (G + 1));
  for (int g = 0; g < G; ++g) {
    const int rows = atoi(argv[3 + g]);
    meta[g + 1] = meta[g] + rows;
    meta[G + 1 + g + 1] = meta[G + 1 + g] + (rows + 127) / 128;
  }
  const int units = meta[2 * G + 1] * n_tiles;
  for (int u = 0; u < units; ++u) {
    const moe::Unit w = moe::decode(meta.data(), G, n_tiles, u, band);
    printf("%d %d %d %d %d\n", w.g, w.mt, w.nt, w.row0, w.rows);
  }
  // each CTA of a grid of `grid` walks u = c, c + grid, ... starting every scan at its previous unit's group
  for (const int grid : {1, 7, 132}) {
    for (int c = 0; c < grid; ++c) {
      int g = 0;
      for (int u = c; u < units; u += grid) {
        const moe::Unit a = moe::decode(meta.data(), G, n_tiles, u, band), b = moe::decode(meta.data(), G, n_tiles,
                                                                                            u, band, g);
        if (a.g != b.g || a.mt != b.mt || a.nt != b.nt || a.row0 != b.row0 || a.rows != b.rows)
          fprintf(stderr, "grid %d unit %d: hinted decode differs\n", grid, u);
        g = b.g;
      }
    }
  }
  return 0;
}
"""


def expected_order(rows: list[int], n_tiles: int, band: int) -> list[tuple]:
    out, row0 = [], 0
    for g, r in enumerate(rows):
        m_tiles = -(-r // KBM)
        bands = range(0, m_tiles, band) if band > 0 and m_tiles > band else [0]
        for m0 in bands:
            m1 = min(m0 + band, m_tiles) if band > 0 and m_tiles > band else m_tiles
            out += [(g, mt, nt, row0, r) for nt in range(n_tiles) for mt in range(m0, m1)]
        row0 += r
    return out


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    exe = build_program(tmp_path_factory.mktemp("unit_order"), PROGRAM, MOE)

    def run(rows, n_tiles, band):
        proc = subprocess.run([str(exe), str(n_tiles), str(band), *map(str, rows)], capture_output=True, text=True,
                              check=True)
        assert not proc.stderr, proc.stderr  # a walk's hinted decode (g_from) differed from the plain one
        return [tuple(int(v) for v in line.split()) for line in proc.stdout.splitlines()]
    return run


# (rows per group, n-tiles): the official shapes' kinds of group (the shared expert at 8192 tokens: 64 m-tiles), an
# empty group, groups of one row, a last band shorter than the others
@pytest.mark.parametrize("rows,n_tiles", [([8192], 16), ([300, 0, 1, 257, 2048], 28), ([1, 1, 1], 3),
                                          ([129 * 128 + 5, 40], 16)])
@pytest.mark.parametrize("band", [0, 1, 2, 3, 16])
def test_every_unit_once_in_the_documented_order(decoder, rows, n_tiles, band):
    got = decoder(rows, n_tiles, band)
    want = expected_order(rows, n_tiles, band)
    assert got == want
    assert len({u[:3] for u in got}) == len(got)  # (each unit once)


def test_bands_keep_a_wave_on_few_m_tiles(decoder):
    """The reason for bands: at 8192 tokens the shared expert's 1024 units in waves of 132 CTAs. Without bands a wave
    spans all 64 m-tiles (all of x) and ~2 n-tiles; with bands of 16, at most 32 m-tiles and ~9 n-tiles."""
    for band, max_m, max_n in [(0, 64, 3), (16, 32, 10)]:
        units = decoder([8192], 16, band)
        for w0 in range(0, len(units), 132):
            wave = units[w0:w0 + 132]
            assert len({u[1] for u in wave}) <= max_m and len({u[2] for u in wave}) <= max_n
