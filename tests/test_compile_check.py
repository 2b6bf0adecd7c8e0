"""`kbench gen --check` (compile_check.py): ptxas's report parsed, the SASS counted, and the whole check on a small
backend of one's own (nvcc needed, no GPU)."""
from __future__ import annotations

import dataclasses
import shutil
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench import cli, compile_check, generator

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperv
    24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z4gemmPf' for 'sm_90a'
ptxas info    : Function properties for _Z4gemmPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to the presence \
of Extern calls in the function '_Z4gemmPf'
ptxas info    : Used 168 registers, used 16 barriers
ptxas info    : Compile time = 214.741 ms
ptxas info    : Compiling entry function '_Z5spillPf' for 'sm_90a'
ptxas info    : Function properties for _Z5spillPf
    112 bytes stack frame, 108 bytes spill stores, 128 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 112 bytes cumulative stack size
"""

SASS = """\
\tcode for sm_90a
\t\tFunction : _Z4gemmPf
\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   UTMALDG.2D [UR8], [UR14] ;             /* 0x0000000e080075b4 */
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0030*/              @!P0 QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24, gsb0 ;
        /*0040*/                   EXIT ;
\t\tFunction : _Z5spillPf
        /*0000*/                   STL [R1], R2 ;
        /*0010*/               @P1 LDL.64 R4, [R1+0x8] ;
        /*0020*/                   HMMA.16816.F32 R8, R12, R16, R8 ;
"""


def test_ptxas_report_gives_each_entry_its_resources_and_advisories():
    gemm, spill = compile_check.parse_ptxas(PTXAS)  # the device function's properties belong to no kernel
    assert (gemm.name, gemm.registers, gemm.barriers, gemm.stack, gemm.spill_stores) == ("_Z4gemmPf", 168, 16, 0, 0)
    assert gemm.advisories == ["C7510 Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
                               "the presence of Extern calls"]
    assert (spill.registers, spill.stack, spill.spill_stores, spill.spill_loads) == (32, 112, 108, 128)
    assert compile_check.warnings(spill) == ["spills 108 B stored / 128 B loaded"]
    assert compile_check.warnings(gemm) == gemm.advisories


def test_sass_counts_opcodes_with_modifiers_and_predicates():
    counts = compile_check.count_sass(SASS)
    assert counts["_Z4gemmPf"] == Counter({"GMMA": 2, "MMA": 0, "TMA": 1, "local": 0})  # HGMMA + QGMMA
    assert counts["_Z5spillPf"] == Counter({"GMMA": 0, "MMA": 1, "TMA": 0, "local": 2})


def test_demangled_names_drop_their_parameters():
    assert compile_check._drop_parameters("void ns::k<64, (bool)1>(CUtensorMap_st, int)") == "ns::k<64, (bool)1>"
    assert compile_check._drop_parameters("f(int)") == "f"


# ------------------------------------------------------------------------------------------------------------
# the whole check on a backend of one's own

BACKEND = {
    "kernel.yml": """
        template: load_inline
        entry: entry.py
        cuda_sources: [kernel.cu]
        cpp_sources: [binding.cpp]
        functions: [run]
        flags:
          common: {cuda_cflags: [-O3]}
          h100: {cuda_cflags: ["-gencode=arch=compute_90a,code=sm_90a"]}
        """,
    "kernel.cu": """
        #include "body.cuh"
        void launch(const float* x, float* y, int n) { spill_kernel<<<1, 1024>>>(x, y, n); }
        """,
    # 48 live values in the 32 registers a thread that __launch_bounds__(1024, 2) leaves: ptxas spills
    "body.cuh": """
        __global__ void __launch_bounds__(1024, 2) spill_kernel(const float* x, float* y, int n) {
            float acc[48];
        #pragma unroll
            for (int j = 0; j < 48; ++j) acc[j] = x[threadIdx.x + j * n];
            float s = 0.f;
        #pragma unroll
            for (int j = 0; j < 48; ++j) s += acc[j] * acc[(j * 7) % 48];
            y[threadIdx.x] = s;
        }
        """,
    "binding.cpp": """
        #include <torch/extension.h>
        void launch(const float* x, float* y, int n);
        torch::Tensor run(torch::Tensor x) { return x; }
        """,
    "entry.py": "def custom_kernel(data):\n    return ext.run(data)\n",
}


@pytest.fixture
def own_kernels(tmp_path):
    folder = tmp_path / "kernels" / "fp8-mm" / "spilly"
    folder.mkdir(parents=True)
    for name, text in BACKEND.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return tmp_path / "kernels"


def gen_check(kernels: Path, out: Path):
    return CliRunner().invoke(cli.main, ["gen", "fp8-mm", "--backend", "spilly", "--kernels", str(kernels),
                                         "-o", str(out), "--check"])


@needs_nvcc
def test_check_reports_the_kernel_and_warns_of_its_spills(own_kernels, tmp_path):
    r = gen_check(own_kernels, tmp_path / "submission.py")
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if "spill_kernel" in line and "│" in line)
    assert row.split("│")[2].strip() == "32"  # registers
    assert "warning spill_kernel: spills" in r.output
    assert (tmp_path / "submission.py").is_file()  # the submission is written as without --check


@needs_nvcc
def test_check_shows_nvcc_errors_at_the_real_file(own_kernels, tmp_path):
    body = own_kernels / "fp8-mm/spilly/body.cuh"
    body.write_text(body.read_text().replace("float s = 0.f;", "float s = 0.f +;"))
    r = gen_check(own_kernels, tmp_path / "submission.py")
    assert r.exit_code == 2, r.output
    error = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "nvcc rejected fp8-mm/spilly's CUDA source (fix and run again)" in error[0]
    assert "<kernels/fp8-mm/spilly/body.cuh>(5): error: expected an expression" in r.output, r.output


def test_check_refuses_what_it_cannot_compile(tmp_path):
    torch_backend = generator.load_build("fp8-mm", "torch", "h100")
    with pytest.raises(generator.GeneratorError, match="no cuda_sources"):
        compile_check.check(torch_backend)
    cuda_for_amd = dataclasses.replace(generator.load_build("fp8-mm", "cuda", "h100"), target="mi300x")
    with pytest.raises(generator.GeneratorError, match="not mi300x"):
        compile_check.nvcc_command(cuda_for_amd, "packed.cu", "packed.cubin")


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("cuobjdump") is None,
                    reason="nvcc and cuobjdump (the CUDA toolkit's binary utilities) not on PATH")
def test_a_shipped_hopper_gemm_issues_warpgroup_mma_and_tma():
    kernels = compile_check.check(generator.load_build("fp8-mm", "cuda", "h100"))
    gemms = [k for k in kernels if "fp8_gemm_kernel" in k.name]  # HGMMA on the exact path, QGMMA on the fp8 one
    assert gemms and all(k.sass["GMMA"] > 0 and k.sass["TMA"] > 0 and k.sass["local"] == 0 for k in gemms)
    assert not any(compile_check.warnings(k) for k in gemms)
