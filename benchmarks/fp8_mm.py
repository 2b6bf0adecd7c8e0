"""fp8-mm on a Hopper GPU: correctness of the CUDA backend on every official shape (+ extras, every named
configuration on the smaller ones), then kernel time against the peers, all in one process on the same inputs.

    python benchmarks/fp8_mm.py              # check + time; table last; rows into benchmarks/results/fp8-mm.csv
    python benchmarks/fp8_mm.py --quick      # a few small shapes, no timing (for compute-sanitizer)
    python benchmarks/fp8_mm.py --profile "1024,1536,7168"   # 3 calls per shape, e.g. under ncu

Built with kbench.benchlib.build(..., dev=True): the shipped submission's sources plus the dev entry points
(fp8_gemm_with_config, fp8_gemm_config_for). Timing: kbench's CUDA-event timer, L2 flushed, median of --runs.
"ours" includes everything a call does (transpose + widening of the column-major operands, GEMM, split-K finish).
Peers: cuBLAS's blockwise FP8 (torch._scaled_mm; misses the official tolerance on Hopper, timed anyway as the
peer a user would pick), cuBLAS's fp16 GEMM on pre-widened operands without scales (the exact path's vendor bound),
our own FP8-MMA configuration (inexact), and the Triton backend.
Floor = max(2mnk / 1444e12, minimal bytes / 2.99e12); fp16-path floor = 2mnk / 795e12 + one widening pass
(H100 measured ceilings, BASELINES.md).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from kbench import benchlib, problems

FP8_FLOPS, F16_FLOPS, HBM_BPS = 1444e12, 795e12, 2.99e12
EXTRA_SHAPES = [(64, 64, 128), (96, 320, 384), (192, 576, 1152), (320, 704, 256), (1024, 192, 640),
                (2048, 2560, 3072), (128, 4160, 512), (6144, 64, 128), (576, 1216, 2048)]
# Named configurations checked on the smaller shapes: (tile_n, splits, exact, schedule, half_c, split_slices);
# schedule 0 lock_step, 1 ordered, 2 alternating, 3 split_chains_early, 4 split_chains (fp8_gemm_api.h).
CHECK_CONFIGS = [(128, 1, True, 0, False, False), (64, 1, True, 0, False, False), (128, 2, True, 0, False, False),
                 (64, 3, True, 0, False, False), (128, 4, True, 0, False, False), (128, 1, False, 0, False, False),
                 (64, 2, False, 0, False, False), (128, 1, True, 1, False, False), (128, 2, True, 2, False, False),
                 (64, 1, True, 2, False, False), (128, 1, True, 3, False, False), (128, 2, True, 4, False, False),
                 (128, 1, True, 0, True, False), (128, 4, True, 3, True, False), (128, 2, True, 0, False, True),
                 (64, 3, True, 0, False, True), (128, 4, True, 0, True, True), (64, 2, False, 0, False, True)]


def floor_us(m, n, k):
    bytes_ = m * k + n * k + 4 * (m * (k // 128) + -(-n // 128) * (k // 128)) + 2 * m * n
    return 1e6 * max(2.0 * m * n * k / FP8_FLOPS, bytes_ / HBM_BPS)


def fp16_path_floor_us(m, n, k):
    return 1e6 * (2.0 * m * n * k / F16_FLOPS + 3 * (m + n) * k / HBM_BPS)


def reference_f32(a, b, sa, sb):
    """fp32 c[m,n] from the definition (dequantise, fp32 matmul without TF32)."""
    k, n = a.shape[1], b.shape[0]
    af = a.float() * sa.repeat_interleave(128, dim=1)[:, :k]
    bf = b.float() * sb.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return af @ bf.T


def check(fn, data, expected, tol, label, strict=True):
    """NaN-poison c, run, compare with the fp32 definition: (ok, message with the worst tolerance ratio).
    strict: the official elementwise tolerance; else (inexact FP8-MMA configurations) a relative error < 1e-2."""
    benchlib.poison(data[4])
    out = fn(data).float()
    torch.cuda.synchronize()
    ratio = benchlib.tolerance_ratio(out, expected, tol.rtol, tol.atol)
    rel = ((out - expected).norm() / expected.norm()).item() if ratio < float("inf") else float("inf")
    ok = ratio <= 1 if strict else rel < 1e-2
    return ok, f"{label}: {'ok' if ok else 'FAIL'}, rel err {rel:.2e}, ratio {ratio:.2f}"


def cublas_fp8(a, b, sa, sb):
    """torch._scaled_mm with blockwise scales on K-major operands, or None where this torch/GPU refuses it."""
    if not hasattr(torch, "_scaled_mm"):
        return None
    e4 = torch.float8_e4m3fn
    sa_h, sb_h = sa * 0.5, (sb * 0.5).contiguous()  # fnuz bytes read as e4m3fn are 2x: fold 0.5 per operand
    a_k, b_k = a.contiguous().view(e4), b.contiguous().view(e4)
    for sb_arg in (sb_h.T, sb_h.T.contiguous()):
        try:
            torch._scaled_mm(a_k, b_k.T, scale_a=sa_h, scale_b=sb_arg, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
            return lambda sb_arg=sb_arg: torch._scaled_mm(a_k, b_k.T, scale_a=sa_h, scale_b=sb_arg,
                                                          out_dtype=torch.bfloat16)
        except Exception:  # noqa: BLE001 - try the next scale layout
            continue
    return None


def correctness(mod, ref, tol, quick: bool) -> list[str]:
    spec = problems.load_spec("fp8-mm")
    if quick:
        cases = [(64, 64, 128, 1), (96, 576, 384, 2), (256, 320, 1024, 3), (576, 1216, 2048, 4)]
    else:
        cases = [(c["m"], c["n"], c["k"], c["seed"]) for c in list(spec.tests) + list(spec.benchmarks)]
        cases += [(m, n, k, 1000 + i) for i, (m, n, k) in enumerate(EXTRA_SHAPES)]
    failures = []
    for m, n, k, seed in cases:
        data = ref.generate_input(m=m, n=n, k=k, seed=seed)
        expected = reference_f32(*data[:4])
        runs = [(f"auto {m}x{n}x{k} {mod.ext.fp8_gemm_config_for(m, n, k)}", mod.custom_kernel, True),
                (f"  k-major inputs {m}x{n}x{k}", lambda d: mod.ext.fp8_gemm(d[0].contiguous(), d[1].contiguous(),
                                                                             *d[2:]), True)]
        if quick or m * n * k <= 2**33:
            runs += [(f"  config {cfg} {m}x{n}x{k}", lambda d, cfg=cfg: mod.ext.fp8_gemm_with_config(*d, *cfg),
                      cfg[2]) for cfg in CHECK_CONFIGS]
        for label, fn, strict in runs:
            ok, msg = check(fn, data, expected, tol, label, strict)
            print(msg, flush=True)
            if not ok:
                failures.append(msg)
        data[4].zero_()
        ok, why = ref.check_implementation(data, mod.custom_kernel(data))  # the official verdict
        if not ok:
            failures.append(f"official check {m}x{n}x{k}: {why}")
    print(f"correctness: {len(cases)} shapes, {len(failures)} failures", flush=True)
    return failures


def timing(mod, ref, runs: int, use_triton: bool) -> list[dict]:
    timer = benchlib.Timer()
    triton = benchlib.build("fp8-mm", "triton") if use_triton else None
    rows = []
    for c in problems.load_spec("fp8-mm").benchmarks:
        m, n, k = c["m"], c["n"], c["k"]
        data = ref.generate_input(m=m, n=n, k=k, seed=c["seed"])
        a, b, sa, sb, cbuf = data
        ak, bk = a.contiguous(), b.contiguous()
        a16, b16 = ak.float().half(), bk.float().half()
        fp8 = cublas_fp8(a, b, sa, sb)
        row = {"case": problems.format_case(c), "floor": floor_us(m, n, k), "f16_floor": fp16_path_floor_us(m, n, k),
               "cuda": timer(lambda: mod.custom_kernel(data), runs),
               "cuda_fp8_mma": timer(lambda: mod.ext.fp8_gemm_with_config(a, b, sa, sb, cbuf, 128, 1, False, 0,
                                                                          False, False), runs),
               "cublas_fp16_noscale": timer(lambda: torch.mm(a16, b16.T), runs),
               "cublas_fp8_blockwise": timer(fp8, runs) if fp8 else None,
               "triton": timer(lambda: triton.custom_kernel(data), runs) if triton else None}
        row["cuda_again"] = timer(lambda: mod.custom_kernel(data), runs)  # the same version twice: the noise
        rows.append(row)
        print(row, flush=True)
        del data, ak, bk, a16, b16
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes only, no timing (for compute-sanitizer)")
    ap.add_argument("--no-triton", action="store_true", help="leave the Triton backend out of the timing")
    ap.add_argument("--runs", type=int, default=25)
    ap.add_argument("--profile", metavar="M,N,K[;M,N,K...]", help="only call these shapes 3 times each (for ncu)")
    args = ap.parse_args()
    t0 = time.time()
    mod = benchlib.build("fp8-mm", "cuda", dev=True)
    ref = problems.load_modules("fp8-mm").reference
    tol = problems.load_spec("fp8-mm").tolerance
    gpu = torch.cuda.get_device_name()
    print(f"built in {time.time() - t0:.1f}s; {gpu}", flush=True)
    if args.profile:
        for shape in args.profile.split(";"):
            m, n, k = (int(x) for x in shape.split(","))
            data = ref.generate_input(m=m, n=n, k=k, seed=1)
            for _ in range(3):
                mod.custom_kernel(data)
            torch.cuda.synchronize()
        return
    failures = correctness(mod, ref, tol, args.quick)
    if args.quick:
        sys.exit(1 if failures else 0)
    rows = timing(mod, ref, args.runs, not args.no_triton)
    peers = ["cuda", "cuda_again", "cuda_fp8_mma", "cublas_fp16_noscale", "cublas_fp8_blockwise", "triton"]
    # the results files' backend names (the README's columns): peers hyphenated, a second timing as a label
    row_names = {"cuda_again": "cuda[again]", "cuda_fp8_mma": "cuda-fp8-mma",
                 "cublas_fp16_noscale": "cublas-fp16-noscale", "cublas_fp8_blockwise": "cublas-fp8-blockwise"}
    benchlib.record("fp8-mm", [benchlib.Row(gpu, 1, row_names.get(name, name), "kernel", r["case"], r[name])
                               for r in rows for name in peers if r[name]] +
                    [benchlib.Row(gpu, 1, row_names.get(name, name), "kernel", "geomean",
                                  benchlib.geomean(r[name] for r in rows))
                     for name in peers if benchlib.geomean(r[name] for r in rows)])
    cols = ["floor", "f16_floor"] + peers
    benchlib.table(f"fp8-mm kernel time on {gpu} (us, median, L2 flushed); failures: {len(failures)}",
                   ["case"] + cols, [[r["case"]] + [r[c] for c in cols] for r in rows] +
                   [["geomean"] + [benchlib.geomean(r[c] for r in rows) for c in cols]])
    for msg in failures[:10]:
        print("  " + msg)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
