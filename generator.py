"""Pack one backend under kernels/<problem>/<backend>/ into the single submission.py the leaderboard accepts.

Data flow: kernel.yml + real source files + templates/<kind>.j2  ->  one self-contained Python file.

kernel.yml (the contract in docs/CONTRACTS.md; keys marked "optional" are extensions of this module):

    template: load_inline | python   required
    entry: entry.py                  required; Python that defines custom_kernel(data), copied verbatim
    modules: [helpers.py]            optional; local Python modules the entry (or each other) import by file stem
                                     (`import helpers`); served from memory by an import hook in the submission
    allow_imports: [cutlass]         optional; extra third-party top-level packages the output may import
    # load_inline only:
    cuda_sources: [kernel.cu]        device code; `#include "..."` resolved recursively (each header once)
    cpp_sources: [binding.cpp]       the torch-facing binding
    functions: [fp8_gemm]            names the binding exports (load_inline functions=); empty: binding has its own
                                     PYBIND11_MODULE
    include_dirs: [../common]        optional; extra folders (relative to the backend) searched for `#include "..."`
                                     after the including file's own folder and the backend folder
    flags: {common: {...}, h100: {...}, h200: {...}, mi300x: {...}}
                                     each block may hold cflags, cuda_cflags, ldflags (lists); common + target merged.
                                     A target block that is absent gets the arch default (sm_90a / gfx942); write
                                     `h100: {}` to add nothing.
    env: {mi300x: {CXX: clang++}}    optional; environment variables set before torch is imported, per target
                                     (mi300x already gets PYTORCH_ROCM_ARCH=gfx942 and CXX=hipcc unless set)
    # both templates:
    targets: [h100, h200]            optional; where the backend runs: h100, h200, mi300x and cpu (the CPU, for
                                     kbench's own CPU runs). Default: every target and cpu for template python,
                                     h100, h200, mi300x for load_inline. gen/test refuse the others up front.
    dev:                             optional; what in-process builds for tests and benchmarks add (load_build
      functions: [plan_for]          dev=True): more exported functions and flags. The shipped submission never
      flags: {common: {cuda_cflags: [-DKBENCH_DEV]}}     holds them.

One build description serves both consumers: ``load_build`` returns a ``Build`` (sources after include inlining,
flags, module name, hash); ``render_build`` fills the template for the submission file and ``load_in_process``
imports that same text in this process (benchmarks and GPU tests), so a benchmark never times another build.

Properties the output keeps: identical inputs give identical bytes (no timestamps, files in manifest order);
the load_inline module is named after a hash of sources + flags (edits rebuild, unchanged files reuse torch's
build cache); the file starts with popcorn-cli's ``#!POPCORN leaderboard`` / ``#!POPCORN gpu`` lines (so it can be
submitted unchanged), then records problem, backend, target and that hash, and marks the file as ours so
generate() never overwrites a file kbench did not write (unless force=True).
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import yaml

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
TARGETS = ("h100", "h200", "mi300x")
RUNS_ON = TARGETS + ("cpu",)           # what a manifest's `targets` may name: the GPU targets and kbench's CPU runs
MARKER = "# kbench-generated submission"
# popcorn-cli's GPU names for the targets (distributed leaderboards ran on 8 GPUs of one host: "<gpu>x8")
LEADERBOARD_GPU = {"h100": "H100", "h200": "H200", "mi300x": "MI300"}

# Top-level packages a leaderboard runner has (besides the standard library): anything else is local or missing.
ALLOWED_IMPORTS = frozenset({"torch", "triton", "numpy", "task", "utils", "reference"})

DEFAULT_ARCH_FLAGS = {
    "h100": {"cuda_cflags": ["-gencode=arch=compute_90a,code=sm_90a"]},
    "h200": {"cuda_cflags": ["-gencode=arch=compute_90a,code=sm_90a"]},
    "mi300x": {"cuda_cflags": ["--offload-arch=gfx942"]},
}
# setdefault semantics for CXX (a competitor's own compiler choice wins), forced arch: the leaderboard box is gfx942.
ROCM_ENV_FORCED = {"PYTORCH_ROCM_ARCH": "gfx942"}
ROCM_ENV_DEFAULT = {"CXX": "hipcc"}

FLAG_KEYS = ("cflags", "cuda_cflags", "ldflags")
COMMON_KEYS = {"template", "entry", "modules", "allow_imports", "targets", "dev"}
LOAD_INLINE_KEYS = {"cuda_sources", "cpp_sources", "functions", "include_dirs", "flags", "env"}
KNOWN_KEYS = COMMON_KEYS | LOAD_INLINE_KEYS

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"')
PRAGMA_ONCE_RE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once\b")


class GeneratorError(ValueError):
    """One clear line saying what is wrong and how to fix it."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


