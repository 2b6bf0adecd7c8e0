"""The CPU tier's host C++ programs: kernel headers written as plain C++ (knobs.h, unit_order.h, gemm_smem.h) are
compiled with the host compiler beside a small main and run, so their logic is tested without a GPU."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HAVE_CXX = shutil.which("c++") is not None
NO_CXX = "no host C++ compiler on PATH"


def build_program(tmp_dir: Path, source: str, *include_dirs: Path) -> Path:
    """Compiles `source` (C++17) against `include_dirs` into an executable in tmp_dir and returns its path; skips the
    calling test where the machine has no host compiler."""
    if not HAVE_CXX:
        pytest.skip(NO_CXX)
    src, exe = tmp_dir / "program.cpp", tmp_dir / "program"
    src.write_text(source)
    subprocess.run(["c++", "-std=c++17", *(f"-I{d}" for d in include_dirs), str(src), "-o", str(exe)], check=True)
    return exe
