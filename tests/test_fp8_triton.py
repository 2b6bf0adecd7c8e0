"""The fp8-mm Triton backend, judged through a generated submission.

CPU tier: the Triton kernel itself runs under TRITON_INTERPRET=1 in a subprocess (the variable must be set before
triton is first imported, and this pytest process may already hold a compiled-mode triton).
GPU tier: every official test and benchmark case, inputs from the problem's generate_input, output checked by its
check_implementation, c poisoned with NaN first.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kbench import generator

REPO = Path(__file__).resolve().parents[1]

CPU_SCRIPT = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
os.environ["KBENCH_DEVICE"] = "cpu"
import importlib.util
import torch
import triton
from kbench import problems

ref = problems.load_modules("fp8-mm").reference
spec = importlib.util.spec_from_file_location("triton_submission", sys.argv[2])
sub = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sub)
kernel_module = sys.modules["fp8_blockwise"]
assert type(kernel_module.fp8_blockwise_gemm_kernel).__name__ == "InterpretedFunction", "not interpreted"
results = []
for case in json.loads(sys.argv[3]):
    data = ref.generate_input(**case)
    a, b, sa, sb, c = (t.clone() for t in data)
    c.fill_(float("nan"))
    out = sub.custom_kernel((a, b, sa, sb, c))
    ok, msg = ref.check_implementation(data, out)
    results.append(dict(case=case, ok=bool(ok), msg=msg, neg_a=bool((sa < 0).any()), neg_b=bool((sb < 0).any()),
                        nan=bool(out.isnan().any()), mode=kernel_module._mode(a)))

# The in-kernel decoder against torch for all 256 byte codes of both e4m3 flavours.
import triton.language as tl

@triton.jit
def decode_all(src, dst, FNUZ: tl.constexpr):
    i = tl.arange(0, 256)
    tl.store(dst + i, kernel_module._decode_fp8(tl.load(src + i), FNUZ))

codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
decode_ok = {}
for name, fnuz in (("float8_e4m3fnuz", True), ("float8_e4m3fn", False)):
    want = codes.view(getattr(torch, name)).float()
    got = torch.empty(256)
    decode_all[(1,)](codes, got, FNUZ=fnuz)
    nan = want.isnan()
    decode_ok[name] = bool(torch.equal(got.isnan(), nan) and torch.equal(got[~nan], want[~nan]))

# Bad input: one clear error naming the rule.
errors = []
a = torch.zeros(64, 100).to(torch.float8_e4m3fnuz)
for args in ((a, a, torch.zeros(64, 1), torch.zeros(1, 1), torch.zeros(64, 64, dtype=torch.bfloat16)),
             (a.float(), a.float(), None, None, None)):
    try:
        kernel_module.fp8_blockwise_mm(*args)
        errors.append("accepted")
    except (TypeError, ValueError) as e:
        errors.append(str(e))
print(json.dumps(dict(results=results, decode=decode_ok, errors=errors)))
"""

# m=96 leaves a partial row tile (an official test has m=96); n=192 and n=320 are not multiples of 128 (a partial
# b-scale block and masked tile columns); k spans 1 to 3 scale blocks.
SMOKE = [dict(m=64, n=64, k=128, seed=11), dict(m=96, n=192, k=256, seed=12), dict(m=128, n=320, k=384, seed=13)]


@pytest.fixture(scope="module")
def submission(tmp_path_factory):
    return generator.generate("fp8-mm", "triton", target="h100",
                              out=tmp_path_factory.mktemp("fp8_triton") / "submission.py")


def test_triton_kernel_under_interpreter_matches_reference(submission):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    r = subprocess.run([sys.executable, "-c", CPU_SCRIPT, str(REPO), str(submission), json.dumps(SMOKE)],
                       capture_output=True, text=True, timeout=300, env=env, cwd=submission.parent)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["decode"] == {"float8_e4m3fnuz": True, "float8_e4m3fn": True}
    assert [x["case"] for x in report["results"]] == SMOKE
    for res in report["results"]:
        assert res["mode"] == "decode"
        assert res["ok"] and not res["nan"], res
    assert any(x["neg_a"] for x in report["results"]) and any(x["neg_b"] for x in report["results"])
    assert "k must be a multiple of 128" in report["errors"][0]
    assert "float8_e4m3fnuz or float8_e4m3fn" in report["errors"][1]


