"""fp8-mm in plain PyTorch: blockwise-scaled FP8 GEMM (DeepSeek-V3 scaling, block 128).

Inputs (PROBLEMS.md): a [m, k] and b [n, k] float8_e4m3fnuz, a_scale [m, ceil(k/128)] and b_scale
[ceil(n/128), ceil(k/128)] fp32, all column-major views (stride 1 along dim 0); c [m, n] bf16 row-major.
Output: [m, n] bf16, c[i, j] = bf16(sum_k a[i,k] a_scale[i,k//128] * b[j,k] b_scale[j//128,k//128]).

Why not torch._scaled_mm: cuBLAS runs the blockwise recipe (A 1x128, B 128x128) on Hopper, but Hopper's FP8 tensor
cores keep only about 14 bits while they accumulate, so outputs near zero miss the official tolerance
(atol 1e-3 against values of size ~100); benchmarks/fp8_mm.py times it as the peer and flags that.

So this backend does the exact math everywhere: dequantize blockwise to fp32 and multiply in fp32 (cuBLAS SGEMM on a
GPU, TF32 off). Faster formulations were measured to miss the tolerance: splitting a*sa and b*sb into fp16 high and
low parts (three fp16 GEMMs with fp32 output) failed 1 element of 1.5M at 1024x1536x7168 on an H100, because one long
tensor-core accumulation over k = 7168 drifts further from the reference than the atol allows near zero.
The fast exact path (fp16 MMA on the raw fp8 values, one scale step per 128-k block) is kernels/fp8-mm/cuda.
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


def custom_kernel(data: input_t) -> output_t:
    a, b, a_scale, b_scale, c = data
    c.copy_(_dequantized_mm(a, b, a_scale, b_scale))
    return c
