"""CPU tier: the moe grouped GEMM's shared-memory layout (kernels/moe/cuda/gemm_smem.h, where the kernel takes its
pointers and the host its allocation size), compiled with the host compiler, for every configuration moe.cu launches:
regions in order and disjoint, inside the allocation, aligned as TMA, wgmma and mbarriers need, within 227 KB."""
import subprocess

import pytest

from host_cpp import ROOT, build_program

MOE = ROOT / "kernels" / "moe" / "cuda"
FIELDS = ("a", "b", "c", "row_off", "row_scale", "full", "empty", "stg_full", "stg_empty", "meta", "gather",
          "gather_bar", "end", "bytes")
# (k a stage, stages, asynchronous epilogue): moe.cu's gemm_kernel instances (Ring<kBK>::kAsyncStages stages with the
# asynchronous epilogue: 3 of k 64, 6 of k 32; MoeConfig::stages 3 or 4 with the consumers' own)
CONFIGS = [(64, 3, False), (64, 4, False), (64, 3, True), (32, 6, True)]

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "gemm_smem.h"
int main(int argc, char** argv) {
  const moe::GemmSmem s = moe::gemm_smem(atoi(argv[1]), atoi(argv[2]), atoi(argv[3]) != 0);
  printf("%d %d %d %d %d %d %d %d %d %d %d %d %d %d\n", s.a, s.b, s.c, s.row_off, s.row_scale, s.full, s.empty,
         s.stg_full, s.stg_empty, s.meta, s.gather, s.gather_bar, s.end, s.bytes);
  printf("%d %d %d %d %d %d\n", moe::a_tile_bytes(atoi(argv[1])), moe::b_tile_bytes(atoi(argv[1])), moe::kCBytes,
         moe::kStageCBytes, moe::kGatherChains * moe::kGatherBytes, moe::kSmemLimit);
  return 0;
}
"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    exe = build_program(tmp_path_factory.mktemp("gemm_smem"), PROGRAM, MOE)

    def run(bk, stages, async_epi):
        out = subprocess.run([str(exe), str(bk), str(stages), str(int(async_epi))], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        offsets = dict(zip(FIELDS, map(int, out[0].split())))
        a_bytes, b_bytes, c_bytes, stage_c_bytes, gather_bytes, limit = map(int, out[1].split())
        return offsets, a_bytes, b_bytes, c_bytes, stage_c_bytes, gather_bytes, limit
    return run


@pytest.mark.parametrize("bk,stages,async_epi", CONFIGS)
def test_regions_are_disjoint_aligned_and_inside_the_allocation(layout, bk, stages, async_epi):
    s, a_bytes, b_bytes, c_bytes, stage_c_bytes, gather_bytes, limit = layout(bk, stages, async_epi)
    # (region, size, alignment); a configuration without a region has it at -1
    regions = [("a", stages * a_bytes, 1024), ("b", stages * b_bytes, 1024),
               ("c", 2 * (stage_c_bytes if async_epi else c_bytes), 16),
               ("row_off", 128 * 8, 8), ("row_scale", 128 * 4, 4), ("full", stages * 8, 8), ("empty", stages * 8, 8),
               ("stg_full", 2 * 8, 8), ("stg_empty", 2 * 8, 8), ("meta", 2 * 66 * 4, 4),
               ("gather", gather_bytes, 128), ("gather_bar", 3 * 8, 8)]
    async_only = {"row_off", "row_scale", "stg_full", "stg_empty", "gather", "gather_bar"}
    present = []
    for name, size, align in regions:
        if name in async_only and not async_epi:
            assert s[name] == -1, f"{name} exists without the asynchronous epilogue"
            continue
        assert s[name] >= 0 and s[name] % align == 0, f"{name} at {s[name]} is not {align}-byte aligned"
        present.append((s[name], s[name] + size, name))
    present.sort()
    for (_, end, name), (start, _, nxt) in zip(present, present[1:]):
        assert end <= start, f"{name} overlaps {nxt}"
    assert present[-1][1] <= s["end"], f"{present[-1][2]} runs past the end"
    # the base moves up to 1024 bytes into the allocation, so the launch asks for that much more
    assert s["bytes"] == 1024 + s["end"] <= limit


def test_the_asynchronous_ring_keeps_144_kb_in_flight(layout):
    """Both asynchronous configurations hold 144 KB of A and B tiles (3 x 48 KB or 6 x 24 KB: the notes' ring)."""
    for bk, stages in [(64, 3), (32, 6)]:
        s = layout(bk, stages, True)[0]
        assert s["c"] - s["a"] == 144 * 1024
