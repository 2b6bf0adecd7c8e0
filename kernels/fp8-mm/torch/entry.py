"""fp8-mm in plain PyTorch: blockwise-scaled FP8 GEMM (DeepSeek-V3 scaling, block 128).

Inputs (PROBLEMS.md): a [m, k] and b [n, k] float8_e4m3fnuz, a_scale [m, ceil(k/128)] and b_scale
[ceil(n/128), ceil(k/128)] fp32, all column-major views (stride 1 along dim 0); c [m, n] bf16 row-major.
Output: [m, n] bf16, c[i, j] = bf16(sum_k a[i,k] a_scale[i,k//128] * b[j,k] b_scale[j//128,k//128]).

Why not torch._scaled_mm: cuBLAS runs the blockwise recipe (A 1x128, B 128x128) on Hopper, but Hopper's FP8 tensor
cores keep only about 14 bits while they accumulate, so outputs near zero miss the official tolerance
(atol 1e-3 against values of size ~100); benchmarks/fp8_mm.py times it as the peer and flags that.

On a GPU this backend is exact to fp32 rounding with fp16 tensor cores: the scaled operands a*sa and b*sb (fp32) are
split into fp16 high and low parts, and c = ah bh + ah bl + al bh, each product an fp16 GEMM with fp32 output
(``torch.mm(x, y, out_dtype=torch.float32)``); the dropped al bl term is ~2^-22 relative. Where fp16 GEMMs with fp32
output are unavailable (the CPU, old torch) the operands are dequantized to fp32 and multiplied.
"""
import torch

from task import input_t, output_t

BLOCK = 128


def _dequantized_mm(a, b, a_scale, b_scale) -> torch.Tensor:
    """fp32 reference-order math: [m, k] x [n, k] -> [m, n] fp32."""
    m, k = a.shape
    n = b.shape[0]
    sa = a_scale.repeat_interleave(BLOCK, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:n, :k]
    return (a.to(torch.float32) * sa) @ (b.to(torch.float32) * sb).T


def _split_fp16(t: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t [r, k] fp8 times its blockwise scale [r, k] (broadcast already) in fp32 -> (high, low) fp16 parts, K-contiguous."""
    full = t.to(torch.float32) * scale
    high = full.to(torch.float16)
    low = (full - high.to(torch.float32)).to(torch.float16)
    return high.contiguous(), low.contiguous()


def _split_fp16_mm(a, b, a_scale, b_scale) -> torch.Tensor:
    """[m, k] x [n, k] -> [m, n] fp32 from three fp16 tensor-core GEMMs (see the module docstring)."""
    m, k = a.shape
    n = b.shape[0]
    sa = a_scale.repeat_interleave(BLOCK, dim=1)[:, :k]
    sb = b_scale.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)[:, :k]
    ah, al = _split_fp16(a, sa)
    bh, bl = _split_fp16(b, sb)
    out = torch.mm(ah, bh.T, out_dtype=torch.float32)
    out += torch.mm(ah, bl.T, out_dtype=torch.float32)
    out += torch.mm(al, bh.T, out_dtype=torch.float32)
    return out


_fp32_out_mm = None  # None = not probed yet; True/False = fp16 GEMMs with fp32 output work on this GPU


def _probe_fp32_out_mm(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        x = torch.ones((16, 16), dtype=torch.float16, device=device)
        return torch.mm(x, x, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError):
        return False


def custom_kernel(data: input_t) -> output_t:
    global _fp32_out_mm
    a, b, a_scale, b_scale, c = data
    if _fp32_out_mm is None:
        _fp32_out_mm = _probe_fp32_out_mm(a.device)
    product = _split_fp16_mm if _fp32_out_mm else _dequantized_mm
    c.copy_(product(a, b, a_scale, b_scale))
    return c
