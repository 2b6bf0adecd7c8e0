"""Would mla-decode's attention pass the official tolerance with FP8 (e4m3) tensor-core operands? A CPU study.

    python benchmarks/mla_fp8_numerics.py [--batch 4]

Why: at prefill 4096 the attention runs at the board's power cap (docs/mla-decode-notes.md, finding 46), so its time
is its energy; FP8 MMAs would roughly halve the tensor cores' energy a MAC. This asks the numbers first. For the
official cases' shapes (fewer batch rows, the same generator and seeds, so statistically the official inputs) it
prints the worst |out - ref| / (atol + rtol |ref|) of the whole layer when the absorbed attention (fp32 softmax and
accumulation, as the shipped kernel) takes its operands as:
  bf16                   the shipped kernel's operands (the control)
  fp8                    Q, K, P, V rounded to e4m3 (per-tensor scale 1)
  fp8 S only             Q and K in e4m3, P and V in bf16
  fp8 PV only            P (scaled by 256 into e4m3's normal range) and V in e4m3
The rest of the step (projections, RoPE with bf16 angles) is the reference's. The worst element over batch x 7168
outputs grows with the batch, so a ratio near 1 here fails at batch 128.
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from kbench import benchlib, problems

VARIANTS = {  # name -> e4m3 scale of (Q, K, P, V); None keeps the operand in bf16 (P: fp32)
    "bf16": (None, None, None, None),
    "fp8": (1.0, 1.0, 256.0, 1.0),
    "fp8 S only": (1.0, 1.0, None, None),
    "fp8 PV only": (None, None, 256.0, 1.0),
}
PREFILLS = (128, 1024, 4096, 6144)  # the official test / benchmark cases studied (their seeds from the spec)


def e4m3(t: torch.Tensor, scale: float | None) -> torch.Tensor:
    """t rounded through float8_e4m3fn at `scale` (fp32 result); None: t in fp32 unrounded."""
    return t.float() if scale is None else (t.float() * scale).to(torch.float8_e4m3fn).float() / scale


def worst_ratios(ref, case: dict, batch: int) -> dict[str, float]:
    """case: an official case's keys (problems.official_case), drawn with `batch` rows instead of its own."""
    config, x, cache = ref.generate_input(**{**case, "batchsize": batch})
    expected = ref.mla_decode(*ref.copy_data((config, x, cache)))[0].float()
    c = config
    heads, nope, rope, v_dim, rank = c.n_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    q = F.linear(F.linear(x, c.Q_proj_down_weight), c.Q_proj_up_weight).view(batch, 1, heads, nope + rope)
    cached, kv_len = ref.copy_data((config, x, cache))[2](F.linear(x, c.KV_proj_down_weight))
    q_nope, q_rope = torch.split(q, [nope, rope], dim=-1)
    q_rope = ref._rope(q_rope.permute(0, 2, 1, 3), kv_len - 1)[:, :, 0]                # [B, H, 64] bf16
    w_kv = c.KV_proj_up_weight.view(heads, nope + v_dim, rank)
    w_uk, w_uv = w_kv[:, :nope].float(), w_kv[:, nope:].float()                         # [H, 128, 512]
    q_abs = torch.einsum("bhn,hnr->bhr", q_nope[:, 0].float(), w_uk).to(torch.bfloat16)
    query = torch.cat([q_abs, q_rope], -1)                                              # [B, H, 576] bf16
    latent = cached[:, :kv_len]                                                         # [B, L, 576] bf16
    keys = torch.cat([latent[..., :rank], ref._rope(latent[..., rank:], 0)], -1)        # roped, bf16
    ratios = {}
    for name, (qs, ks, ps, vs) in VARIANTS.items():
        s = torch.einsum("bhd,bld->bhl", e4m3(query, qs), e4m3(keys, ks)) / math.sqrt(nope + rope)
        p = torch.exp(s - s.amax(-1, keepdim=True))
        o = torch.einsum("bhl,blr->bhr", e4m3(p, ps), e4m3(latent[..., :rank], vs)) / p.sum(-1, keepdim=True)
        y = torch.einsum("bhr,hvr->bhv", o.to(torch.bfloat16).float(), w_uv).to(torch.bfloat16)
        out = F.linear(y.reshape(batch, 1, heads * v_dim), c.wo_weight)
        ratios[name] = benchlib.tolerance_ratio(out, expected, ref.RTOL, ref.ATOL)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4, help="batch rows a case (the official cases have 128)")
    args = ap.parse_args()
    ref = problems.load_modules("mla-decode").reference
    spec = problems.load_spec("mla-decode")
    cases = {c["prefill"]: c for c in map(problems.official_case, [*spec.tests, *spec.benchmarks])}
    print(f"worst |out - ref| / tolerance at batch {args.batch} (>= 1 fails):")
    print(f"{'prefill':>8} {'seed':>5} " + " ".join(f"{n:>12}" for n in VARIANTS))
    for prefill in PREFILLS:
        r = worst_ratios(ref, cases[prefill], args.batch)
        print(f"{prefill:>8} {cases[prefill]['seed']:>5} " + " ".join(f"{r[n]:>12.3f}" for n in VARIANTS), flush=True)


if __name__ == "__main__":
    main()
