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

Properties the output keeps: identical inputs give identical bytes (no timestamps, files in manifest order);
the load_inline module is named after a hash of sources + flags (edits rebuild, unchanged files reuse torch's
build cache); the first lines record problem, backend, target and that hash, and mark the file as ours so
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
MARKER = "# kbench-generated submission"

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
COMMON_KEYS = {"template", "entry", "modules", "allow_imports"}
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


def kernels_root(root: str | os.PathLike | None = None) -> Path:
    """The kernels tree: the argument, else env KBENCH_KERNELS, else kernels/ beside this file."""
    if root is None:
        root = os.environ.get("KBENCH_KERNELS") or HERE / "kernels"
    return Path(root).resolve()


def list_problems(root=None) -> list[str]:
    base = kernels_root(root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def _problem_dir(problem: str, root) -> Path:
    base = kernels_root(root)
    d = base / problem
    if not problem or "/" in problem or not d.is_dir():
        known = ", ".join(list_problems(root)) or "none"
        raise GeneratorError(f"unknown problem {problem!r} under {base} (known: {known})")
    return d


def list_backends(problem: str, root=None) -> list[str]:
    """Backends of a problem: the sub-folders of kernels/<problem>/ that hold a kernel.yml, sorted."""
    d = _problem_dir(problem, root)
    return sorted(p.name for p in d.iterdir() if (p / "kernel.yml").is_file())


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
    return m


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


def merged_flags(m: Manifest, target: str) -> dict[str, list[str]]:
    """common + target flags; a missing target block means the target's arch default."""
    target_block = m.flags.get(target, DEFAULT_ARCH_FLAGS[target])
    out = {}
    for key in FLAG_KEYS:
        out[key] = list((m.flags.get("common") or {}).get(key) or []) + list((target_block or {}).get(key) or [])
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


def inline_includes(sources: list[Path], search: list[Path], base: Path) -> tuple[str, list[tuple[str, str]]]:
    """Join `sources` into one translation unit with every local `#include "..."` pasted in place.

    Headers are looked up in the including file's folder, then in `search`. Include lines are found textually, so
    one inside `#if 0` or a /* */ comment is resolved too. Each header is pasted once per
    translation unit (later includes become a comment), so include guards are not needed; `#pragma once` lines
    are dropped because they warn in a main file. `#include <...>` is left alone. `#line` directives keep compiler
    messages pointing at the real files. Returns (text, [(display path, content)] of every file read, in order).
    Raises GeneratorError for a missing header (naming the includer and line) or an include cycle (the chain).
    """
    seen: set[Path] = set()
    read: list[tuple[str, str]] = []
    out: list[str] = []

    def expand(path: Path, chain: list[Path]) -> None:
        text = _read(path)
        read.append((_rel(path, base), text))
        shown = _rel(path, base)
        out.append(f'#line 1 "{shown}"\n')
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
            out.append(f'// kbench: end "{name}"\n#line {lineno + 1} "{shown}"\n')

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


def render(problem: str, backend: str, target: str = "h100", root=None) -> str:
    """The submission text for kernels/<problem>/<backend>/ on `target` (h100 | h200 | mi300x)."""
    if target not in TARGETS:
        raise GeneratorError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    backends = list_backends(problem, root)
    if backend not in backends:
        raise GeneratorError(f"unknown backend {backend!r} for {problem} (known: {', '.join(backends) or 'none'})")
    base = kernels_root(root)
    bdir = base / problem / backend
    label = f"kernels/{problem}/{backend}/kernel.yml"
    m = load_manifest(bdir, label)

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

    hashed = {
        "problem": problem, "backend": backend, "template": m.template,
        "entry": [_rel(entry_path, base), entry_text],
        "modules": [[n, s, src] for n, s, src in modules],
    }
    ctx = {
        "problem": problem, "backend": backend, "target": target, "marker": MARKER,
        "future": future, "entry_path": _rel(entry_path, base), "entry": entry_text.rstrip("\n"),
        "modules": [{"name": n, "path": s, "literal": py_literal(src)} for n, s, src in modules],
    }
    if m.template == "load_inline":
        for d in m.include_dirs:
            if not (bdir / d).is_dir():
                raise GeneratorError(f"{label}: include_dirs entry {d!r} is not a folder beside kernel.yml")
        search = [bdir.resolve()] + [(bdir / d).resolve() for d in m.include_dirs]
        cuda_files = [_backend_file(bdir, s, label, "cuda_sources") for s in m.cuda_sources]
        cpp_files = [_backend_file(bdir, s, label, "cpp_sources") for s in m.cpp_sources]
        cuda_text, cuda_read = inline_includes(cuda_files, search, base) if cuda_files else ("", [])
        cpp_text, cpp_read = inline_includes(cpp_files, search, base) if cpp_files else ("", [])
        flags = merged_flags(m, target)
        env = target_env(m, target)
        hashed.update(cuda=cuda_text, cpp=cpp_text, functions=m.functions, flags=flags, env=env, target=target)
        digest = _sha(hashed)
        ctx.update(
            cuda_literal=py_literal(cuda_text) if cuda_files else None,
            cpp_literal=py_literal(cpp_text) if cpp_files else None,
            functions=m.functions, flags=flags, env=env,
            ext_name=re.sub(r"\W", "_", f"kbench_{problem}_{backend}_{digest[:16]}"),
            inlined=sorted({p for p, _ in cuda_read + cpp_read}),
        )
    else:
        digest = _sha(hashed)
    ctx["source_hash"] = digest
    text = _jinja().get_template(f"{m.template}.py.j2").render(**ctx)
    check_output(text, allowed, f"{problem}/{backend}")
    return text


def is_generated(path: Path) -> bool:
    """Whether `path` starts with kbench's header (only then may generate() replace it)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = [f.readline() for _ in range(3)]
    except OSError:
        return False
    return any(line.startswith(MARKER) for line in head)


def generate(problem: str, backend: str | None = None, target: str = "h100", out="submission.py",
             force: bool = False, root=None) -> Path:
    """Render and write the submission; returns its path. Refuses to replace a file kbench did not write."""
    if backend is None:
        _problem_dir(problem, root)
        backend = default_backend(problem)
    text = render(problem, backend, target, root)
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
