"""benchmarks/flashinfer_moe_build.py's edit of flashinfer's build.ninja (the part that runs without flashinfer)."""
import pathlib

import pytest
from load_file import load_file

build = load_file("benchmarks/flashinfer_moe_build.py", "flashinfer_moe_build")

# the lines of flashinfer 0.5.3's generated build.ninja that the edit anchors on
NINJA = """ninja_required_version = 1.3
name = fused_moe_90
cuda_home = /usr/local
nvcc = $cuda_home/bin/nvcc
common_cflags = -DPy_LIMITED_API=0x03090000 $
    -isystem $cuda_home/include $
    -isystem $cuda_home/include/cccl
ldflags = -shared $
    -L$cuda_home/lib64 $
    -L$cuda_home/lib64/stubs $
    -lcuda
"""


def test_the_edit_sets_cuda_home_adds_the_headers_and_links_the_stand_ins():
    text = build.patch_ninja(NINJA, pathlib.Path("/opt/cuda"), pathlib.Path("/h/include"), pathlib.Path("/s"))
    lines = text.splitlines()
    assert lines[2] == "cuda_home = /opt/cuda" and lines[3] == "#cuda_home = /usr/local"
    assert lines.index("    -isystem /h/include $") == lines.index("    -isystem $cuda_home/include $") + 1
    assert "    -L/s $" in lines and "stubs" not in text


def test_a_changed_layout_stops_the_build_naming_the_anchor():
    with pytest.raises(SystemExit, match="lib64/stubs"):
        build.patch_ninja(NINJA.replace("/stubs", ""), pathlib.Path("/c"), pathlib.Path("/h"), pathlib.Path("/s"))
