"""Development build of a load_inline kernel backend without the generator (benchmarks and GPU tests use it).

    ext, custom_kernel = load_backend("fp8-mm", "cuda")

Reads kernels/<problem>/<backend>/kernel.yml, inlines local `#include "..."` headers (each once, like the
generator does for submission.py), compiles with torch.utils.cpp_extension.load_inline under a module name hashed
from sources + flags (edits rebuild, unchanged sources reuse the build cache), then executes the entry file with
the compiled module bound to the global name `ext`, exactly as the packaged submission would.
"""
from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def inline_includes(path: Path, seen: set[Path] | None = None) -> str:
    """Source text of `path` with local quoted includes replaced by their (recursively inlined) text."""
    seen = set() if seen is None else seen
    out = []
    for line in path.read_text().splitlines():
        m = _INCLUDE.match(line)
        if m:
            dep = (path.parent / m.group(1)).resolve()
            if not dep.is_file():
                raise FileNotFoundError(f"{path}: #include \"{m.group(1)}\" not found next to it")
            if dep not in seen:
                seen.add(dep)
                out.append(inline_includes(dep, seen))
            continue
        if line.strip() == "#pragma once":  # meaningless (and warned about) once the text is inlined
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def load_backend(problem: str, backend: str, target: str = "h100", verbose: bool = False):
    """Compile kernels/<problem>/<backend> and return (ext, custom_kernel)."""
    from torch.utils.cpp_extension import load_inline

    kdir = ROOT / "kernels" / problem / backend
    spec = yaml.safe_load((kdir / "kernel.yml").read_text())
    if spec.get("template") != "load_inline":
        raise ValueError(f"{kdir}/kernel.yml: template is {spec.get('template')!r}; dev_build handles load_inline")
    flags = spec.get("flags", {})
    common, tgt = flags.get("common", {}), flags.get(target, {})

    def merged(key):
        return list(common.get(key, [])) + list(tgt.get(key, []))

    cuda_src = [inline_includes(kdir / f) for f in spec.get("cuda_sources", [])]
    cpp_src = [inline_includes(kdir / f) for f in spec.get("cpp_sources", [])]
    cflags, cuda_cflags, ldflags = merged("cflags"), merged("cuda_cflags"), merged("ldflags")
    digest = hashlib.sha256(repr((cuda_src, cpp_src, cflags, cuda_cflags, ldflags)).encode()).hexdigest()[:12]
    name = f"kbench_{problem.replace('-', '_')}_{backend}_{digest}"
    ext = load_inline(
        name=name,
        cpp_sources=cpp_src,
        cuda_sources=cuda_src,
        functions=spec.get("functions"),
        extra_cflags=cflags,
        extra_cuda_cflags=cuda_cflags,
        extra_ldflags=ldflags,
        verbose=verbose,
    )
    namespace = {"ext": ext, "__name__": f"kbench_entry_{problem}_{backend}"}
    entry = kdir / spec.get("entry", "entry.py")
    exec(compile(entry.read_text(), str(entry), "exec"), namespace)
    return ext, namespace["custom_kernel"]


if __name__ == "__main__":
    args = sys.argv[1:]
    problem = args[0] if args else "fp8-mm"
    backend = args[1] if len(args) > 1 else "cuda"
    ext, _ = load_backend(problem, backend, verbose=True)
    print(f"built {problem}/{backend}: {ext.__name__}")