COMPILE_SCRIPT = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("triton_submission", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import triton
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as e:
    print(json.dumps({"skip": f"this triton has no offline compile API ({e})"})); sys.exit(0)
mod = sys.modules["fp8_blockwise"]
sig = {name: "i32" for name in ("M", "N", "K", "stride_am", "stride_ak", "stride_bn", "stride_bk", "stride_asm",
                                "stride_ask", "stride_bsn", "stride_bsk", "stride_cm", "stride_cn")}
sig.update(a_ptr="*fp8e4nv", b_ptr="*fp8e4nv", as_ptr="*fp32", bs_ptr="*fp32", c_ptr="*bf16", out_scale="fp32")
out = {}
for m, n in ((64, 64), (96, 7168), (6144, 7168)):  # one shape per tile config of _config
    cfg = mod._config(m, n, "nv")
    const = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=128, GROUP_M=8, NATIVE=True, FNUZ=True, WIDEN=True)
    try:
        src = ASTSource(fn=mod.fp8_blockwise_gemm_kernel, signature={**sig, **{k: "constexpr" for k in const}},
                        constexprs=const)
    except TypeError as e:
        print(json.dumps({"skip": f"ASTSource API differs in triton {triton.__version__} ({e})"})); sys.exit(0)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])).asm["ptx"]
    mma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    out[f"{m}x{n}"] = dict(wgmma=bool(mma), f16=all(".f32.f16.f16" in line for line in mma), e4m3="e4m3" in ptx)
print(json.dumps(out))
"""


def test_evaluator_runs_the_triton_submission_on_the_cpu(submission, monkeypatch):
    """`kbench test fp8-mm --backend triton --device cpu`: the evaluator's CPU workers pick Triton's interpreter
    themselves (no TRITON_INTERPRET needed in the caller's environment)."""
    from kbench import evaluator
    from kbench import problems

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cases = [problems.official_case(c) for c in problems.load_spec("fp8-mm").smoke]
    record = evaluator.run("fp8-mm", submission, mode="test", cases=cases, device="cpu")
    assert [c.status for c in record.cases] == ["pass"] * len(cases), [c.message for c in record.cases]


def test_native_path_compiles_to_widened_fp16_wgmma_for_sm90(submission):
    """Without a GPU, Triton can still lower the H100 path to PTX: every tile config must convert the e4m3 tiles and
    multiply them with fp16 wgmma accumulating in fp32 (FP8 wgmma misses the official tolerance on Hopper)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    r = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, str(submission)], capture_output=True, text=True,
                       timeout=300, env=env, cwd=submission.parent)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    assert report == {k: dict(wgmma=True, f16=True, e4m3=True) for k in ("64x64", "96x7168", "6144x7168")}


# ------------------------------------------------------------------------------------------------------------
# GPU: the official cases


def _official(kind):
    from kbench import problems

    return [problems.official_case(c) for c in problems.load_spec("fp8-mm").cases(kind)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["tests", "benchmarks"])
def test_triton_submission_passes_official_cases_on_gpu(submission, kind):
    from kbench import problems
    import torch

    ref = problems.load_modules("fp8-mm").reference
    spec = importlib.util.spec_from_file_location(f"fp8_triton_gpu_{kind}", submission)
    sub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sub)
    failures = []
    for case in _official(kind):
        data = ref.generate_input(**case)
        a, b, sa, sb, c = (t.clone() for t in data)
        c.fill_(float("nan"))
        out = sub.custom_kernel((a, b, sa, sb, c))
        torch.cuda.synchronize()
        ok, msg = ref.check_implementation(data, out)
        if not ok:
            failures.append(f"{case}: {msg}")
    assert not failures, "\n".join(failures)
