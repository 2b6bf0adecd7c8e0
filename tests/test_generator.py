"""generator.py: kernels/<problem>/<backend>/ -> one submission.py.

Real backends under kernels/ are rendered for every target; the include resolver, the manifest checks and the
overwrite guard are exercised on small kernel trees built in tmp_path (KBENCH_KERNELS-style root argument).
"""
import ast
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kbench import generator, problems
from kbench.generator import GeneratorError

REPO = Path(__file__).resolve().parents[1]
REAL = [(p, b) for p in generator.list_problems() for b in generator.list_backends(p)]


def header(text: str) -> dict:
    """The `# key: value` lines of the generated header."""
    out = {}
    for line in text.splitlines()[:8]:
        hit = re.match(r"# (problem|backend|target|source-sha256): (\S+)$", line)
        if hit:
            out[hit.group(1)] = hit.group(2)
    return out


def literal(text: str, name: str) -> str:
    """Value of the top-level string assignment `name = '...'` in a generated file."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not assigned in the generated file")


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


CUDA_TREE = {
    "demo/cuda/kernel.yml": """
        template: load_inline
        entry: entry.py
        cuda_sources: [kernel.cu]
        cpp_sources: [binding.cpp]
        functions: [add_scaled]
        include_dirs: [../common]
        flags:
          common: {cflags: [-O2], cuda_cflags: [-O3]}
        """,
    "demo/cuda/kernel.cu": """
        #include <cuda_runtime.h>
        #include "common.cuh"
        #include "ops.cuh"
        #include "shared.cuh"
        __global__ void add_scaled_kernel(float* x, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) x[i] = demo_op(x[i]);
        }
        void launch_add_scaled(float* x, int n) {
            add_scaled_kernel<<<(n + 255) / 256, 256>>>(x, n);
        }
        """,
    "demo/cuda/common.cuh": """
        #pragma once
        // MARK-COMMON
        #define DEMO_SCALE 3.0f
        #define DEMO_OFFSET 1.0f
        """,
    "demo/cuda/ops.cuh": """
        #include "common.cuh"
        __device__ inline float demo_op(float v) { return v * DEMO_SCALE + DEMO_OFFSET; }
        """,
    "demo/common/shared.cuh": "// MARK-SHARED\n",
    "demo/cuda/binding.cpp": """
        #include <torch/extension.h>
        #include "decl.h"
        torch::Tensor add_scaled(torch::Tensor x) {
            launch_add_scaled(x.data_ptr<float>(), (int)x.numel());
            return x;
        }
        """,
    "demo/cuda/decl.h": "void launch_add_scaled(float* x, int n);\n",
    "demo/cuda/entry.py": """
        from __future__ import annotations


        def custom_kernel(data):
            return ext.add_scaled(data)
        """,
    "demo/py/kernel.yml": "template: python\nentry: entry.py\nmodules: [helpers.py, scale.py]\n",
    # helpers imports scale at import time although scale is listed after it: the import hook must not care.
    "demo/py/helpers.py": """
        import scale


        def twice(x):
            return scale.FACTOR * x
        """,
    "demo/py/scale.py": "FACTOR = 2\n",
    "demo/py/entry.py": """
        import inspect

        import helpers


        def custom_kernel(data):
            # triton.jit needs the source of functions in inlined modules; so does this check.
            assert "scale.FACTOR" in inspect.getsource(helpers.twice)
            return helpers.twice(data)
        """,
}


IDENTITY = "def custom_kernel(d):\n    return d\n"


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "kernels", CUDA_TREE)


# ------------------------------------------------------------------------------------------------------------
# every real backend


@pytest.mark.parametrize("problem,backend", REAL, ids=[f"{p}/{b}" for p, b in REAL])
def test_real_backend_renders_deterministic_and_clean(problem, backend):
    for target in [t for t in generator.runs_on(problem, backend) if t in generator.TARGETS]:
        text = generator.render(problem, backend, target)
        assert text == generator.render(problem, backend, target)  # byte-identical
        assert text.startswith(f"#!POPCORN leaderboard {problems.load_spec(problem).leaderboard}\n#!POPCORN gpu ")
        assert generator.MARKER in text.splitlines()[2]
        h = header(text)
        assert (h["problem"], h["backend"], h["target"]) == (problem, backend, target)
        assert re.fullmatch(r"[0-9a-f]{64}", h["source-sha256"])
        tree = ast.parse(text)
        assert any(isinstance(n, ast.FunctionDef) and n.name == "custom_kernel" or
                   isinstance(n, ast.ImportFrom) and "custom_kernel" in [a.asname or a.name for a in n.names]
                   for n in tree.body)
        generator.check_imports(tree, set(generator.ALLOWED_IMPORTS) | set(_packed_modules(tree)), "out")


def _packed_modules(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_KBENCH_MODULES":
            return list(ast.literal_eval(node.value))
    return []


def _manifest(problem, backend):
    """The backend's manifest, or None when it is broken (the render test above then fails with the reason)."""
    try:
        return generator.load_manifest(generator.kernels_root() / problem / backend, "kernel.yml")
    except GeneratorError:
        return None


