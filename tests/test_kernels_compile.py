"""Every CUDA file under kernels/ compiles on its own with nvcc (no torch), so kernels are checked without a GPU."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kbench import generator

KERNELS = generator.kernels_root()
CU_FILES = sorted(KERNELS.rglob("*.cu"))
DEVICE_FILES = sorted(CU_FILES + list(KERNELS.rglob("*.cuh")))
# Headers that drag in torch: device code must not need them (the binding .cpp is the only torch-facing file).
TORCH_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](torch/|ATen/|c10/|caffe2/|pybind11/)', re.MULTILINE)


def _ids(paths):
    return [p.relative_to(KERNELS).as_posix() for p in paths]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH; install the CUDA toolkit to compile-check")
@pytest.mark.parametrize("cu", CU_FILES or [None], ids=_ids(CU_FILES) or ["none"])
def test_cu_compiles_with_nvcc(cu, tmp_path):
    if cu is None:
        pytest.skip("no .cu files under kernels/ yet")
    rel = cu.relative_to(KERNELS).parts
    backend_dir = KERNELS / rel[0] / rel[1] if len(rel) > 2 else cu.parent
    includes = [cu.parent, backend_dir]
    if (backend_dir / "kernel.yml").is_file():  # the same search path kbench gen uses
        manifest = generator.load_manifest(backend_dir, str(backend_dir / "kernel.yml"))
        includes += [(backend_dir / d).resolve() for d in manifest.include_dirs]
    cmd = ["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", *(f"-I{d}" for d in includes),
           "-c", str(cu), "-o", str(tmp_path / "x.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"


@pytest.mark.parametrize("path", DEVICE_FILES or [None], ids=_ids(DEVICE_FILES) or ["none"])
def test_device_code_has_no_torch_headers(path):
    if path is None:
        pytest.skip("no .cu/.cuh files under kernels/ yet")
    hit = TORCH_INCLUDE.search(path.read_text(encoding="utf-8"))
    assert hit is None, f"{path}: includes {hit.group(0).strip()!r}; move torch code into the binding .cpp"


def test_torch_include_pattern_catches_torch():
    assert TORCH_INCLUDE.search('#include <cuda.h>\n  #  include <ATen/cuda/CUDAContext.h>\n')
    assert TORCH_INCLUDE.search('#include "torch/extension.h"')
    assert not TORCH_INCLUDE.search('#include <cuda_fp8.h>\n// #include is fine in prose: torch/\n')
