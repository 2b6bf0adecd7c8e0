"""`kbench gen --check`: a backend's packed CUDA source compiled as load_inline compiles it (nvcc, the target's flags,
torch's headers) and what ptxas says of each kernel: registers, named barriers, stack, spills and its performance
advisories (wgmma serialized, setmaxnreg ignored, ...), plus, where cuobjdump is installed, the SASS's warpgroup MMA
(HGMMA, QGMMA, ...), warp MMA, TMA and local-memory instruction counts. No GPU needed: a kernel that spills, or whose
wgmma ptxas serialized, is seen before any device time is spent on it.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .generator import Build, GeneratorError

# torch's own nvcc flags for an extension (torch.utils.cpp_extension.COMMON_NVCC_FLAGS), so the check compiles what
# load_inline compiles
TORCH_NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr"]
NVIDIA_TARGETS = ("h100", "h200")
# SASS opcodes worth counting on Hopper: the warpgroup MMA wgmma becomes (HGMMA fp16/bf16, QGMMA fp8, IGMMA int8,
# BGMMA binary), the warp MMA of mma.sync, TMA loads and stores, local-memory loads and stores (spills, dynamically
# indexed arrays)
SASS_COUNTED = {"GMMA": ("HGMMA", "QGMMA", "IGMMA", "BGMMA"), "MMA": ("HMMA", "IMMA", "QMMA", "DMMA"),
                "TMA": ("UTMALDG", "UTMASTG"), "local": ("LDL", "STL")}

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?")
_ADVISORY = re.compile(r"\((C\d{4})\) ([^\n]*?)(?: in the function '([^']+)'|$)")
_SASS_FUNCTION = re.compile(r"^\s*Function : (\S+)", re.M)


@dataclass
class KernelReport:
    """One __global__ function as ptxas (and the SASS) describe it. ``name`` is mangled until `demangle` runs."""
    name: str
    registers: int = 0
    barriers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    advisories: list[str] = field(default_factory=list)  # "C7510 Potential Performance Loss: ..."
    sass: Counter | None = None  # SASS_COUNTED's keys -> instructions; None without cuobjdump


class CompileFailed(GeneratorError):
    """nvcc rejected the packed source; the message holds its error lines (names are the real files)."""


def cuda_source(build: Build) -> str:
    """The build's one CUDA translation unit (local includes pasted in), as the submission file holds it."""
    literal = build.context.get("cuda_literal")
    if build.template != "load_inline" or not literal:
        raise GeneratorError(f"{build.problem}/{build.backend} has no cuda_sources: nothing for --check to compile")
    return ast.literal_eval(literal)


def nvcc_command(build: Build, source: str, cubin: str) -> list[str]:
    """nvcc as torch's build.ninja runs it for the extension, writing a cubin, with ptxas's resource report."""
    if build.target not in NVIDIA_TARGETS:
        raise GeneratorError(f"--check compiles for {', '.join(NVIDIA_TARGETS)} (nvcc), not {build.target}")
    from torch.utils.cpp_extension import include_paths

    flags = build.context["flags"]["cuda_cflags"]
    std = [] if any(f.startswith("-std") for f in flags) else ["-std=c++17"]
    return ["nvcc", "-cubin", *TORCH_NVCC_FLAGS, *(a for p in include_paths() for a in ("-isystem", p)), *flags, *std,
            "-Xptxas", "-v", "-o", cubin, source]


def parse_ptxas(text: str) -> list[KernelReport]:
    """ptxas -v's report of the entry functions, in the order compiled; an advisory that names no function goes to
    the entry being compiled."""
    kernels: dict[str, KernelReport] = {}
    current = described = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = kernels.setdefault(m.group(1), KernelReport(m.group(1)))
        elif m := _PROPS.search(line):
            described = kernels.get(m.group(1))  # a device function's properties are not a kernel's
        elif (m := _FRAME.search(line)) and described is not None:
            described.stack, described.spill_stores, described.spill_loads = map(int, m.groups())
        elif (m := _USED.search(line)) and current is not None:
            current.registers, current.barriers = int(m.group(1)), int(m.group(2) or 0)
        elif m := _ADVISORY.search(line):
            owner = kernels.get(m.group(3) or "", current)
            if owner is not None:
                owner.advisories.append(f"{m.group(1)} {m.group(2).strip()}")
    return list(kernels.values())


