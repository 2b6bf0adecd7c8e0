"""Build FlashInfer's sm90 CUTLASS fused-MoE module (the peer benchmarks/moe.py times) on a CPU machine, with only the
kernels the moe problem can use: fp16 x fp16 grouped GEMMs (72 TMA warp-specialized ones, 15 SM80 fused-SiLU ones).

    python benchmarks/flashinfer_moe_build.py --wheels .whl --out .whl/fused_moe_90.tgz

Why here: the full module is 171 translation units (every dtype FlashInfer serves); the device machines built 42 and
143 of them in one 10-minute call (docs/moe-notes.md, thirty-second session). This keeps 25 of them (~25 minutes on
2 cores, no GPU needed). The other dtypes' launchers stay undefined symbols: tvm_ffi opens modules with RTLD_LAZY and
the module is linked with -z lazy, so only a call into them would fail (benchmarks/moe.py makes none).

Needs: nvcc (CUDA 13), the flashinfer-python and apache-tvm-ffi wheels in --wheels (installed into a private target
folder here), and the cuBLAS / cuRAND / NVRTC headers, which a CPU machine's CUDA lacks (taken from the nvidia-*
wheels pip can download). libcuda and libnvrtc are linked against empty stand-ins with their sonames, so the module
names the real ones, found on the GPU machine at load time.

The device side (benchmarks/gpu_session.sh part moe-peer) installs the same wheels and unpacks the archive into
flashinfer's AOT folder (flashinfer/data/aot/fused_moe_90/), where get_cutlass_fused_moe_module('90') loads it
without building.
"""
from __future__ import annotations

import argparse
import glob
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile

HEADER_WHEELS = ("nvidia-cublas", "nvidia-curand", "nvidia-cuda-nvrtc")
KEPT_SOURCES_OTHER_THAN_GENERATED = {  # the fixed sources the fp16 path needs (the rest serve other dtypes)
    "moe_gemm_tma_warp_specialized_input.cu", "moe_gemm_kernels_fp16_fp16.cu",
    "flashinfer_cutlass_fused_moe_sm100_binding.cu", "cutlass_fused_moe_instantiation.cu", "envUtils.cpp",
    "logger.cpp", "stringUtils.cpp", "tllmException.cpp", "memoryUtils.cu", "preQuantScaleKernel.cu",
    "cutlass_heuristic.cpp", "lora.cpp"}

# Run inside the target folder's Python (flashinfer importable there): writes the module's ninja file and prints its
# path. The generator's op lists are filtered before it writes the generated sources.
GENERATE = r"""
import sys
import flashinfer.jit.gemm.cutlass.generate_kernels as gk
from flashinfer.jit.gemm.cutlass.cutlass_library import DataType, GemmKind
sm90, sm80 = gk.generate_sm90_operations, gk.generate_sm80_operations
gk.generate_sm90_operations = lambda on: [op for op in sm90(on) if op.gemm_kind == GemmKind.Grouped
                                          and op.act_type == DataType.f16 and op.weight_type == DataType.f16]
gk.generate_sm80_operations = lambda on: [op for op in sm80(on) if op.dtype == DataType.f16
                                          and op.epi_tag == gk.TrtLlm_EpilogueTag.epilogue_op_silu]
from flashinfer.jit import fused_moe
spec = fused_moe.gen_cutlass_fused_moe_sm90_module()
keep = set(sys.argv[1].split(","))
spec.sources = [s for s in spec.sources if s.name in keep or s.name.endswith(".generated.cu")]
spec.extra_ldflags = list(spec.extra_ldflags or []) + ["-Wl,-z,lazy"]
spec.write_ninja()
print(spec.ninja_path)
"""


def sh(*cmd, **kw):
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


def header_dir(work: pathlib.Path) -> pathlib.Path:
    """The cuBLAS, cuRAND and NVRTC headers (pip download of their wheels, the include folders unpacked)."""
    wheels, inc = work / "wheels", work / "headers"
    sh(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", wheels, *HEADER_WHEELS)
    for whl in wheels.glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            z.extractall(inc, [n for n in z.namelist() if "/include/" in n])
    found = sorted({p.parent for p in inc.rglob("cublasLt.h")})
    if not found:
        raise SystemExit("no cublasLt.h in the downloaded nvidia-cublas wheel; pass --headers DIR")
    return found[0]


def stub_libs(work: pathlib.Path) -> pathlib.Path:
    """Empty libcuda.so / libnvrtc.so with the real libraries' sonames (the CPU machine has neither)."""
    stubs = work / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    (stubs / "empty.c").write_text("")
    for lib, soname in (("libcuda.so", "libcuda.so.1"), ("libnvrtc.so", "libnvrtc.so.13")):
        sh("cc", "-shared", "-o", stubs / lib, f"-Wl,-soname,{soname}", stubs / "empty.c")
    return stubs


def patch_ninja(text: str, cuda_home: pathlib.Path, headers: pathlib.Path, stubs: pathlib.Path) -> str:
    """flashinfer's build.ninja for this machine: the CUDA home (flashinfer guesses nvcc's parent folder), the headers
    the CPU machine's CUDA lacks, the stand-in libcuda / libnvrtc folder. Each anchor must be there exactly once."""
    edits = (("\ncuda_home = ", f"\ncuda_home = {cuda_home}\n#cuda_home = "),
             ("    -isystem $cuda_home/include $\n", f"    -isystem $cuda_home/include $\n    -isystem {headers} $\n"),
             ("-L$cuda_home/lib64/stubs", f"-L{stubs}"))
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"build.ninja: expected one {old.strip()!r}; flashinfer's ninja layout changed")
        text = text.replace(old, new)
    return text