# ----------------------------------------------------------------------------------------------------------------
# where things are


SHIPPED = HERE / "kernels"


def kernels_root(root: str | os.PathLike | None = None) -> Path:
    """The competitor's kernels tree: the argument (``--kernels DIR``), else env KBENCH_KERNELS, else the kernels
    shipped with kbench."""
    if root is None:
        root = os.environ.get("KBENCH_KERNELS") or SHIPPED
    return Path(root).resolve()


def kernel_roots(root=None) -> list[Path]:
    """Where backends are looked up, first match wins: the competitor's tree, then the shipped kernels."""
    first = kernels_root(root)
    return [first] if first == SHIPPED.resolve() else [first, SHIPPED.resolve()]


def list_problems(root=None) -> list[str]:
    names = set()
    for base in kernel_roots(root):
        if base.is_dir():
            names |= {p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    return sorted(names)


def _problem_dirs(problem: str, root) -> list[Path]:
    dirs = [base / problem for base in kernel_roots(root)]
    if not problem or "/" in problem or not any(d.is_dir() for d in dirs):
        known = ", ".join(list_problems(root)) or "none"
        raise GeneratorError(f"unknown problem {problem!r} under {kernels_root(root)} (known: {known})")
    return [d for d in dirs if d.is_dir()]


def list_backends(problem: str, root=None) -> list[str]:
    """Backends of a problem: sub-folders of <kernels>/<problem>/ that hold a kernel.yml, over the search path."""
    return sorted({p.name for d in _problem_dirs(problem, root) for p in d.iterdir() if (p / "kernel.yml").is_file()})


def backend_dir(problem: str, backend: str, root=None) -> Path:
    """The folder of a backend (the first one on the search path); GeneratorError naming the fix otherwise."""
    dirs = _problem_dirs(problem, root)
    for d in dirs:
        if (d / backend / "kernel.yml").is_file():
            return d / backend
    bare = next((d / backend for d in dirs if (d / backend).is_dir()), None)
    if bare is not None:
        raise GeneratorError(f"{bare} has no kernel.yml (the backend's manifest); add one (template, entry, ...), "
                             f"or create the backend with `kbench new {problem} {backend}`")
    raise GeneratorError(f"unknown backend {backend!r} for {problem} (known: {', '.join(list_backends(problem, root)) or 'none'})")


def default_backend(problem: str) -> str:
    """The spec's default_backend; "torch" while the problems loader (or this problem's spec) is not there."""
    try:
        from . import problems

        return problems.load_spec(problem).default_backend
    except Exception:  # noqa: BLE001 - any loader trouble means "no opinion", never a crash of gen
        return "torch"


# ----------------------------------------------------------------------------------------------------------------
# the manifest


@dataclass
class Manifest:
    """kernel.yml, checked; paths are relative to the backend folder."""

    template: str
    entry: str
    modules: list[str] = field(default_factory=list)
    allow_imports: list[str] = field(default_factory=list)
    cuda_sources: list[str] = field(default_factory=list)
    cpp_sources: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    include_dirs: list[str] = field(default_factory=list)
    flags: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    targets: list[str] = field(default_factory=list)
    dev: dict = field(default_factory=dict)


def _str_list(where: str, key: str, value) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise GeneratorError(f"{where}: key {key!r} must be a list of non-empty strings, got {value!r}")
    return list(value)


def load_manifest(backend_dir: Path, label: str) -> Manifest:
    """Read and validate <backend_dir>/kernel.yml; `label` names it in errors (e.g. kernels/fp8-mm/cuda/kernel.yml)."""
    path = backend_dir / "kernel.yml"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise GeneratorError(f"{label}: not valid YAML ({e})") from None
    if not isinstance(raw, dict):
        raise GeneratorError(f"{label}: must be a mapping of keys (template, entry, ...), got {type(raw).__name__}")
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise GeneratorError(f"{label}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(KNOWN_KEYS))})")
    for key in ("template", "entry"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise GeneratorError(f"{label}: key {key!r} is required and must be a string")
    template = raw["template"]
    if template not in ("load_inline", "python"):
        raise GeneratorError(f"{label}: key 'template' must be load_inline or python, got {template!r}")
    if template == "python":
        stray = sorted(set(raw) & LOAD_INLINE_KEYS)
        if stray:
            raise GeneratorError(f"{label}: key {stray[0]!r} only applies to template load_inline")
    m = Manifest(template=template, entry=raw["entry"])
    for key in ("modules", "allow_imports", "cuda_sources", "cpp_sources", "functions", "include_dirs"):
        setattr(m, key, _str_list(label, key, raw.get(key)))
    for name in m.functions:
        if not name.isidentifier():
            raise GeneratorError(f"{label}: key 'functions' entry {name!r} is not a C++/Python identifier")
    if template == "load_inline" and not (m.cuda_sources or m.cpp_sources):
        raise GeneratorError(f"{label}: template load_inline needs key 'cuda_sources' or 'cpp_sources'")
    m.flags = _check_flags(label, raw.get("flags"))
    m.env = _check_env(label, raw.get("env"))
    m.targets = _str_list(label, "targets", raw.get("targets")) or (
        list(RUNS_ON) if template == "python" else list(TARGETS))
    bad = [x for x in m.targets if x not in RUNS_ON]
    if bad:
        raise GeneratorError(f"{label}: key 'targets' names {bad[0]!r}; choose from {', '.join(RUNS_ON)}")
    m.dev = _check_dev(label, raw.get("dev"), template)
    return m


def _check_dev(label: str, dev, template: str) -> dict:
    if dev is None:
        return {}
    if not isinstance(dev, dict) or set(dev) - {"functions", "flags"}:
        raise GeneratorError(f"{label}: key 'dev' must be a mapping with 'functions' and/or 'flags'")
    if template != "load_inline":
        raise GeneratorError(f"{label}: key 'dev' only applies to template load_inline")
    return {"functions": _str_list(label, "dev.functions", dev.get("functions")),
            "flags": _check_flags(f"{label} (dev)", dev.get("flags"))}


def _check_flags(label: str, flags) -> dict:
    if flags is None:
        return {}
    if not isinstance(flags, dict):
        raise GeneratorError(f"{label}: key 'flags' must be a mapping (common/h100/h200/mi300x)")
    for block, body in flags.items():
        if block not in ("common",) + TARGETS:
            raise GeneratorError(f"{label}: key 'flags.{block}' is not common or a target ({', '.join(TARGETS)})")
        if body is None:
            flags[block] = body = {}
        if not isinstance(body, dict):
            raise GeneratorError(f"{label}: key 'flags.{block}' must be a mapping of {', '.join(FLAG_KEYS)}")
        for k, v in body.items():
            if k not in FLAG_KEYS:
                raise GeneratorError(f"{label}: key 'flags.{block}.{k}' is unknown (known: {', '.join(FLAG_KEYS)})")
            _str_list(label, f"flags.{block}.{k}", v)
    return flags


def _check_env(label: str, env) -> dict:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise GeneratorError(f"{label}: key 'env' must be a mapping target -> {{NAME: value}}")
    for target, body in env.items():
        if target not in TARGETS:
            raise GeneratorError(f"{label}: key 'env.{target}' is not a target ({', '.join(TARGETS)})")
        if not isinstance(body, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in body.items()):
            raise GeneratorError(f"{label}: key 'env.{target}' must map variable names to strings")
    return env


def merged_flags(m: Manifest, target: str, dev: bool = False) -> dict[str, list[str]]:
    """common + target flags (+ the dev block's, for in-process builds); a missing target block means the
    target's arch default."""
    target_block = m.flags.get(target, DEFAULT_ARCH_FLAGS[target])
    extra = (m.dev.get("flags") or {}) if dev else {}
    out = {}
    for key in FLAG_KEYS:
        out[key] = (list((m.flags.get("common") or {}).get(key) or []) + list((target_block or {}).get(key) or [])
                    + list((extra.get("common") or {}).get(key) or []) + list((extra.get(target) or {}).get(key) or []))
    return out


def target_env(m: Manifest, target: str) -> list[tuple[str, str, bool]]:
    """(name, value, forced) in a stable order: forced ones overwrite, the others only fill in."""
    env: dict[str, tuple[str, bool]] = {}
    if target == "mi300x":
        env.update({k: (v, False) for k, v in ROCM_ENV_DEFAULT.items()})
        env.update({k: (v, True) for k, v in ROCM_ENV_FORCED.items()})
    env.update({k: (v, True) for k, v in (m.env.get(target) or {}).items()})
    return [(k, v, forced) for k, (v, forced) in sorted(env.items())]


# ----------------------------------------------------------------------------------------------------------------
# sources


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise GeneratorError(f"{path}: not UTF-8 text; save it as UTF-8") from None


def _rel(path: Path, base: Path) -> str:
    """A stable display path (never absolute, so output does not depend on where the checkout lives)."""
    return Path(os.path.relpath(path, base.parent)).as_posix()


def _backend_file(backend_dir: Path, rel: str, label: str, key: str) -> Path:
    p = (backend_dir / rel).resolve()
    if not p.is_file():
        raise GeneratorError(f"{label}: {key} file {rel!r} not found in {backend_dir}")
    return p


def inline_includes(sources: list[Path], search: list[Path], base: Path,
                    for_nvcc: bool = False) -> tuple[str, list[tuple[str, str]]]:
    """Join `sources` into one translation unit with every local `#include "..."` pasted in place.

    Headers are looked up in the including file's folder, then in `search`. Include lines are found textually, so
    one inside `#if 0` or a /* */ comment is resolved too. Each header is pasted once per
    translation unit (later includes become a comment), so include guards are not needed; `#pragma once` lines
    are dropped because they warn in a main file. `#include <...>` is left alone. `#line` directives keep compiler
    messages pointing at the real files; with `for_nvcc` their names are written in angle brackets
    (`#line 1 "<kernels/p/b/kernel.cu>"`): nvcc's dependency file lists every #line file name but bracketed ones (as
    `<built-in>`), and ninja, finding these relative names missing from torch's build folder, rebuilt an unchanged
    extension on every import (~30 s a run on the GPU machine). g++ lists only files it opened. Returns (text,
    [(display path, content)] of every file read, in order). Raises GeneratorError for a missing header (naming the
    includer and line) or an include cycle (the chain).
    """
    seen: set[Path] = set()
    read: list[tuple[str, str]] = []
    out: list[str] = []

    def expand(path: Path, chain: list[Path]) -> None:
        text = _read(path)
        shown = _rel(path, base)
        read.append((shown, text))
        line_name = f"<{shown}>" if for_nvcc else shown
        out.append(f'#line 1 "{line_name}"\n')
        # split on "\n" only: str.splitlines would also break at form feeds and the like, shifting line numbers
        for lineno, line in enumerate(io.StringIO(text).readlines(), 1):
            if not line.endswith("\n"):
                line += "\n"
            if PRAGMA_ONCE_RE.match(line):
                out.append("\n")
                continue
            hit = INCLUDE_RE.match(line)
            if not hit:
                out.append(line)
                continue
            name = hit.group(1)
            header = next(
                (c.resolve() for c in [path.parent / name] + [d / name for d in search] if c.is_file()), None
            )
            if header is None:
                dirs = ", ".join(_rel(d, base) for d in [path.parent] + search)
                raise GeneratorError(f'{shown}:{lineno}: #include "{name}" not found (searched: {dirs})')
            if header in chain:
                cycle = " -> ".join(_rel(p, base) for p in chain[chain.index(header):] + [header])
                raise GeneratorError(f"include cycle: {cycle}")
            if header in seen:
                out.append(f'// kbench: "{name}" already included above\n')
                continue
            seen.add(header)
            out.append(f'// kbench: begin "{name}"\n')
            expand(header, chain + [header])
            out.append(f'// kbench: end "{name}"\n#line {lineno + 1} "{line_name}"\n')

    for src in sources:
        seen.add(src)
        expand(src, [src])
    return "".join(out), read


def py_literal(text: str) -> str:
    """A Python literal for `text`: a readable raw triple-quoted string when that is exact, else repr()."""
    if "'''" not in text and not text.endswith(("\\", "'")) and "\r" not in text and "\0" not in text:
        candidate = "r'''" + text + "'''"
        try:
            if ast.literal_eval(candidate) == text:
                return candidate
        except (SyntaxError, ValueError):
            pass
    return repr(text)


# ----------------------------------------------------------------------------------------------------------------
# checks on the output


def _top_package(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name.split(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return ["." * node.level + (node.module or "")]
        return [(node.module or "").split(".")[0]]
    return []


def check_imports(tree: ast.AST, allowed: set[str], where: str) -> None:
    """Every import (at any depth) must name the stdlib, an allowed package or an inlined module."""
    for node in ast.walk(tree):
        for pkg in _top_package(node):
            if pkg.startswith("."):
                raise GeneratorError(f"{where}:{node.lineno}: relative import {pkg!r}; write `import <module>` and "
                                     "list the module under 'modules' in kernel.yml")
            if pkg not in allowed and pkg not in sys.stdlib_module_names:
                raise GeneratorError(f"{where}:{node.lineno}: imports {pkg!r}, which the leaderboard runner does not "
                                     "have; list a local file under 'modules' in kernel.yml, or a real package "
                                     "under 'allow_imports'")


def _defines_custom_kernel(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "custom_kernel":
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "custom_kernel"
                                                for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "custom_kernel" for a in node.names):
            return True
    return False


def check_output(text: str, allowed: set[str], label: str) -> None:
    """The rendered file parses, defines custom_kernel at top level and imports nothing local."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise GeneratorError(f"{label}: generated file does not parse (line {e.lineno}: {e.msg})") from None
    if not _defines_custom_kernel(tree):
        raise GeneratorError(f"{label}: the entry does not define custom_kernel(data) at top level")
    check_imports(tree, allowed, label)


# ----------------------------------------------------------------------------------------------------------------
# rendering


def _split_future(entry_text: str, label: str) -> tuple[list[str], str]:
    """Lift `from __future__ import ...` out of the entry: Python only accepts it at the top of the file."""
    try:
        tree = ast.parse(entry_text)
    except SyntaxError as e:
        raise GeneratorError(f"{label}:{e.lineno}: {e.msg}") from None
    lines = entry_text.splitlines(keepends=True)
    hoisted = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            hoisted.append("from __future__ import " + ", ".join(a.name for a in node.names))
            for i in range(node.lineno - 1, node.end_lineno):
                lines[i] = "# (from __future__ import moved to the top by kbench)\n" if i == node.lineno - 1 else "\n"
    return hoisted, "".join(lines)


def _module_name(rel: str, label: str) -> str:
    name = Path(rel).stem
    if not rel.endswith(".py") or not name.isidentifier():
        raise GeneratorError(f"{label}: module {rel!r} must be a .py file whose stem is a Python identifier")
    if name in ALLOWED_IMPORTS or name in sys.stdlib_module_names:
        raise GeneratorError(f"{label}: module {rel!r} would shadow the package {name!r}; rename the file")
    return name


def _sha(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def _jinja() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["py"] = repr  # Python literals for names, flags and paths (sources go through py_literal)
    return env


@dataclass(frozen=True)
class Build:
    """One backend built for one target: everything the submission file holds, and what an in-process build loads.

    ``context`` fills the template (sources as Python literals, flags, module name); ``allowed`` are the packages
    the output may import; ``hash`` covers every source and flag (the load_inline module name carries it).
    """
    problem: str
    backend: str
    target: str
    template: str
    dev: bool
    hash: str
    context: dict
    allowed: frozenset


def _header(problem: str, target: str) -> dict:
    """popcorn-cli's leaderboard and GPU lines for the file's first lines (empty where the spec is unknown)."""
    try:
        from . import problems

        spec = problems.load_spec(problem)
    except Exception:  # noqa: BLE001 - a problem kbench does not judge still packs, without the popcorn lines
        return {"leaderboard": None, "gpu": None}
    # the official GPU ("MI300X", "8x MI300X") in popcorn-cli's spelling ("MI300", "MI300x8"); other targets
    # name their own GPU the same way
    count = spec.official_gpu.split("x ")[0] if "x " in spec.official_gpu else ""
    gpu = LEADERBOARD_GPU[target] + (f"x{count}" if count.isdigit() else "")
    return {"leaderboard": spec.leaderboard, "gpu": gpu}


def load_build(problem: str, backend: str, target: str = "h100", root=None, dev: bool = False) -> Build:
    """The build description of kernels/<problem>/<backend>/ for ``target`` (dev: with the manifest's dev block)."""
    if target not in TARGETS:
        raise GeneratorError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    bdir = backend_dir(problem, backend, root)
    base = bdir.parent.parent
    label = f"kernels/{problem}/{backend}/kernel.yml"
    m = load_manifest(bdir, label)
    if target not in m.targets:
        raise GeneratorError(f"backend {backend!r} of {problem} runs on {', '.join(m.targets)}, not {target}: pick "
                             f"one of those with --target, or another backend (its kernel.yml lists 'targets')")
    entry_path = _backend_file(bdir, m.entry, label, "entry")
    future, entry_text = _split_future(_read(entry_path), _rel(entry_path, base))
    modules = []  # (name, display path, source)
    for rel in m.modules:
        path = _backend_file(bdir, rel, label, "modules")
        name = _module_name(rel, label)
        if any(name == n for n, _, _ in modules):
            raise GeneratorError(f"{label}: two modules named {name!r}; rename one file")
        modules.append((name, _rel(path, base), _read(path)))
    allowed = set(ALLOWED_IMPORTS) | set(m.allow_imports) | {n for n, _, _ in modules}
    for name, shown, src in modules:
        try:
            check_imports(ast.parse(src), allowed, shown)
        except SyntaxError as e:
            raise GeneratorError(f"{shown}:{e.lineno}: {e.msg}") from None
    hashed = {"problem": problem, "backend": backend, "template": m.template,
              "entry": [_rel(entry_path, base), entry_text], "modules": [[n, s, src] for n, s, src in modules]}
    ctx = {"problem": problem, "backend": backend, "target": target, "marker": MARKER, **_header(problem, target),
           "future": future, "entry_path": _rel(entry_path, base), "entry": entry_text.rstrip("\n"),
           "modules": [{"name": n, "path": s, "literal": py_literal(src)} for n, s, src in modules]}
    if m.template == "load_inline":
        hashed.update(_native_sources(m, bdir, base, label, target, dev, ctx))
    digest = _sha(hashed)
    ctx["source_hash"] = digest
    if m.template == "load_inline":
        ctx["ext_name"] = re.sub(r"\W", "_", f"kbench_{problem}_{backend}{'_dev' if dev else ''}_{digest[:16]}")
    return Build(problem=problem, backend=backend, target=target, template=m.template, dev=dev, hash=digest,
                 context=ctx, allowed=frozenset(allowed))


def _native_sources(m: Manifest, bdir: Path, base: Path, label: str, target: str, dev: bool, ctx: dict) -> dict:
    """The load_inline part of a build: sources with includes pasted in, flags, exported functions (into ctx);
    returns what the hash covers."""
    for d in m.include_dirs:
        if not (bdir / d).is_dir():
            raise GeneratorError(f"{label}: include_dirs entry {d!r} is not a folder beside kernel.yml")
    search = [bdir.resolve()] + [(bdir / d).resolve() for d in m.include_dirs]
    cuda_files = [_backend_file(bdir, s, label, "cuda_sources") for s in m.cuda_sources]
    cpp_files = [_backend_file(bdir, s, label, "cpp_sources") for s in m.cpp_sources]
    cuda_text, cuda_read = inline_includes(cuda_files, search, base, for_nvcc=True) if cuda_files else ("", [])
    cpp_text, cpp_read = inline_includes(cpp_files, search, base) if cpp_files else ("", [])
    flags = merged_flags(m, target, dev)
    env = target_env(m, target)
    functions = list(m.functions) + (list(m.dev.get("functions") or []) if dev else [])
    ctx.update(cuda_literal=py_literal(cuda_text) if cuda_files else None,
               cpp_literal=py_literal(cpp_text) if cpp_files else None, functions=functions, flags=flags, env=env,
               inlined=sorted({p for p, _ in cuda_read + cpp_read}))
    return {"cuda": cuda_text, "cpp": cpp_text, "functions": functions, "flags": flags, "env": env, "target": target}


def render_build(build: Build) -> str:
    """The submission text of a build (checked: it parses, defines custom_kernel, imports nothing local)."""
    text = _jinja().get_template(f"{build.template}.py.j2").render(**build.context)
    check_output(text, set(build.allowed), f"{build.problem}/{build.backend}")
    return text


def render(problem: str, backend: str, target: str = "h100", root=None) -> str:
    """The submission text for kernels/<problem>/<backend>/ on `target` (h100 | h200 | mi300x)."""
    return render_build(load_build(problem, backend, target, root))


def load_in_process(build: Build, folder: str | os.PathLike | None = None):
    """Import the build's submission text in this process (benchmarks, GPU tests): the same file the leaderboard
    gets, loaded as a module named ``kbench_<problem>_<backend>`` from ``folder`` (a temporary one by default, kept
    for the process's life so tracebacks and Triton's source lookup find the file). Returns the module; its
    ``custom_kernel`` is the entry point and, for load_inline builds, ``ext`` the compiled extension (with the dev
    functions when the build is dev)."""
    import importlib.util
    import tempfile

    where = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="kbench-build-"))
    name = re.sub(r"\W", "_", f"kbench_{build.problem}_{build.backend}{'_dev' if build.dev else ''}")
    path = where / f"{name}.py"
    path.write_text(render_build(build), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def is_generated(path: Path) -> bool:
    """Whether `path` starts with kbench's header (only then may generate() replace it)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = [f.readline() for _ in range(6)]
    except OSError:
        return False
    return any(line.startswith(MARKER) for line in head)


def generate(problem: str, backend: str | None = None, target: str = "h100", out="submission.py",
             force: bool = False, root=None) -> Path:
    """Render and write the submission; returns its path (``out`` "-": the text goes to stdout, returns None).
    Refuses to replace a file kbench did not write."""
    if backend is None:
        _problem_dirs(problem, root)
        backend = default_backend(problem)
    text = render(problem, backend, target, root)
    if str(out) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return None
    out = Path(out)
    if out.is_dir():
        raise GeneratorError(f"{out} is a folder; pass a file name with -o (e.g. -o {out / 'submission.py'})")
    if out.exists() and not force and not is_generated(out):
        raise GeneratorError(f"refusing to overwrite {out}: kbench did not generate it (use --force / force=True, "
                             "or pick another -o)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".kbench-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out


def runs_on(problem: str, backend: str, root=None) -> list[str]:
    """The targets (and "cpu") a backend's manifest says it runs on."""
    bdir = backend_dir(problem, backend, root)
    return load_manifest(bdir, f"kernels/{problem}/{backend}/kernel.yml").targets


def scaffold(problem: str, backend: str, kernels: Path, source: str = "torch") -> Path:
    """Create <kernels>/<problem>/<backend>/ from the shipped python-template backend ``source`` (its kernel.yml,
    entry and modules), a first version that passes ``kbench test`` on the CPU. Refuses to touch an existing folder."""
    if not backend or not re.fullmatch(r"[A-Za-z0-9_.-]+", backend):
        raise GeneratorError(f"backend name {backend!r}: use letters, digits, '_', '-' or '.'")
    src = SHIPPED / problem / source
    if not (src / "kernel.yml").is_file():
        known = sorted(p.name for p in (SHIPPED / problem).iterdir() if (p / "kernel.yml").is_file()) \
            if (SHIPPED / problem).is_dir() else []
        raise GeneratorError(f"no shipped backend {source!r} for {problem} to start from (--from: {', '.join(known)})")
    m = load_manifest(src, f"kernels/{problem}/{source}/kernel.yml")
    if m.template != "python":
        raise GeneratorError(f"--from {source}: start from a python-template backend (e.g. torch); a load_inline one "
                             "needs a GPU to pass its first test")
    dest = Path(kernels).resolve() / problem / backend
    if dest.exists():
        raise GeneratorError(f"{dest} already exists; pick another backend name or remove it")
    dest.mkdir(parents=True)
    # modules shared between shipped backends (../_shared/x.py) are copied in beside the entry
    for rel in [m.entry, *m.modules]:
        (dest / Path(rel).name).write_text(_read(src / rel), encoding="utf-8")
    (dest / "kernel.yml").write_text(
        f"# {problem}/{backend}: started from kbench's {source} backend (kbench new). kernel.yml keys: see kbench's\n"
        f"# generator.py docstring. A CUDA backend uses template: load_inline with cuda_sources / cpp_sources.\n"
        f"template: python\nentry: {Path(m.entry).name}\nmodules: {json.dumps([Path(x).name for x in m.modules])}\n",
        encoding="utf-8")
    return dest
