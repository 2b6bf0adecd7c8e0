"""benchmarks/calls.py --timeline's reading of a profile: kernel names shortened, medians per kernel position."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import calls  # noqa: E402


@pytest.mark.parametrize("raw, short", [
    ("void kb::grouped_gemm_kernel<64, true>(kb::GemmParams)", "kb::grouped_gemm_kernel"),
    ("void at::native::(anonymous namespace)::softmax_warp_forward<c10::Half, float>(c10::Half*)",
     "at::native::softmax_warp_forward"),
    ("nvjet_sm90_hsh_32x64_64x16_1x2_h_bz_TNN", "nvjet_sm90_hsh_32x64_64x16_1x2_h_bz_TNN"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
])
def test_short_name_keeps_the_kernels_qualified_name(raw, short):
    assert calls.short_name(raw) == short


def test_summarize_takes_medians_over_the_calls_of_the_usual_sequence():
    usual = [("void k1<1>(int)", 10.0, 5.0, 10.0), ("k2", 20.0, 30.0, 5.0)]
    odd = [("k1", 40.0, 5.0, 40.0)]  # an eager call: another kernel sequence, left out
    timelines = [usual, [(n, s + 2, d + 1, g) for n, s, d, g in usual], odd, [(n, s + 4, d, g) for n, s, d, g in usual],
                 []]
    assert calls.summarize(timelines) == [("k1", 12.0, 5.0, 10.0), ("k2", 22.0, 30.0, 5.0)]
    assert calls.summarize([[], []]) == []