def missing_symbols(so: pathlib.Path) -> list[str]:
    """The C++ symbols `so` uses and no library defines: the other dtypes' runners (unversioned: a symbol resolved
    from a linked library carries that library's version)."""
    out = subprocess.run(["nm", "-u", str(so)], check=True, capture_output=True, text=True).stdout
    names = (fields[-1] for fields in map(str.split, out.splitlines()) if fields)
    return sorted({name for name in names if name.startswith("_Z") and "@" not in name})


def stand_ins_asm(symbols: list[str]) -> str:
    """An assembly file defining each symbol as a function that traps. Lazy binding alone is not enough: the other
    dtypes' runner classes are in vtables, whose relocations are bound when the module loads (the first device
    run failed there: `undefined symbol: ...CutlassFp8BlockScaleGemmRunner...gemm`)."""
    body = "".join(f".globl {s}\n.type {s},@function\n{s}:\n    ud2\n" for s in symbols)
    return body + '.section .note.GNU-stack,"",@progbits\n'  # (else the module asks for an executable stack)


def relink_with_stand_ins(ninja: pathlib.Path, ninja_path: pathlib.Path, so: pathlib.Path) -> None:
    symbols = missing_symbols(so)
    asm = ninja_path.parent / "missing_stand_ins.S"
    asm.write_text(stand_ins_asm(symbols))
    sh("cc", "-c", asm, "-o", asm.with_suffix(".o"))
    link = subprocess.run([str(ninja), "-f", str(ninja_path), "-t", "commands", f"{so.parent.name}/{so.name}"],
                          cwd=ninja_path.parent.parent, check=True, capture_output=True, text=True)
    sh("sh", "-c", f"{link.stdout.strip().splitlines()[-1]} {asm.with_suffix('.o')}", cwd=ninja_path.parent.parent)
    left = missing_symbols(so)
    print(f"{len(symbols)} symbols of other dtypes stood in for; {len(left)} left undefined", flush=True)
    if left:
        raise SystemExit(f"still undefined after the relink: {left[:3]}")


def pack(so: pathlib.Path, out: pathlib.Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        tar.add(so, arcname=so.name)
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB ({so.stat().st_size / 2**20:.1f} MiB unpacked)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", default=".whl", help="folder with the flashinfer-python and apache-tvm-ffi wheels")
    ap.add_argument("--out", default=".whl/fused_moe_90.tgz", help="archive of fused_moe_90.so to carry")
    ap.add_argument("--work", default=None, help="build folder (default: a new temporary one)")
    ap.add_argument("--headers", default=None, help="a folder with cublasLt.h, curand_kernel.h, nvrtc.h")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="fi_moe_")).resolve()
    site = work / "site"
    wheels = sorted(glob.glob(f"{args.wheels}/flashinfer_python-*.whl")) + \
        sorted(glob.glob(f"{args.wheels}/apache_tvm_ffi-*.whl"))
    if len(wheels) < 2:
        raise SystemExit(f"need the flashinfer_python and apache_tvm_ffi wheels in {args.wheels}")
    # tvm_ffi's wheel is built for one Python; a CPU machine's may differ, so install that one from the index
    tvm_version = pathlib.Path(wheels[-1]).name.split("-")[1]
    sh(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheels[0],
       f"apache-tvm-ffi=={tvm_version}", "ninja", "nvidia-ml-py", "einops", "tabulate")
    headers = pathlib.Path(args.headers) if args.headers else header_dir(work)
    cuda_home = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    env = dict(os.environ, PYTHONPATH=str(site), FLASHINFER_WORKSPACE_BASE=str(work / "ws"),
               FLASHINFER_CUDA_ARCH_LIST="9.0a", CUDA_HOME=str(cuda_home))
    ninja_path = pathlib.Path(subprocess.run(
        [sys.executable, "-c", GENERATE, ",".join(sorted(KEPT_SOURCES_OTHER_THAN_GENERATED))], env=env, check=True,
        capture_output=True, text=True).stdout.strip().splitlines()[-1])
    ninja_path.write_text(patch_ninja(ninja_path.read_text(), cuda_home, headers, stub_libs(work)))
    sh(site / "bin" / "ninja", "-C", ninja_path.parent.parent, "-f", ninja_path, "-j", args.jobs, env=env)
    so = ninja_path.parent / "fused_moe_90.so"
    relink_with_stand_ins(site / "bin" / "ninja", ninja_path, so)
    pack(so, pathlib.Path(args.out))


if __name__ == "__main__":
    main()
