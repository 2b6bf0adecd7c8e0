"""Would moe's grouped GEMMs pass the official tolerance with fp16 tensor-core accumulators, added into fp32 every
few k-64 stages? A CPU study.

    python benchmarks/moe_f16acc_numerics.py [--tokens 64]

Why: benchmarks/wgmma_energy_probe.py measured fp16 accumulators ~5% cheaper in energy a FLOP than fp32 ones at the
H100's power cap, where moe's GEMMs run; a chain of fp16 accumulation as long as K (7168) is far too coarse, so the
candidate adds its fp16 chain into fp32 registers every P stages. This asks which P the tolerance allows.
For every official case (its generator and seed; the first --tokens tokens of it, routed as the case routes them)
the layer is computed with the reference's fp16 roundings (GEMM outputs, silu, the product, score x output, the
expert-order fp16 sums) and each GEMM accumulated as:
  fp32        fp32 accumulators (the shipped kernels; the control)
  f16-pN      the k16 steps' products summed into an fp16 accumulator (rounded to nearest each step), that chain
              added into fp32 every N stages of k 64 (N = 112: one chain over K = 7168)
  f16-pN-rz   the same rounded toward zero each step (if the tensor cores truncate)
Printed per case: the worst |out - control| / (atol + rtol |control|) over the sampled outputs and the rms of that
ratio. The whole case has 16-256x more outputs than the sample, so its worst is larger than the sample's (a ratio
near 1 here fails). The shipped kernels' own distance from the reference (fp32 accumulation in another order) is ~0.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from kbench import benchlib, problems

PROMOTE = (2, 4, 8, 16, 112)
TRUNCATED = (4, 8, 16)


def f16_toward_zero(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp16 rounded toward zero (fp32 result)."""
    h = v.half()
    over = h.float().abs() > v.abs()
    bits = h.view(torch.int16)
    bits = torch.where(over, bits - 1, bits)  # one step down in magnitude, the sign bit untouched
    return bits.view(torch.float16).float()


def gemm(a: torch.Tensor, w: torch.Tensor, promote: int | None, toward_zero: bool = False) -> torch.Tensor:
    """a [R, K] fp16 @ w [K, N] fp16 -> fp16 [R, N], accumulated as the variant says (promote None: fp32)."""
    if promote is None:
        return (a.float() @ w.float()).half()
    af, wf = a.float(), w.float()
    total = torch.zeros(a.shape[0], w.shape[1])
    chain_k = 64 * promote
    for c0 in range(0, a.shape[1], chain_k):
        chain = torch.zeros_like(total)
        for k0 in range(c0, min(c0 + chain_k, a.shape[1]), 16):
            v = chain + af[:, k0:k0 + 16] @ wf[k0:k0 + 16]
            chain = f16_toward_zero(v) if toward_zero else v.half().float()
        total += chain
    return total.half()


def accumulated(*mode) -> tuple:
    """Both GEMMs (gemms for expert() and layer()) accumulated as gemm()'s mode says."""
    return (lambda a, w: gemm(a, w, *mode),) * 2


def expert(v, weights, prefix, gemms) -> torch.Tensor:
    """One gated MLP on rows v [R, H] fp16 with the reference's roundings; gemms: (GEMM 1's, GEMM 2's) functions of
    (a [R, K] fp16, w [K, N] fp16) -> fp16 [R, N] (benchmarks/moe_fp8_numerics.py passes its own)."""
    gemm1, gemm2 = gemms
    g = gemm1(v, weights[f"{prefix}.0.weight"])
    u = gemm1(v, weights[f"{prefix}.1.weight"])
    return gemm2(F.silu(g.float()).half() * u, weights[f"{prefix}.2.weight"])


def route(x, weights, config) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's router on rows x [T, H] fp16: (top scores [T, k] fp16, their experts [T, k])."""
    scores = F.linear(x.float(), weights["router.weight"].float()).half().float().softmax(-1).half()
    return torch.topk(scores, k=config["n_experts_per_token"], dim=-1, sorted=False)


def layer(x, weights, config, routing, gemms) -> torch.Tensor:
    """The reference's layer on rows x [T, H] fp16 (ref_kernel's op order) with route()'s routing and expert()'s
    gemms."""
    top_scores, top_experts = routing
    routed = torch.zeros_like(x)
    for e in range(config["n_routed_experts"]):
        tokens, slots = (top_experts == e).nonzero(as_tuple=True)
        if len(tokens):
            out = expert(x[tokens], weights, f"experts.{e}", gemms) * top_scores[tokens, slots, None]
            routed.index_add_(0, tokens, out)
    return routed + expert(x, weights, "shared_experts", gemms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64, help="tokens sampled a case (its first ones)")
    args = ap.parse_args()
    ref = problems.load_modules("moe").reference
    spec = problems.load_spec("moe")
    modes = {"fp32": accumulated(None), **{f"f16-p{p}": accumulated(p) for p in PROMOTE},
             **{f"f16-p{p}-rz": accumulated(p, True) for p in TRUNCATED}}
    print(f"worst / rms of |out - fp32| / tolerance over {args.tokens} tokens a case (>= 1 fails):", flush=True)
    print(f"{'case':>18} " + " ".join(f"{n:>15}" for n in modes))
    for case in map(problems.official_case, [*spec.tests, *spec.benchmarks]):
        x, weights, config = ref.generate_input(**case)
        rows = x.reshape(-1, x.shape[-1])
        sample = rows[:args.tokens]
        routing = route(sample, weights, config)
        control = layer(sample, weights, config, routing, modes["fp32"])
        cells = []
        for mode in modes.values():
            r = benchlib.tolerance_ratios(layer(sample, weights, config, routing, mode), control, ref.RTOL, ref.ATOL)
            cells.append(f"{r.amax().item():.3f}/{r.pow(2).mean().sqrt().item():.3f}")
        label = f"T {rows.shape[0]} E {config['n_routed_experts']}"
        print(f"{label:>18} " + " ".join(f"{c:>15}" for c in cells), flush=True)
        del x, weights


if __name__ == "__main__":
    main()
