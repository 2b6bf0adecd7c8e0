"""moe in plain PyTorch: DeepSeek-style mixture of experts, fp16, tokens sorted by expert.

data = (x, weights, config):
  x [bs, seqlen, d] fp16; weights["router.weight"] [E, d]; weights["experts.{e}.0.weight"] (gate) and ".1.weight" (up)
  [d, dexp], ".2.weight" (down) [dexp, d]; weights["shared_experts.{0,1}.weight"] [d, dexp*S], ".2.weight" [dexp*S, d];
  config keys n_routed_experts, n_experts_per_token, ...
Output: [bs, seqlen, d] fp16 = shared(x) + sum over the token's top-k experts of score * expert(x),
  expert(v) = (silu(v @ W0) * (v @ W1)) @ W2.

Two ways to run the routed experts, chosen by MOE_PATH (a benchmark may assign it; env KBENCH_MOE_PATH sets the
default, which is "auto"):

"loop": each expert runs three plain fp16 GEMMs on its contiguous slice of the sorted tokens and reads its weights
  exactly once; one host sync per call for the slice bounds.
"grouped": two torch._grouped_mm calls over all experts (gate|up fused, then down), offsets computed on the device.
  _grouped_mm takes the weights as one [E, K, N] tensor, and they arrive as separate tensors every call (the
  leaderboard regenerates them, so nothing can be cached), so each call copies all expert weights into stacked
  buffers (~2.8 GB read + 2.8 GB written). Operands are GROUPED_DTYPE, default None = the input's dtype (fp16).
"auto": "grouped" on a CUDA device where torch._grouped_mm exists and a one-time probe in the input's dtype (tiny
  input, run under torch.cuda sync-debug mode "error") runs without a host sync and matches a per-group matmul;
  else "loop".

Why auto is the loop on the GPU machines' torch 2.11: _grouped_mm's fast path (CUTLASS, sm90/sm100) takes bf16
only. fp16 operands go to its fallback, which copies the offsets to the host and loops over mm_out: the loop path
plus the stacking, so the probe fails (it syncs). Converting to bf16 (GROUPED_DTYPE = torch.bfloat16; the stacking
copy converts for free) reaches the fast path but misses the official tolerance: rounding x, the weights and the
SwiGLU activations to bf16 (8-bit mantissa) costs too much even on score-weighted terms. A CPU emulation of the GPU
numerics (fp32 GEMMs, rounding where the GPU rounds) puts the worst |out - ref| / (atol + rtol |ref|) at 2.06 (test
E=4), 1.85 (test E=8), 1.42 and 1.65 (benchmarks E=32, seqlen 2048 and 8192) for bf16, against 0.16-0.26 for the
loop path (the check needs <= 1). The bf16 variant stays selectable for measurement (benchmarks/moe_torch.py).
A torch with an fp16 grouped fast path passes the probe and gets the grouped path with the loop path's numerics.

Both paths combine the same way: expert outputs back in (token, slot) order as fp16, then one baddbmm that adds
score-weighted terms to the shared output in fp32 and rounds once.
"""
import os

import torch
import torch.nn.functional as F

from task import input_t, output_t

MOE_PATH = os.environ.get("KBENCH_MOE_PATH", "auto")  # "auto" | "loop" | "grouped"
GROUPED_DTYPE = None  # operand dtype of the grouped GEMMs; None = the input's dtype. bf16 is the fast one (see above)
_PROBED: dict = {}  # (device, dtype) -> bool: does _grouped_mm run sync-free and correctly here (probed once)


