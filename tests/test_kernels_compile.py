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
    cmd = ["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
           *(f"-I{d}" for d in includes), "-c", str(cu), "-o", str(tmp_path / "x.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
    # What ptxas reports only as "info": wgmma serialized or waits injected (C7510-C7520), setmaxnreg ignored
    # (C7508), registers spilled to local memory. Each silently costs a Hopper kernel much of its speed.
    notes = sorted({m.group(0) for m in PTXAS_COSTLY.finditer(r.stdout + r.stderr)})
    assert not notes, f"{cu.name}: ptxas reports costs: {notes}"


# ptxas's performance notes, and a non-zero spill count
PTXAS_COSTLY = re.compile(r"\((C75(?:0[89]|1\d|20))\)|([1-9]\d* bytes spill (?:stores|loads))")


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


def _bindings():
    out = []
    for problem in generator.list_problems():
        for backend in generator.list_backends(problem):
            bdir = generator.backend_dir(problem, backend)
            manifest = generator.load_manifest(bdir, str(bdir / "kernel.yml"))
            names = manifest.functions + manifest.dev.get("functions", [])
            out += [(bdir, src, [(bdir / d).resolve() for d in manifest.include_dirs], names)
                    for src in manifest.cpp_sources]
    return out


BINDINGS = _bindings()


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
@pytest.mark.parametrize("bdir,src,dirs,names", BINDINGS or [(None, None, None, None)],
                         ids=[f"{b.parent.name}/{b.name}/{s}" for b, s, _, _ in BINDINGS] or ["none"])
def test_binding_compiles_against_torch_headers(bdir, src, dirs, names, tmp_path):
    """The torch-facing .cpp of every load_inline backend, with its dev entry points and the module definition
    load_inline writes for the manifest's functions (``torch::wrap_pybind_function(name)``: a name that is also a C
    function's is ambiguous there), passes g++'s syntax check against the installed torch's headers (a CPU torch
    has the CUDA headers too; one generated header, which only a CUDA build of torch writes, is stubbed)."""
    if bdir is None:
        pytest.skip("no load_inline backend")
    import sysconfig

    import torch.utils.cpp_extension as ext

    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cuda_home = ext.CUDA_HOME or "/usr/local/cuda"
    includes = [tmp_path, *ext.include_paths(), Path(cuda_home) / "include", sysconfig.get_paths()["include"], bdir,
                *dirs]
    main = tmp_path / "main.cpp"
    main.write_text(f'#include <torch/extension.h>\n#include "{bdir / src}"\n'
                    "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n" +
                    "".join(f'  m.def("{n}", torch::wrap_pybind_function({n}), "{n}");\n' for n in names) + "}\n")
    cmd = ["g++", "-std=c++20", "-fsyntax-only", "-DKBENCH_DEV", "-DTORCH_EXTENSION_NAME=kbench_check",
           *(f"-I{d}" for d in includes), str(main)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert r.returncode == 0, "\n".join(errors[:20]) or r.stderr[-3000:]