def count_sass(text: str) -> dict[str, Counter]:
    """cuobjdump -sass's listing: each function's counts of SASS_COUNTED (an opcode with any modifiers, .64 etc.)."""
    out: dict[str, Counter] = {}
    starts = list(_SASS_FUNCTION.finditer(text))
    for m, nxt in zip(starts, starts[1:] + [None]):
        body = text[m.end():nxt.start() if nxt else len(text)]
        opcodes = Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", body))
        out[m.group(1)] = Counter({key: sum(opcodes[o] for o in ops) for key, ops in SASS_COUNTED.items()})
    return out


def demangle(names: list[str]) -> dict[str, str]:
    """Readable names (cu++filt or c++filt where installed), parameters dropped; the mangled ones otherwise."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    r = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=60)
    shown = r.stdout.splitlines() if r.returncode == 0 else []
    if len(shown) != len(names):
        return {n: n for n in names}
    return {n: _drop_parameters(s) for n, s in zip(names, shown)}


def _drop_parameters(signature: str) -> str:
    """'void ns::k<64, true>(CUtensorMap_st, ...)' -> 'ns::k<64, true>'."""
    depth, cut = 0, len(signature)
    for i, ch in enumerate(signature):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = i
            break
    name = signature[:cut]
    return name[5:] if name.startswith("void ") else name


def check(build: Build) -> list[KernelReport]:
    """Compile the build's CUDA source in a temporary folder; every kernel's report, readable names. Raises
    CompileFailed with nvcc's error lines, GeneratorError when there is nothing to compile or no nvcc."""
    source = cuda_source(build)
    if shutil.which("nvcc") is None:
        raise GeneratorError("--check needs nvcc on PATH (the CUDA toolkit; no GPU needed)")
    with tempfile.TemporaryDirectory(prefix="kbench-check-") as tmp:
        (Path(tmp) / "packed.cu").write_text(source, encoding="utf-8")
        r = subprocess.run(nvcc_command(build, "packed.cu", "packed.cubin"), cwd=tmp, capture_output=True,
                           text=True, timeout=1800)
        if r.returncode != 0:
            said = (r.stdout + r.stderr).splitlines()
            errors = [line.strip() for line in said if "error" in line and "detected in the compilation" not in line]
            raise CompileFailed(f"nvcc rejected {build.problem}/{build.backend}'s CUDA source (fix and run again): "
                                + "; ".join(errors[:5] or said[-5:]) + ("; ..." if len(errors) > 5 else ""))
        kernels = parse_ptxas(r.stdout + r.stderr)
        if shutil.which("cuobjdump"):
            sass = subprocess.run(["cuobjdump", "-sass", "packed.cubin"], cwd=tmp, capture_output=True, text=True,
                                  timeout=600)
            counts = count_sass(sass.stdout) if sass.returncode == 0 else {}
            for k in kernels:
                k.sass = counts.get(k.name)
    shown = demangle([k.name for k in kernels])
    for k in kernels:
        k.name = shown[k.name]
    return kernels


def warnings(k: KernelReport) -> list[str]:
    """What costs a Hopper kernel speed without failing its build."""
    out = [f"spills {k.spill_stores} B stored / {k.spill_loads} B loaded"] if k.spill_stores or k.spill_loads else []
    if k.sass is not None and k.sass["local"] and not out:
        out.append(f"{k.sass['local']} local-memory instructions (a dynamically indexed array?)")
    return out + k.advisories


def print_report(kernels: list[KernelReport], title: str, console) -> None:
    """One row a kernel, then each kernel's warnings under the table."""
    from rich.table import Table

    with_sass = any(k.sass is not None for k in kernels)
    table = Table(title=title, title_justify="left")
    columns = ["kernel", "regs", "barriers", "stack B", "spill B"] + (list(SASS_COUNTED) if with_sass else [])
    for c in columns:
        table.add_column(c, justify="left" if c == "kernel" else "right", no_wrap=c == "kernel")
    for k in kernels:
        sass = [str(k.sass[key]) if k.sass is not None else "—" for key in SASS_COUNTED] if with_sass else []
        table.add_row(k.name, str(k.registers), str(k.barriers), str(k.stack),
                      str(k.spill_stores + k.spill_loads), *sass)
    # wide enough for whole names even where the console is not a terminal (80 columns)
    needed = max([len(k.name) for k in kernels] + [6]) + 11 * (len(columns) - 1) + 4
    console.width = max(console.width, needed)
    console.print(table)
    for k in kernels:
        for w in warnings(k):
            console.print(f"[yellow]warning[/yellow] {k.name}: {w}", highlight=False)
    if not with_sass:
        console.print("SASS counts (warpgroup MMA, TMA, local memory) need cuobjdump from the CUDA toolkit",
                      highlight=False)