def _ffn(v: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """SwiGLU feed-forward in fp16: v [t, d] -> [t, d]."""
    return (F.silu(v @ w_gate) * (v @ w_up)) @ w_down


def _route(x: torch.Tensor, router: torch.Tensor, k: int):
    """The reference's routing, op for op in fp16 so the same experts win: x [bs, seqlen, d], router [E, d] ->
    (scores [bs, seqlen, k] fp16, experts [bs, seqlen, k] int64)."""
    scores = F.linear(x, router).softmax(dim=-1)
    return torch.topk(scores, k=k, dim=-1, sorted=False)


def _probe_grouped_mm(device: torch.device, dtype: torch.dtype) -> bool:
    """True when torch._grouped_mm on `device` runs `dtype` 2D x 3D with offsets without a host sync and matches a
    per-group matmul; includes an empty group and offsets that are not multiples of 16."""
    try:
        gen = torch.Generator(device=device)
        gen.manual_seed(0)
        sizes = [5, 0, 19, 16]
        a = torch.randn((sum(sizes), 64), generator=gen, device=device).to(dtype)
        b = torch.randn((len(sizes), 64, 48), generator=gen, device=device).to(dtype)
        offs = torch.tensor(sizes, device=device).cumsum(0).to(torch.int32)
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")  # the fallback copies offs to the host: that raises here
        try:
            out = torch._grouped_mm(a, b, offs=offs)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        expected = torch.cat([a[s:e].float() @ b[g].float() for g, (s, e) in
                              enumerate(zip([0] + offs.tolist()[:-1], offs.tolist()))])
        return out.shape == expected.shape and torch.allclose(out.float(), expected, rtol=2e-2, atol=2e-2)
    except Exception:  # noqa: BLE001 - any failure means "use the loop path"
        return False


def _grouped_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if GROUPED_DTYPE is None else GROUPED_DTYPE


def _use_grouped(device: torch.device, dtype: torch.dtype) -> bool:
    path = MOE_PATH
    if path not in ("auto", "loop", "grouped"):
        raise ValueError(f"MOE_PATH={path!r}: expected 'auto', 'loop' or 'grouped'")
    if path != "auto":
        return path == "grouped"
    if device.type != "cuda" or not hasattr(torch, "_grouped_mm"):
        return False
    if (device, dtype) not in _PROBED:
        _PROBED[(device, dtype)] = _probe_grouped_mm(device, dtype)
    return _PROBED[(device, dtype)]


def sort_by_expert(experts: torch.Tensor, n_experts: int):
    """experts [..., k] int64 -> (order, offs): order [n*k] int64 sorts the flattened (token, slot) pairs by expert
    (stable, so tokens keep their order within an expert); offs [E] int32 on the device is the end of each expert's
    slice in that order (cumulative counts, _grouped_mm's convention). No host sync."""
    sorted_experts, order = torch.sort(experts.reshape(-1), stable=True)
    bounds = torch.arange(n_experts, device=experts.device, dtype=sorted_experts.dtype)
    offs = torch.searchsorted(sorted_experts, bounds, right=True, out_int32=True)
    return order, offs


def stack_expert_weights(weights: dict, n_experts: int, dtype: torch.dtype):
    """The per-expert weights as _grouped_mm operands, one copy (with the dtype conversion) per source tensor:
    (w_gate_up [E, d, 2*dexp] = gate | up along the last dim, w_down [E, dexp, d])."""
    d, dexp = weights["experts.0.0.weight"].shape
    device = weights["experts.0.0.weight"].device
    w_gate_up = torch.empty((n_experts, d, 2 * dexp), dtype=dtype, device=device)
    w_down = torch.empty((n_experts, dexp, d), dtype=dtype, device=device)
    for e in range(n_experts):
        w_gate_up[e, :, :dexp].copy_(weights[f"experts.{e}.0.weight"])
        w_gate_up[e, :, dexp:].copy_(weights[f"experts.{e}.1.weight"])
        w_down[e].copy_(weights[f"experts.{e}.2.weight"])
    return w_gate_up, w_down


def _routed_grouped(xf: torch.Tensor, experts: torch.Tensor, weights: dict, n_experts: int, k: int) -> torch.Tensor:
    """Routed expert outputs [n_tokens*k, d] fp16 in (token, slot) order, via two grouped GEMMs (no host sync)."""
    order, offs = sort_by_expert(experts, n_experts)
    dtype = _grouped_dtype(xf)
    w_gate_up, w_down = stack_expert_weights(weights, n_experts, dtype)
    dexp = w_down.shape[1]
    x_sorted = xf.to(dtype).index_select(0, order // k)  # convert before the gather: k times fewer rows
    h = torch._grouped_mm(x_sorted, w_gate_up, offs=offs)
    h = F.silu(h[:, :dexp]) * h[:, dexp:]
    y_sorted = torch._grouped_mm(h, w_down, offs=offs)
    y = torch.empty((order.shape[0], xf.shape[1]), dtype=xf.dtype, device=xf.device)
    return y.index_copy_(0, order, y_sorted.to(xf.dtype))


def _routed_loop(xf: torch.Tensor, experts: torch.Tensor, weights: dict, n_experts: int, k: int) -> torch.Tensor:
    """Routed expert outputs [n_tokens*k, d] fp16 in (token, slot) order, one expert at a time."""
    # Sort the n_tokens*k (token, slot) pairs by expert so each expert sees one contiguous slice.
    flat_experts = experts.reshape(-1)
    order = torch.argsort(flat_experts, stable=True)
    counts = torch.bincount(flat_experts, minlength=n_experts).tolist()  # the one host sync: slice bounds
    x_sorted = xf.index_select(0, order // k)
    y = torch.empty((flat_experts.shape[0], xf.shape[1]), dtype=xf.dtype, device=xf.device)
    start = 0
    for e, count in enumerate(counts):
        if count:
            rows = slice(start, start + count)
            out_e = _ffn(x_sorted[rows], weights[f"experts.{e}.0.weight"], weights[f"experts.{e}.1.weight"],
                         weights[f"experts.{e}.2.weight"])
            y.index_copy_(0, order[rows], out_e)
            start += count
    return y


def custom_kernel(data: input_t) -> output_t:
    x, weights, config = data
    bs, seqlen, d = x.shape
    n_experts, k = config["n_routed_experts"], config["n_experts_per_token"]
    xf = x.reshape(bs * seqlen, d)
    n_tokens = xf.shape[0]

    scores, experts = _route(x, weights["router.weight"], k)
    routed = _routed_grouped if _use_grouped(x.device, _grouped_dtype(x)) else _routed_loop
    y = routed(xf, experts, weights, n_experts, k)

    shared = _ffn(xf, weights["shared_experts.0.weight"], weights["shared_experts.1.weight"],
                  weights["shared_experts.2.weight"])
    # shared + scores @ y per token: one batched GEMM [1, k] x [k, d] that accumulates in fp32 and rounds once.
    out = torch.baddbmm(shared.unsqueeze(1), scores.view(n_tokens, 1, k), y.view(n_tokens, k, d))
    return out.view(bs, seqlen, d)
