"""moe in plain PyTorch: DeepSeek-style mixture of experts, fp16, tokens sorted by expert.

data = (x, weights, config):
  x [bs, seqlen, d] fp16; weights["router.weight"] [E, d]; weights["experts.{e}.0.weight"] (gate) and ".1.weight" (up)
  [d, dexp], ".2.weight" (down) [dexp, d]; weights["shared_experts.{0,1}.weight"] [d, dexp*S], ".2.weight" [dexp*S, d];
  config keys n_routed_experts, n_experts_per_token, ...
Output: [bs, seqlen, d] fp16 = shared(x) + sum over the token's top-k experts of score * expert(x),
  expert(v) = (silu(v @ W0) * (v @ W1)) @ W2.

Why a loop over experts and not torch._grouped_mm: grouped GEMMs need each weight family stacked into one
[E, ...] tensor, and the inputs arrive as separate tensors every call (no caching across calls: the leaderboard
regenerates them). Stacking copies all 2.8 GB of expert weights (read + write, ~1.9 ms on an H100) to save launches
that cost less at these token counts (hundreds of tokens per expert), so each expert runs three plain GEMMs on its
contiguous slice of the sorted tokens and reads its weights exactly once.
"""
import torch
import torch.nn.functional as F

from task import input_t, output_t


def _ffn(v: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """SwiGLU feed-forward in fp16: v [t, d] -> [t, d]."""
    return (F.silu(v @ w_gate) * (v @ w_up)) @ w_down


def _route(x: torch.Tensor, router: torch.Tensor, k: int):
    """The reference's routing, op for op in fp16 so the same experts win: x [bs, seqlen, d], router [E, d] ->
    (scores [bs, seqlen, k] fp16, experts [bs, seqlen, k] int64)."""
    scores = F.linear(x, router).softmax(dim=-1)
    return torch.topk(scores, k=k, dim=-1, sorted=False)


def custom_kernel(data: input_t) -> output_t:
    x, weights, config = data
    bs, seqlen, d = x.shape
    n_experts, k = config["n_routed_experts"], config["n_experts_per_token"]
    xf = x.reshape(bs * seqlen, d)
    n_tokens = xf.shape[0]

    scores, experts = _route(x, weights["router.weight"], k)

    # Sort the n_tokens*k (token, slot) pairs by expert so each expert sees one contiguous slice.
    flat_experts = experts.reshape(-1)
    order = torch.argsort(flat_experts, stable=True)
    counts = torch.bincount(flat_experts, minlength=n_experts).tolist()  # the one host sync: slice bounds
    x_sorted = xf.index_select(0, order // k)

    # Expert outputs land back in (token, slot) order so the combine is one batched weighted sum.
    y = torch.empty((n_tokens * k, d), dtype=x.dtype, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if count:
            rows = slice(start, start + count)
            out_e = _ffn(x_sorted[rows], weights[f"experts.{e}.0.weight"], weights[f"experts.{e}.1.weight"],
                         weights[f"experts.{e}.2.weight"])
            y.index_copy_(0, order[rows], out_e)
            start += count

    shared = _ffn(xf, weights["shared_experts.0.weight"], weights["shared_experts.1.weight"],
                  weights["shared_experts.2.weight"])
    # shared + scores @ y per token: one batched GEMM [1, k] x [k, d] that accumulates in fp32 and rounds once.
    out = torch.baddbmm(shared.unsqueeze(1), scores.view(n_tokens, 1, k), y.view(n_tokens, k, d))
    return out.view(bs, seqlen, d)
