"""fp8-mm in plain PyTorch: blockwise-scaled FP8 GEMM (DeepSeek-V3 scaling, block 128).

Inputs (PROBLEMS.md): a [m, k] and b [n, k] float8_e4m3fnuz, a_scale [m, ceil(k/128)] and b_scale
[ceil(n/128), ceil(k/128)] fp32, all column-major views (stride 1 along dim 0); c [m, n] bf16 row-major.
Output: [m, n] bf16, c[i, j] = bf16(sum_k a[i,k] a_scale[i,k//128] * b[j,k] b_scale[j//128,k//128]).

On Hopper with torch >= 2.9, cuBLAS runs the blockwise recipe (A 1x128, B 128x128) through torch._scaled_mm.
Everywhere else (CPU, other GPUs, old torch) the operands are dequantized to fp32 and multiplied.
"""
import torch

from task import input_t, output_t

BLOCK = 128

# How the B scales must be laid out for torch._scaled_mm on this process's GPU, found once by _probe():
# None = not probed yet, False = blockwise _scaled_mm unusable here, else a row pad multiple (1 or 4).
_b_scale_pad = None


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _dequantized_mm(a, b, a_scale, b_scale) -> torch.Tensor:
    """fp32 reference-order math: [m, k] x [n, k] -> [m, n] fp32."""
    m, k = a.shape
    n = b.shape[0]
    sa = a_scale.repeat_interleave(BLOCK, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:n, :k]
    return (a.to(torch.float32) * sa) @ (b.to(torch.float32) * sb).T


def _as_e4m3fn_rowmajor(t: torch.Tensor) -> torch.Tensor:
    """fnuz bytes reread as e4m3fn (value x2 each, see PROBLEMS.md), copied K-contiguous as cuBLAS wants."""
    return t.view(torch.float8_e4m3fn).contiguous()


def _b_scale_layout(b_scale: torch.Tensor, pad: int) -> torch.Tensor:
    """b_scale [nb, kb] -> the (kb, nb) view _scaled_mm reads for 128x128 blocks: a row-major [nb, kb] buffer whose
    row stride is kb rounded up to ``pad`` (some torch versions demand 16-byte aligned rows), transposed."""
    nb, kb = b_scale.shape
    rows = torch.empty((nb, _ceil_div(kb, pad) * pad), dtype=torch.float32, device=b_scale.device)
    rows[:, :kb].copy_(b_scale)
    return rows[:, :kb].T


def _scaled_mm(a, b, a_scale, b_scale, pad: int) -> torch.Tensor:
    """Blockwise torch._scaled_mm: [m, k] x [n, k] -> [m, n] bf16 (raises where this torch/GPU lacks the recipe)."""
    # The fnuz -> fn reinterpretation doubles each operand; fold the 1/4 into the A scales, kept M-major
    # ([m, kb] with stride(0) == 1: the layout they arrive in, so .contiguous() copies nothing then).
    sa = (a_scale.T.contiguous() * 0.25).T
    return torch._scaled_mm(_as_e4m3fn_rowmajor(a), _as_e4m3fn_rowmajor(b).T, sa, _b_scale_layout(b_scale, pad),
                            out_dtype=torch.bfloat16)


def _probe(device: torch.device):
    """Once per process: which B-scale layout (if any) makes blockwise _scaled_mm correct on this GPU.
    A tiny case with kb = 3 (not a multiple of 4) and n not a multiple of 128 tells the layouts apart."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    gen = torch.Generator(device=device).manual_seed(0)
    m, n, k = 128, 192, 3 * BLOCK
    a = torch.randn((k, m), generator=gen, device=device).to(torch.float8_e4m3fnuz).T
    b = torch.randn((k, n), generator=gen, device=device).to(torch.float8_e4m3fnuz).T
    sa = torch.randn((k // BLOCK, m), generator=gen, device=device).T
    sb = torch.randn((k // BLOCK, _ceil_div(n, BLOCK)), generator=gen, device=device).T
    want = _dequantized_mm(a, b, sa, sb)
    for pad in (4, 1):
        try:
            got = _scaled_mm(a, b, sa, sb, pad).float()
        except (RuntimeError, ValueError, NotImplementedError, TypeError):
            continue
        if torch.allclose(got, want, rtol=2e-2, atol=1e-1):
            return pad
    return False


def custom_kernel(data: input_t) -> output_t:
    global _b_scale_pad
    a, b, a_scale, b_scale, c = data
    if _b_scale_pad is None:
        _b_scale_pad = _probe(a.device)
    if _b_scale_pad and a.device.type == "cuda":
        try:
            return _scaled_mm(a, b, a_scale, b_scale, _b_scale_pad)  # a fresh [m, n] bf16; c need not be filled
        except (RuntimeError, ValueError, NotImplementedError):
            pass  # a shape this cuBLAS recipe rejects (host-side check, no sync): take the exact path
    c.copy_(_dequantized_mm(a, b, a_scale, b_scale))
    return c