PY_REAL = [(p, b) for p, b in REAL if getattr(_manifest(p, b), "template", None) == "python"]


IMPORT_ALL = """
import importlib.util, sys
for folder in sys.argv[1:]:
    for name in ("task", "utils", "submission"):
        sys.modules.pop(name, None)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location("submission", folder + "/submission.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["submission"] = mod
        spec.loader.exec_module(mod)
        assert callable(mod.custom_kernel), "custom_kernel is not callable"
        print("ok", folder)
    except Exception as e:
        print("FAIL", folder, type(e).__name__, e)
    finally:
        sys.path.remove(folder)
"""


def test_real_python_backends_import_alone(tmp_path):
    """Each file imports in a fresh process with only task.py and utils.py beside it (as on the leaderboard)."""
    folders = []
    for problem, backend in PY_REAL:
        folder = tmp_path / f"{problem}__{backend}"
        generator.generate(problem, backend, out=folder / "submission.py")
        for name, src in (("task.py", REPO / "problems" / problem / "task.py"),
                          ("utils.py", REPO / "problems" / "utils.py")):
            if src.is_file():
                shutil.copy(src, folder / name)
        folders.append(str(folder))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the repo on the path
    env.update(TRITON_INTERPRET="1", KBENCH_DEVICE="cpu")
    r = subprocess.run([sys.executable, "-c", IMPORT_ALL, *folders], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "FAIL" not in r.stdout and r.stdout.count("ok ") == len(folders), r.stdout + r.stderr[-2000:]


def test_unknown_names_list_known_ones():
    with pytest.raises(GeneratorError, match=r"unknown backend 'nope' for fp8-mm \(known: .*triton"):
        generator.render("fp8-mm", "nope", "h100")
    with pytest.raises(GeneratorError, match=r"unknown problem 'nope'.*known: .*fp8-mm"):
        generator.list_backends("nope")
    with pytest.raises(GeneratorError, match=r"unknown target 'a100' \(known: h100, h200, mi300x\)"):
        generator.render("fp8-mm", "triton", "a100")


# ------------------------------------------------------------------------------------------------------------
# load_inline packing: includes, hash, flags, targets


def test_includes_resolved_once_and_system_includes_kept(tree):
    text = generator.render("demo", "cuda", "h100", root=tree)
    cuda = literal(text, "_CUDA_SOURCE")
    assert cuda.count("MARK-COMMON") == 1  # included by kernel.cu and again by ops.cuh
    assert cuda.count("MARK-SHARED") == 1  # found through include_dirs
    assert "#include <cuda_runtime.h>" in cuda
    assert '#include "' not in cuda and "pragma once" not in cuda
    assert cuda.index("DEMO_SCALE 3.0f") < cuda.index("demo_op(float v)") < cuda.index("add_scaled_kernel")
    cpp = literal(text, "_CPP_SOURCE")
    assert "void launch_add_scaled(float* x, int n);" in cpp and "#include <torch/extension.h>" in cpp
    assert "from __future__ import annotations" in text.split("import os")[0]  # hoisted above everything


def test_ext_name_follows_sources_and_flags(tree):
    def name_and_hash(target="h100"):
        text = generator.render("demo", "cuda", target, root=tree)
        name = re.search(r"name='(kbench_demo_cuda_[0-9a-f]{16})'", text).group(1)
        assert name.endswith(header(text)["source-sha256"][:16])
        return name

    first = name_and_hash()
    assert name_and_hash() == first  # unchanged sources reuse the build
    (tree / "demo/common/shared.cuh").write_text("// MARK-SHARED edited\n")
    second = name_and_hash()
    assert second != first  # a header edit rebuilds
    yml = tree / "demo/cuda/kernel.yml"
    yml.write_text(yml.read_text().replace("-O3", "-O2"))
    assert name_and_hash() != second  # a flag edit rebuilds
    assert name_and_hash("mi300x") != name_and_hash("h100")


def test_python_hash_follows_module_sources_and_not_location(tree, tmp_path):
    first = generator.render("demo", "py", "h100", root=tree)
    moved = shutil.copytree(tree, tmp_path / "elsewhere" / "kernels")
    assert generator.render("demo", "py", "h100", root=moved) == first  # no absolute paths leak in
    (moved / "demo/py/scale.py").write_text("FACTOR = 3\n")
    assert header(generator.render("demo", "py", "h100", root=moved))["source-sha256"] != \
        header(first)["source-sha256"]


def test_target_flags_and_rocm_env(tree):
    h100 = generator.render("demo", "cuda", "h100", root=tree)
    assert "extra_cuda_cflags=['-O3', '-gencode=arch=compute_90a,code=sm_90a']" in h100
    assert "extra_cflags=['-O2']" in h100 and "os.environ" not in h100
    mi = generator.render("demo", "cuda", "mi300x", root=tree)
    assert "extra_cuda_cflags=['-O3', '--offload-arch=gfx942']" in mi
    torch_at = mi.index("import torch")
    assert 0 < mi.index("os.environ['PYTORCH_ROCM_ARCH'] = 'gfx942'") < torch_at
    assert 0 < mi.index("os.environ.setdefault('CXX', 'hipcc')") < torch_at


def test_missing_header_names_the_includer(tree):
    (tree / "demo/cuda/ops.cuh").write_text('// x\n#include "nowhere.cuh"\n')
    with pytest.raises(GeneratorError, match=r'demo/cuda/ops.cuh:2: #include "nowhere.cuh" not found'):
        generator.render("demo", "cuda", "h100", root=tree)


def test_include_cycle_shows_the_chain(tree):
    (tree / "demo/cuda/ops.cuh").write_text('#include "loop.cuh"\n')
    (tree / "demo/cuda/loop.cuh").write_text('#include "ops.cuh"\n')
    with pytest.raises(GeneratorError) as err:
        generator.render("demo", "cuda", "h100", root=tree)
    assert "include cycle: kernels/demo/cuda/ops.cuh -> kernels/demo/cuda/loop.cuh -> kernels/demo/cuda/ops.cuh" \
        in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("yml,match", [
    ("entry: entry.py\n", r"kernel.yml: key 'template' is required"),
    ("template: python\n", r"key 'entry' is required"),
    ("template: jit\nentry: entry.py\n", r"key 'template' must be load_inline or python, got 'jit'"),
    ("template: python\nentry: entry.py\nfoo: 1\n", r"unknown key 'foo'"),
    ("template: python\nentry: entry.py\nmodules: helpers.py\n", r"key 'modules' must be a list"),
    ("template: python\nentry: entry.py\ncuda_sources: [k.cu]\n", r"key 'cuda_sources' only applies to .*load_inline"),
    ("template: load_inline\nentry: entry.py\n", r"needs key 'cuda_sources' or 'cpp_sources'"),
    ("template: load_inline\nentry: entry.py\ncpp_sources: [b.cpp]\nflags: {a100: {}}\n", r"key 'flags.a100'"),
    ("template: load_inline\nentry: entry.py\ncpp_sources: [b.cpp]\nflags: {h100: {nvcc: []}}\n",
     r"key 'flags.h100.nvcc' is unknown"),
    ("template: python\nentry: [oops\n", r"not valid YAML"),
    ("template: python\nentry: missing.py\n", r"entry file 'missing.py' not found"),
    ("template: load_inline\nentry: entry.py\ncpp_sources: [b.cpp]\ninclude_dirs: [nodir]\n",
     r"include_dirs entry 'nodir' is not a folder"),
])
def test_bad_manifest_names_the_key(tmp_path, yml, match):
    root = write_tree(tmp_path / "kernels", {"p/b/kernel.yml": yml, "p/b/entry.py": IDENTITY})
    with pytest.raises(GeneratorError, match=match) as err:
        generator.render("p", "b", "h100", root=root)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------------------
# python packing: modules, import checks


def test_python_modules_import_in_any_order_from_one_file(tree, tmp_path):
    out = generator.generate("demo", "py", out=tmp_path / "run" / "submission.py", root=tree)
    code = "import submission; print(submission.custom_kernel(21))"
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=out.parent, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr[-2000:]


@pytest.mark.parametrize("files,match", [
    ({"p/b/entry.py": "import mystuff\ndef custom_kernel(d):\n    return d\n"}, r"imports 'mystuff'"),
    ({"p/b/entry.py": "from .x import y\ndef custom_kernel(d):\n    return d\n"}, r"relative import"),
    ({"p/b/entry.py": "def kernel(d):\n    return d\n"}, r"does not define custom_kernel"),
    ({"p/b/entry.py": "def custom_kernel(d)\n"}, r"entry.py:1: "),
])
def test_output_checks(tmp_path, files, match):
    root = write_tree(tmp_path / "kernels", {"p/b/kernel.yml": "template: python\nentry: entry.py\n", **files})
    with pytest.raises(GeneratorError, match=match):
        generator.render("p", "b", "h100", root=root)


def test_module_may_not_shadow_stdlib_or_runner_modules(tmp_path):
    for name in ("json", "utils"):
        root = write_tree(tmp_path / f"k_{name}", {
            "p/b/kernel.yml": f"template: python\nentry: entry.py\nmodules: [{name}.py]\n",
            "p/b/entry.py": "def custom_kernel(d):\n    return d\n", f"p/b/{name}.py": "X = 1\n"})
        with pytest.raises(GeneratorError, match=f"would shadow the package '{name}'"):
            generator.render("p", "b", "h100", root=root)


@pytest.mark.parametrize("text", ["plain", "a'''b", "ends with \\", "ends with '", "crlf\r\nline", 'q"""q',
                                  "ünï\tx\n", "nul\0byte", "\\'''"])
def test_py_literal_round_trips(text):
    assert ast.literal_eval(generator.py_literal(text)) == text


# ------------------------------------------------------------------------------------------------------------
# writing the file


def test_generate_refuses_foreign_files_unless_forced(tree, tmp_path):
    out = tmp_path / "submission.py"
    out.write_text("def custom_kernel(data):\n    return data  # hand-written\n")
    with pytest.raises(GeneratorError, match=r"refusing to overwrite .*kbench did not generate it .*--force"):
        generator.generate("demo", "py", out=out, root=tree)
    assert "hand-written" in out.read_text()
    generator.generate("demo", "py", out=out, force=True, root=tree)
    first = out.read_bytes()
    assert first.startswith(generator.MARKER.encode())
    generator.generate("demo", "cuda", out=out, root=tree)  # our own file: replaced without force
    assert out.read_bytes() != first and header(out.read_text())["backend"] == "cuda"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels", "submission.py"]  # no temp file left


def test_generate_default_backend_falls_back_to_torch(tmp_path):
    root = write_tree(tmp_path / "kernels", {"nosuchproblem/torch/kernel.yml": "template: python\nentry: e.py\n",
                                             "nosuchproblem/torch/e.py": "def custom_kernel(d):\n    return d\n"})
    out = generator.generate("nosuchproblem", out=tmp_path / "s.py", root=root)
    assert header(out.read_text())["backend"] == "torch"


def test_kernels_root_from_env(tree, monkeypatch):
    monkeypatch.setenv("KBENCH_KERNELS", str(tree))
    assert generator.list_backends("demo") == ["cuda", "py"]


# ------------------------------------------------------------------------------------------------------------
# the packed CUDA source compiles on its own; the whole extension runs on a GPU


def test_line_directives_name_the_real_files_and_hide_from_nvcc_deps(tree):
    """#line keeps messages on the real files; in the CUDA source the names are bracketed so that nvcc's dependency
    file leaves them out (else ninja rebuilds the extension on every import: the names do not exist in torch's build
    folder). The C++ source keeps plain names: g++ lists only files it opened."""
    text = generator.render("demo", "cuda", "h100", root=tree)
    cuda_names = set(re.findall(r'^#line \d+ "(.*)"$', literal(text, "_CUDA_SOURCE"), re.M))
    assert cuda_names == {"<kernels/demo/cuda/kernel.cu>", "<kernels/demo/cuda/common.cuh>",
                          "<kernels/demo/cuda/ops.cuh>", "<kernels/demo/common/shared.cuh>"}
    cpp_names = set(re.findall(r'^#line \d+ "(.*)"$', literal(text, "_CPP_SOURCE"), re.M))
    assert cpp_names == {"kernels/demo/cuda/binding.cpp", "kernels/demo/cuda/decl.h"}


def nvcc_in_build_folder(source: str, folder: Path, timeout: int) -> list[str]:
    """Compile `source` as torch's build.ninja does (in the build folder, `-MD -MF`): the dependency file's paths that
    do not exist there, each of which would make ninja rebuild the extension on every import."""
    folder.mkdir()
    (folder / "packed.cu").write_text(source)
    r = subprocess.run(["nvcc", "-MD", "-MF", "packed.o.d", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                        "-c", "packed.cu", "-o", "packed.o"], cwd=folder, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    deps = (folder / "packed.o.d").read_text().replace("\\\n", " ").split(":", 1)[1].split()
    assert "packed.cu" in deps
    return [d for d in deps if not (folder / d).exists()]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_packed_cuda_source_compiles_standalone(tree, tmp_path):
    cuda = literal(generator.render("demo", "cuda", "h100", root=tree), "_CUDA_SOURCE")
    assert nvcc_in_build_folder(cuda, tmp_path / "build", timeout=300) == []  # the tree is in tmp_path


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_packed_cuda_errors_point_at_the_real_file(tree, tmp_path):
    (tree / "demo/cuda/ops.cuh").write_text('#include "common.cuh"\n\n__device__ inline float demo_op(float v) '
                                            '{ return v * DEMO_SCALE + ; }\n')
    (tmp_path / "packed.cu").write_text(literal(generator.render("demo", "cuda", "h100", root=tree), "_CUDA_SOURCE"))
    r = subprocess.run(["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-c", "packed.cu"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "<kernels/demo/cuda/ops.cuh>(3): error" in r.stdout + r.stderr, r.stdout + r.stderr


CUDA_REAL = [(p, b) for p, b in REAL if getattr(_manifest(p, b), "cuda_sources", None)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("problem,backend", CUDA_REAL or [(None, None)],
                         ids=[f"{p}/{b}" for p, b in CUDA_REAL] or ["none"])
def test_real_packed_cuda_source_compiles_standalone(problem, backend, tmp_path):
    """The one translation unit kbench packs from a real backend compiles as nvcc would see it (sans torch)."""
    if problem is None:
        pytest.skip("no load_inline backend with cuda_sources under kernels/ yet")
    cuda = literal(generator.render(problem, backend, "h100"), "_CUDA_SOURCE")
    assert nvcc_in_build_folder(cuda, tmp_path / "build", timeout=600) == []


@pytest.mark.gpu
def test_load_inline_submission_runs_on_gpu(tree, tmp_path):
    import torch

    out = generator.generate("demo", "cuda", out=tmp_path / "submission.py", root=tree)
    code = ("import torch, submission\n"
            "x = torch.randn(1000, device='cuda')\n"
            "y = submission.custom_kernel(x.clone())\n"
            "torch.cuda.synchronize()\n"
            # the kernel's fused multiply-add rounds once, torch's x * 3 + 1 twice: allow one fp32 rounding step
            "assert torch.allclose(y, x * 3 + 1, rtol=1e-6, atol=1e-6), (y - x * 3 - 1).abs().max()\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=out.parent, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
    assert torch.cuda.is_available()
    # the next process's import must find the build: ninja, asked what it would redo, has nothing to do (a missing
    # dependency, such as a #line name nvcc listed, made every import rebuild)
    from torch.utils.cpp_extension import _get_build_directory

    name = re.search(r"name='(kbench_demo_cuda_[0-9a-f]{16})'", out.read_text()).group(1)
    ninja = subprocess.run(["ninja", "-n", "-d", "explain", "-C", _get_build_directory(name, verbose=False)],
                           capture_output=True, text=True, timeout=60)
    assert ninja.returncode == 0 and "no work to do" in ninja.stdout, ninja.stdout + ninja.stderr
