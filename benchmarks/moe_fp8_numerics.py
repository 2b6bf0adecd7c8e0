"""Would moe's GEMMs pass the official tolerance with FP8 (e4m3) tensor-core operands? A CPU study.

    python benchmarks/moe_fp8_numerics.py [--tokens 256]

Why: both benchmark cases run at the board's power cap (docs/moe-notes.md, thirty-first and thirty-second sessions),
so their time is their energy, and FP8 MMAs would take about half the tensor cores' energy a MAC at twice the rate.
This asks the numbers first. For the official benchmark cases' shapes (fewer tokens, the same generator and seeds on
this machine's CPU, so statistically the official inputs) it computes the reference's layer
(benchmarks/moe_f16acc_numerics.py's route() and layer(): ref_kernel's op order and fp16 roundings) and prints the
worst |out - control| / (atol + rtol |control|) of its output when the expert GEMMs (the shared expert's and the
routed ones, one routing for all) take their operands as:
  fp8 channel     e4m3 with one scale a row of x or h and one a weight column (amax -> 448)
  fp8 block       e4m3 with DeepSeek-V3's scales: a row's 128-wide k-blocks, the weights' 128 x 128 blocks
and the block form in GEMM 1 (gate and up) only or GEMM 2 (down) only. The control takes them as the shipped kernels
do (fp16, fp32 accumulation, fp16 gate / up / h / down); its own distance from ref_kernel is the first column.
Accumulation stays exact fp32 (Hopper's FP8 MMA keeps fewer bits, so these are the FP8 forms' best case). The worst
element over tokens x 7168 outputs grows with the token count, so a ratio near 1 here fails at 2048 and 8192.
"""
from __future__ import annotations

import argparse

import torch

import moe_f16acc_numerics as study  # route() and layer(): the reference's layer with the GEMMs passed in
from kbench import benchlib, problems

E4M3_MAX = 448.0
VARIANTS = {  # name -> (GEMM 1's operand form, GEMM 2's)
    "fp8 channel": ("fp8 channel", "fp8 channel"),
    "fp8 block": ("fp8 block", "fp8 block"),
    "block, GEMM 1 only": ("fp8 block", "fp16"),
    "block, GEMM 2 only": ("fp16", "fp8 block"),
}


def e4m3_scaled(t: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """t (fp32) through float8_e4m3fn with amax (broadcastable to t) mapped to 448; fp32 result."""
    scale = E4M3_MAX / amax.clamp_min(1e-12)
    return (t * scale).to(torch.float8_e4m3fn).float() / scale


def quantize(t: torch.Tensor, form: str, reduce_dim: int) -> torch.Tensor:
    """t [rows, cols] fp16 as the MMA would see it in `form`; reduce_dim is the GEMM's k dimension (0 or 1)."""
    t = t.float()
    if form == "fp16":
        return t
    if form == "fp8 channel":
        return e4m3_scaled(t, t.abs().amax(dim=reduce_dim, keepdim=True))
    # fp8 block: 1 x 128 blocks along k for activations (k on dim 1), 128 x 128 blocks for weights (k on dim 0)
    rows, cols = t.shape
    if reduce_dim == 1:
        blocks = t.view(rows, cols // 128, 128)
        return e4m3_scaled(blocks, blocks.abs().amax(dim=2, keepdim=True)).view(rows, cols)
    blocks = t.view(rows // 128, 128, cols // 128, 128)
    return e4m3_scaled(blocks, blocks.abs().amax(dim=(1, 3), keepdim=True)).view(rows, cols)


def operands(form: str):
    """A GEMM of v [m, k] fp16 and w [k, n] fp16 (the reference's [in, out] weight) with its operands in `form`,
    accumulated exactly in fp32 and rounded to fp16 [m, n]."""
    return lambda v, w: (quantize(v, form, 1) @ quantize(w, form, 0)).half()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256, help="tokens a case (the official cases have 2048 and 8192)")
    args = ap.parse_args()
    ref = problems.load_modules("moe").reference
    spec = problems.load_spec("moe")
    print(f"worst |out - control| / tolerance at {args.tokens} tokens (>= 1 fails):")
    print(f"{'case':>6} {'seed':>6} {'control vs ref':>19} " + " ".join(f"{n:>19}" for n in VARIANTS))
    for case in map(problems.official_case, spec.benchmarks):
        x, weights, config = ref.generate_input(**{**case, "bs": 1, "seqlen": args.tokens})
        rows = x.reshape(-1, x.shape[-1])
        routing = study.route(rows, weights, config)
        control = study.layer(rows, weights, config, routing, (operands("fp16"), operands("fp16")))
        expected = ref.ref_kernel((x, weights, config)).reshape(rows.shape)
        ratios = [benchlib.tolerance_ratio(control, expected, ref.RTOL, ref.ATOL)]
        for f1, f2 in VARIANTS.values():
            out = study.layer(rows, weights, config, routing, (operands(f1), operands(f2)))
            ratios.append(benchlib.tolerance_ratio(out, control, ref.RTOL, ref.ATOL))
        print(f"{case['seqlen']:>6} {case['seed']:>6} " + " ".join(f"{r:>19.3f}" for r in ratios), flush=True)

if __name__ == "__main__":
    main()
