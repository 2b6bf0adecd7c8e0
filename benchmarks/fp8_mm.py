"""fp8-mm on a Hopper GPU: correctness of the CUDA backend on every official shape (+ random extras), then timing
against torch._scaled_mm blockwise (cuBLAS) and the Triton backend, all in one process on the same inputs.

    python benchmarks/fp8_mm.py              # check + benchmark, table last, JSON/markdown under $OUT
    python benchmarks/fp8_mm.py --quick      # a few small shapes only (for compute-sanitizer)
    python benchmarks/fp8_mm.py --no-sweep   # skip the per-shape plan sweep

Timing: CUDA events around one call, a 256 MB buffer written before every run (L2 flush), median of --runs.
Candidates: per benchmark shape, the default is timed twice (the spread) next to alternative plans/schedules
(`fp8_gemm_with_sched`), each checked strictly on that shape before it is timed; a second table compares them.
"ours" is the default (exact, fp16-MMA) path and includes everything a call does (transpose + widening of the
column-major operands, GEMM, split-K finish). "fp8-MMA" is the inexact FP8-MMA path: end to end, and kernel-only
on operands already K-major. cuBLAS's blockwise FP8 misses the official tolerance like our FP8-MMA path (the
table flags it); it is timed anyway as the peer a user would pick.
cuBLAS is timed twice: kernel-only on operands already made K-contiguous, and end-to-end including the
.contiguous() copies a user must make from the column-major inputs (the 0.5 scale folds stay outside both).
Floor = max(2mnk / 1444e12, minimal bytes / 2.99e12) (H100 measured ceilings, ../shared/BASELINES.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dev_build import load_backend  # noqa: E402
from problems import load_modules, load_spec  # noqa: E402

RTOL, ATOL = 2e-2, 1e-3
FP8_FLOPS, F16_FLOPS, HBM_BPS = 1444e12, 795e12, 2.99e12
EXTRA_SHAPES = [(64, 64, 128), (96, 320, 384), (192, 576, 1152), (320, 704, 256), (1024, 192, 640),
                (2048, 2560, 3072), (128, 4160, 512), (6144, 64, 128), (576, 1216, 2048)]
# (tile width, k-splits, exact, consumer schedule): exact=True is the fp16-MMA path that meets the tolerance, False
# the FP8-MMA path; schedule (exact path only, gemm.cuh): 0 lock step, 1 ordered issue, 2 strict alternation,
# 3 split chains with early promotion, 4 split chains; +8: C staged in halves, one more stage (bn 128 only);
# +16: split-K partials stored into per-split fp32 slices (no memset, no atomics), summed by the finishing pass.
CHECK_PLANS = [(128, 1, True, 0), (64, 1, True, 0), (128, 2, True, 0), (64, 3, True, 0), (128, 4, True, 0),
               (128, 1, False, 0), (64, 2, False, 0), (128, 1, True, 1), (128, 2, True, 2), (64, 1, True, 2),
               (64, 3, True, 1), (128, 4, True, 1), (128, 1, True, 3), (128, 2, True, 4), (64, 1, True, 3),
               (64, 3, True, 4), (128, 1, True, 8), (128, 4, True, 11), (128, 2, True, 8), (128, 1, True, 11),
               (128, 2, True, 16), (64, 3, True, 16), (128, 4, True, 24), (128, 3, True, 24), (64, 2, False, 16)]
# Candidates, checked on every shape and timed next to the default: name -> schedule made from the automatic
# plan's schedule flags (8: 6 stages, 16: split-K slices), passed with bn 0 (keep the automatic tile and split).
# Empty now: the last ones (stream-K, rolling promotion) lost and were removed (docs/fp8-mm-notes.md, v12-v13).
CAND_VARIANTS = {}
SWEEP_PLANS = [(128, 1, True), (64, 1, True), (128, 2, True), (64, 2, True), (128, 4, True), (128, 1, False)]


def floor_us(m, n, k):
    bytes_ = m * k + n * k + 4 * (m * (k // 128) + -(-n // 128) * (k // 128)) + 2 * m * n
    return 1e6 * max(2.0 * m * n * k / FP8_FLOPS, bytes_ / HBM_BPS)


def fp16_path_floor_us(m, n, k):
    """Floor of any exact (fp16-MMA) path: the GEMM at the measured fp16 MMA ceiling plus one widening pass (read
    the fp8 operands once, write them as fp16 once)."""
    return 1e6 * (2.0 * m * n * k / F16_FLOPS + 3 * (m + n) * k / HBM_BPS)


def reference_f32(a, b, sa, sb):
    """fp32 c[m,n] from the definition (dequantise, fp32 matmul without TF32)."""
    m, k = a.shape
    n = b.shape[0]
    af = a.float() * sa.repeat_interleave(128, dim=1)[:, :k]
    bf = b.float() * sb.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return af @ bf.T


def check(fn, data, expected, label, strict=True):
    """Poison c with NaN, run, compare with the fp32 reference; returns (ok, message).

    strict: the official elementwise tolerance. Otherwise (plans that promote FP8 partial sums less often and
    so carry the tensor core's truncated accumulation) only a relative-norm error under 1e-2, which still
    catches indexing and synchronisation bugs. The message always gives `ratio`, the worst
    |out - ref| / (atol + rtol |ref|): the official check passes when it is <= 1.
    """
    a, b, sa, sb, c = data
    c.fill_(float("nan"))
    out = fn((a, b, sa, sb, c)).float()
    torch.cuda.synchronize()
    if not torch.isfinite(out).all():
        return False, f"{label}: {(~torch.isfinite(out)).sum().item()} non-finite outputs (unwritten or NaN)"
    ratio = ((out - expected).abs() / (ATOL + RTOL * expected.abs())).max().item()
    rel = ((out - expected).norm() / expected.norm()).item()
    close = torch.isclose(out, expected, rtol=RTOL, atol=ATOL)
    if strict and not close.all():
        bad = (~close).nonzero()[:3].tolist()
        return False, f"{label}: {(~close).sum().item()} mismatches, first {bad}, rel err {rel:.2e}, ratio {ratio:.2f}"
    if not strict and not rel < 1e-2:
        return False, f"{label}: rel err {rel:.2e} (ratio {ratio:.2f})"
    return True, f"{label}: ok, rel err {rel:.2e}, ratio {ratio:.2f}"


class Timer:
    """Median of CUDA-event timings of fn, each run preceded by a 256 MB write that evicts L2."""

    def __init__(self):
        self.flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")

    def __call__(self, fn, runs=25, warmup=3):
        for _ in range(warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        for i in range(runs):
            self.flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        t = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
        return t[len(t) // 2]


def cublas_fns(a, b, sa, sb, expected):
    """(kernel_only, end_to_end) callables for torch._scaled_mm blockwise, or (None, None, why)."""
    if not hasattr(torch, "_scaled_mm"):
        return None, None, "torch._scaled_mm missing"
    e4 = torch.float8_e4m3fn
    sa_h = sa * 0.5  # fnuz bytes read as e4m3fn are 2x: fold 0.5 per operand (kept out of the timing)
    sb_h = (sb * 0.5).contiguous()
    a_k = a.contiguous().view(e4)
    b_k = b.contiguous().view(e4)
    why = "no scale layout accepted"
    for sb_arg in (sb_h.T, sb_h.T.contiguous(), sb_h.T.contiguous().T.contiguous().T):
        try:
            out = torch._scaled_mm(a_k, b_k.T, scale_a=sa_h, scale_b=sb_arg, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - try the next layout
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            continue
        ratio = ((out.float() - expected).abs() / (ATOL + RTOL * expected.abs())).max().item()
        rel = ((out.float() - expected).norm() / expected.norm()).item()
        if not rel < 1e-2:  # far off: a wrong scale layout, not FP8 accumulation error
            why = f"result mismatch (rel err {rel:.2e})"
            continue
        why = "" if ratio <= 1 else f"misses the official tolerance (worst ratio {ratio:.2f}); timed anyway"

        def kernel_only(sb_arg=sb_arg):
            return torch._scaled_mm(a_k, b_k.T, scale_a=sa_h, scale_b=sb_arg, out_dtype=torch.bfloat16)

        def end_to_end(sb_arg=sb_arg):
            ak = a.contiguous().view(e4)
            bk = b.contiguous().view(e4)
            return torch._scaled_mm(ak, bk.T, scale_a=sa_h, scale_b=sb_arg, out_dtype=torch.bfloat16)

        return kernel_only, end_to_end, why
    return None, None, why


def load_triton():
    tdir = ROOT / "kernels" / "fp8-mm" / "triton"
    if not (tdir / "entry.py").is_file():
        return None, "kernels/fp8-mm/triton missing"
    try:
        sys.path.insert(0, str(tdir))
        ns = {"__name__": "fp8mm_triton_entry"}
        exec(compile((tdir / "entry.py").read_text(), str(tdir / "entry.py"), "exec"), ns)
        return ns["custom_kernel"], ""
    except Exception as exc:  # noqa: BLE001
        return None, f"triton import failed: {type(exc).__name__}: {exc}"


def geomean(xs):
    """Geometric mean of the values present; None when any is missing (a partial geomean would mislead)."""
    if not xs or any(not x for x in xs):
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small shapes only, no timing (for compute-sanitizer)")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--split-variants", action="store_true", help="also time split-K 1/2/4 with schedules 0/1")
    ap.add_argument("--runs", type=int, default=25)
    ap.add_argument("--profile", metavar="M,N,K[;M,N,K...]",
                    help="only run these shapes 3 times each (auto plan, or --sched), e.g. under ncu")
    ap.add_argument("--sched", type=int, action="append",
                    help="with --profile: also run fp8_gemm_with_sched(bn 0, splits 1, exact, SCHED) (repeatable)")
    ap.add_argument("--triton-budget-s", type=float, default=120.0, help="stop timing Triton after this long")
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", ROOT / ".device-out"))
    out_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    ext, custom_kernel = load_backend("fp8-mm", "cuda")
    print(f"built in {time.time() - t0:.1f}s; {torch.cuda.get_device_name()}", flush=True)
    mods = load_modules("fp8-mm")
    spec = load_spec("fp8-mm")

    def gen(m, n, k, seed):
        return mods.reference.generate_input(m=m, n=n, k=k, seed=seed)

    if args.profile:
        for shape in args.profile.split(";"):
            m, n, k = (int(x) for x in shape.split(","))
            data = gen(m, n, k, 1)
            for _ in range(3):
                custom_kernel(data)
            for sc in args.sched or []:
                for _ in range(3):
                    ext.fp8_gemm_with_sched(*data, 0, 1, True, sc)
            torch.cuda.synchronize()
            print(f"profiled {m}x{n}x{k} plan={ext.fp8_gemm_plan_for(m, n, k)}, then schedules {args.sched or []}")
        return

    # ---------------- correctness ----------------
    failures = []
    if args.quick:
        cases = [(64, 64, 128, 1), (96, 576, 384, 2), (256, 320, 1024, 3), (576, 1216, 2048, 4)]
    else:
        cases = [(c["m"], c["n"], c["k"], c["seed"]) for c in list(spec.tests) + list(spec.benchmarks)]
        cases += [(m, n, k, 1000 + i) for i, (m, n, k) in enumerate(EXTRA_SHAPES)]
    for m, n, k, seed in cases:
        data = gen(m, n, k, seed)
        expected = reference_f32(*data[:4])
        auto_plan = ext.fp8_gemm_plan_for(m, n, k)
        ok, msg = check(custom_kernel, data, expected, f"auto {m}x{n}x{k} plan={auto_plan}")
        print(msg, flush=True)
        if not ok:
            failures.append(msg)
        if args.quick or m * n * k <= 2**33:  # every plan on the smaller shapes
            for bn, sp, ex, sc in CHECK_PLANS:
                fn = lambda d, bn=bn, sp=sp, ex=ex, sc=sc: ext.fp8_gemm_with_sched(*d, bn, sp, ex, sc)  # noqa: E731
                ok, msg = check(fn, data, expected, f"  plan ({bn},{sp},{int(ex)},s{sc}) {m}x{n}x{k}", strict=ex)
                print(msg, flush=True)
                if not ok:
                    failures.append(msg)
        for name, make in CAND_VARIANTS.items():  # every candidate on every shape
            sc = make(auto_plan[3])
            fn = lambda d, sc=sc: ext.fp8_gemm_with_sched(*d, 0, 1, True, sc)  # noqa: E731
            ok, msg = check(fn, data, expected, f"  candidate {name} (schedule {sc}) {m}x{n}x{k}")
            print(msg, flush=True)
            if not ok:
                failures.append(msg)
        # K-major operands (normalised by the binding) must give the same result.
        a, b, sa, sb, c = data
        ok, msg = check(lambda d: ext.fp8_gemm(d[0].contiguous(), d[1].contiguous(), *d[2:]), data, expected,
                        f"  k-major inputs {m}x{n}x{k}")
        if not ok:
            print(msg, flush=True)
            failures.append(msg)
        # Official verdict through the problem's own checker.
        c.zero_()
        ok_off, why = mods.reference.check_implementation(data, custom_kernel(data))
        if not ok_off:
            failures.append(f"official check {m}x{n}x{k}: {why}")
            print(failures[-1], flush=True)
        del data, expected
    print(f"correctness: {len(cases)} shapes, {len(failures)} failures", flush=True)
    if args.quick:
        sys.exit(1 if failures else 0)

    # ---------------- timing ----------------
    timer = Timer()
    triton_fn, triton_note = (None, "--no-triton") if args.no_triton else load_triton()
    rows = []
    triton_spent = 0.0
    for c in spec.benchmarks:
        m, n, k = c["m"], c["n"], c["k"]
        data = gen(m, n, k, c["seed"])
        a, b, sa, sb, cbuf = data
        expected = reference_f32(a, b, sa, sb)
        row = {"m": m, "n": n, "k": k, "floor_us": floor_us(m, n, k), "plan": ext.fp8_gemm_plan_for(m, n, k)}
        row["ours_us"] = timer(lambda: custom_kernel(data), args.runs)
        ak, bk = a.contiguous(), b.contiguous()
        # The FP8-MMA path (inexact): end to end, and kernel-only on operands already K-major (no transpose).
        row["fp8_us"] = timer(lambda: ext.fp8_gemm_with_plan(a, b, sa, sb, cbuf, 128, 1, False), args.runs)
        row["gemm_only_us"] = timer(lambda: ext.fp8_gemm_with_plan(ak, bk, sa, sb, cbuf, 128, 1, False), args.runs)
        if not args.no_sweep:
            sweep = {}
            for bn, sp, ex in SWEEP_PLANS:
                if sp > 1 and k // 128 < 2 * sp:
                    continue
                sweep[f"{bn},{sp},{int(ex)}"] = timer(
                    lambda: ext.fp8_gemm_with_plan(a, b, sa, sb, cbuf, bn, sp, ex), args.runs)
            exact_sweep = {key: v for key, v in sweep.items() if key.endswith(",1")}
            row["sweep_us"] = sweep
            best = min(exact_sweep, key=exact_sweep.get)
            row["best_plan"], row["best_us"] = best, exact_sweep[best]
        # Candidates: each is checked (strict, NaN-poisoned) on this very shape before it is timed.
        cand = {}
        auto_sp, kb = row["plan"][1], k // 128
        variants = {name: (0, 1, make(row["plan"][3])) for name, make in CAND_VARIANTS.items()}
        if args.split_variants:
            for sp in (2, 3, 4):  # split-K with per-split slices (+16), lock step with 5 or 6 (+8) stages
                if kb >= 4 * sp:
                    variants[f"128,{sp},s16"] = (128, sp, 16)
                    variants[f"128,{sp},s24"] = (128, sp, 24)
            for sp in (1, 2, 4):
                if sp != auto_sp and (sp == 1 or kb >= 4 * sp):
                    variants[f"128,{sp},s1"] = (128, sp, 1)
                    variants[f"128,{sp},s0"] = (128, sp, 0)
        for name, (bn, sp, sc) in variants.items():
            fn = lambda d, bn=bn, sp=sp, sc=sc: ext.fp8_gemm_with_sched(*d, bn, sp, True, sc)  # noqa: E731
            ok, msg = check(fn, data, expected, f"candidate {name} {m}x{n}x{k}")
            if not ok:
                print(msg, flush=True)
                failures.append(msg)
                cand[name] = None
                continue
            cand[name] = timer(lambda: fn(data), args.runs)
        row["cand_us"] = cand
        row["ours2_us"] = timer(lambda: custom_kernel(data), args.runs)  # same version again: the noise
        # The fp16 MMA peer: cuBLAS fp16 GEMM on operands already widened and K-major, without the blockwise
        # scales (so not a solution, a bound on what the exact path's GEMM part could reach with vendor code).
        a16, b16 = ak.float().half(), bk.float().half()
        row["cublas_f16_us"] = timer(lambda: torch.mm(a16, b16.T), args.runs)
        row["f16_floor_us"] = fp16_path_floor_us(m, n, k)
        del a16, b16
        kern, e2e, why = cublas_fns(a, b, sa, sb, expected)
        row["cublas_note"] = why
        row["cublas_kernel_us"] = timer(kern, args.runs) if kern else None
        row["cublas_e2e_us"] = timer(e2e, args.runs) if e2e else None
        row["triton_us"] = None
        if triton_fn is not None and triton_spent > args.triton_budget_s:
            triton_note = f"stopped after {triton_spent:.0f}s (--triton-budget-s)"
            triton_fn = None
        if triton_fn is not None:
            t_tr = time.time()
            try:
                ok, msg = check(triton_fn, data, expected, "triton", strict=False)
                row["triton_us"] = timer(lambda: triton_fn(data), args.runs) if ok else None
                row["triton_note"] = msg
            except Exception as exc:  # noqa: BLE001
                row["triton_note"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            triton_spent += time.time() - t_tr
        row["sol_pct"] = 100.0 * row["floor_us"] / row["ours_us"]
        row["slower_than_cublas"] = bool(row["cublas_kernel_us"] and row["ours_us"] > row["cublas_kernel_us"])
        rows.append(row)
        print(json.dumps(row), flush=True)
        del data, expected, ak, bk

    ran_cublas = [r for r in rows if r["cublas_kernel_us"]]
    summary = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "geomean_floor_us": geomean([r["floor_us"] for r in rows]),
        "geomean_f16_floor_us": geomean([r["f16_floor_us"] for r in rows]),
        "geomean_cublas_f16_us": geomean([r["cublas_f16_us"] for r in rows]),
        "geomean_ours_us": geomean([r["ours_us"] for r in rows]),
        "geomean_gemm_only_us": geomean([r["gemm_only_us"] for r in rows]),
        "geomean_fp8_us": geomean([r["fp8_us"] for r in rows]),
        "geomean_best_plan_us": geomean([r.get("best_us") for r in rows]),
        "geomean_cublas_kernel_us": geomean([r["cublas_kernel_us"] for r in rows]),
        "geomean_cublas_e2e_us": geomean([r["cublas_e2e_us"] for r in rows]),
        "geomean_triton_us": geomean([r["triton_us"] for r in rows]),
        # cuBLAS rejects or mangles some shapes' scale layouts: compare over the shapes it ran.
        "geomean_ours_where_cublas_us": geomean([r["ours_us"] for r in ran_cublas]),
        "geomean_cublas_kernel_where_cublas_us": geomean([r["cublas_kernel_us"] for r in ran_cublas]),
        "cublas_shapes": len(ran_cublas),
        "triton_note": triton_note,
        "correctness_failures": failures,
    }
    (out_dir / "fp8_mm_bench.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))

    def f(x):
        return "-" if x is None else f"{x:.1f}"

    head = ("| m | n | k | floor | fp16 floor | ours | %SOL | % fp16 floor | plan | best plan | cuBLAS fp16 GEMM | "
            "fp8-MMA e2e | fp8-MMA kern | cuBLAS kern | cuBLAS e2e | triton | flag |")
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        best = f"{r.get('best_plan', '-')} {f(r.get('best_us'))}"
        flag = "SLOWER than cuBLAS" if r["slower_than_cublas"] else ""
        lines.append(f"| {r['m']} | {r['n']} | {r['k']} | {f(r['floor_us'])} | {f(r['f16_floor_us'])} | "
                     f"{f(r['ours_us'])} | {r['sol_pct']:.0f}% | {100 * r['f16_floor_us'] / r['ours_us']:.0f}% | "
                     f"{','.join(map(str, r['plan']))} | {best} | {f(r['cublas_f16_us'])} | {f(r['fp8_us'])} | "
                     f"{f(r['gemm_only_us'])} | {f(r['cublas_kernel_us'])} | {f(r['cublas_e2e_us'])} | "
                     f"{f(r['triton_us'])} | {flag} |")
    g = summary
    lines.append(f"| geomean | | | {f(g['geomean_floor_us'])} | {f(g['geomean_f16_floor_us'])} | "
                 f"{f(g['geomean_ours_us'])} | | | | {f(g['geomean_best_plan_us'])} | "
                 f"{f(g['geomean_cublas_f16_us'])} | "
                 f"{f(g['geomean_fp8_us'])} | {f(g['geomean_gemm_only_us'])} | "
                 f"{f(g['geomean_cublas_kernel_us'])} | {f(g['geomean_cublas_e2e_us'])} | "
                 f"{f(g['geomean_triton_us'])} | |")
    if g["cublas_shapes"] < len(rows):
        lines.append(f"| geomean over the {g['cublas_shapes']} shapes cuBLAS ran | | | | | "
                     f"{f(g['geomean_ours_where_cublas_us'])} | | | | | | | | "
                     f"{f(g['geomean_cublas_kernel_where_cublas_us'])} | | | |")
    table = "\n".join(lines)
    (out_dir / "fp8_mm_bench.md").write_text(f"# fp8-mm on {g['device']} (us, median, L2 flushed)\n\n{table}\n")
    if triton_note:
        print(f"triton: {triton_note}")
    for r in rows:
        if r.get("cublas_note"):
            print(f"cuBLAS {r['m']}x{r['n']}x{r['k']}: {r['cublas_note']}")
    print(f"correctness failures: {len(failures)}")
    for msg in failures[:10]:
        print("  " + msg)
    print(table)
    # Candidate table: default (timed twice) vs each checked candidate; best = fastest correct of all.
    names = sorted({key for r in rows for key in r.get("cand_us", {})})
    print("\n| m | n | k | default | again | " + " | ".join(names) + " | best |")
    for r in rows:
        cu = r.get("cand_us", {})
        opts = {"default": r["ours_us"], **{key: v for key, v in cu.items() if v}}
        best = min(opts, key=opts.get)
        print(f"| {r['m']} | {r['n']} | {r['k']} | {f(r['ours_us'])} | {f(r.get('ours2_us'))} | "
              + " | ".join(f(cu.get(key)) for key in names) + f" | {best} {f(opts[best])} |")
    for name in names:
        gm = geomean([r["cand_us"].get(name) for r in rows])
        if gm:
            print(f"geomean {name}: {gm:.1f} us (default {g['geomean_ours_us']:.1f}, "
                  f"again {geomean([r['ours2_us'] for r in rows]):.1f})")
    best_all = []
    for r in rows:
        cu = r.get("cand_us", {})
        best_all.append(min([r["ours_us"]] + [v for v in cu.values() if v]))
    print(f"geomean of per-shape best: {geomean(best_all):.1f} us")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
