"""Blockwise-scaled FP8 GEMM in Triton (DeepSeek-V3 scaling, 128-wide K blocks).

    c[i, j] = bf16( sum_k a[i, k] * a_scale[i, k // 128] * b[j, k] * b_scale[j // 128, k // 128] )

Inputs as the fp8-mm problem hands them over:
    a        [m, k]           float8_e4m3fnuz (or float8_e4m3fn), any strides (the official view is column-major)
    b        [n, k]           same dtype as a
    a_scale  [m, k/128]       float32, one scale per row and K block
    b_scale  [n/128, k/128]   float32 (ceil for n), one scale per 128x128 block of b
    c        [m, n]           bfloat16, written in place and returned
m and n need not be multiples of the tile (masked); k must be a multiple of 128 (the scale block).

Three ways to feed the tensor cores, chosen per device:
- CUDA sm_89+: the fnuz bytes are reinterpreted as float8_e4m3fn, which reads every finite value the problem
  produces as exactly 2x its fnuz value (bias 7 vs 8), so the product of two operands is 4x: one 0.25 at the end.
  (fnuz 0x7F/0xFF = +-240 would read as e4m3fn NaN; randn inputs never reach 240.) The tiles are widened to fp16
  (exact) before the dot: NVIDIA's FP8 tensor cores keep only ~14 bits while accumulating, which misses the official
  atol on outputs near zero (measured on an H100), while fp16 MMA accumulates in full fp32.
- ROCm: fnuz is native (tl.float8e4b8), no rescale.
- Anything else (the CPU under TRITON_INTERPRET=1, older GPUs): the kernel loads raw bytes, decodes them to fp32
  itself and runs an fp32 dot; fp8 products are exact in fp32, so the result matches the native path.
"""
import torch
import triton
import triton.language as tl

SCALE_BLOCK = 128


@triton.jit
def _decode_fp8(x, FNUZ: tl.constexpr):
    """uint8 codes of e4m3 (FNUZ: bias 8, 0x80 = NaN; else e4m3fn: bias 7, 0x7F/0xFF = NaN) -> float32."""
    x = x.to(tl.int32)
    exp = (x >> 3) & 15
    mant = x & 7
    bias: tl.constexpr = 8 if FNUZ else 7
    # normal: (8 + mant) * 2^(exp - bias - 3); subnormal (exp 0): mant * 2^(1 - bias - 3)
    mag = tl.where(exp == 0, mant, mant + 8).to(tl.float32) * tl.exp2((tl.maximum(exp, 1) - bias - 3).to(tl.float32))
    val = tl.where(x >= 128, -mag, mag)
    if FNUZ:
        val = tl.where(x == 128, float("nan"), val)
    else:
        val = tl.where((x & 127) == 127, float("nan"), val)
    return val


@triton.jit
def fp8_blockwise_gemm_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    stride_cm, stride_cn,
    out_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NATIVE: tl.constexpr, FNUZ: tl.constexpr, WIDEN: tl.constexpr,
):
    # Grouped launch order: GROUP_M row-tiles share each column-tile of b while it is hot in L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % rows
    pid_n = (pid % (GROUP_M * num_n)) // rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    as_ptrs = as_ptr + offs_m * stride_asm
    bs_ptrs = bs_ptr + (offs_n // BLOCK_K) * stride_bsn  # BLOCK_K is the 128-wide scale block

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        if NATIVE and WIDEN:
            part = tl.dot(a.to(tl.float16), b.to(tl.float16))
        elif NATIVE:
            part = tl.dot(a, b)
        else:
            part = tl.dot(_decode_fp8(a, FNUZ), _decode_fp8(b, FNUZ), input_precision="ieee")
        sa = tl.load(as_ptrs + kb * stride_ask, mask=mask_m, other=0.0)
        sb = tl.load(bs_ptrs + kb * stride_bsk, mask=mask_n, other=0.0)
        acc += part * (sa[:, None] * sb[None, :])
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    acc = acc * out_scale
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _mode(a: torch.Tensor) -> str:
    """"nv" (e4m3fn tensor cores), "rocm" (fnuz tensor cores) or "decode" (bytes -> fp32 in the kernel)."""
    if a.device.type != "cuda" or not hasattr(torch, "float8_e4m3fn"):
        return "decode"
    if torch.version.hip:
        return "rocm"
    return "nv" if torch.cuda.get_device_capability(a.device) >= (8, 9) else "decode"


def _kmajor_bytes(x: torch.Tensor) -> torch.Tensor:
    """[rows, k] fp8 -> the same bytes as a row-major (k-contiguous) uint8 tensor."""
    return x.view(torch.uint8).contiguous()


def _config(m: int, n: int, mode: str) -> dict:
    """Tile sizes by shape; no autotuning, so the first (checked) call is not a long search.

    The decode path keeps the same tiles, so CPU runs exercise the same masking as the GPU.
    """
    if m <= 64:
        cfg = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4)
    elif m <= 128 or m * n <= 1024 * 1024:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=4)
    else:
        cfg = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
    if mode == "decode":
        cfg.update(num_warps=4, num_stages=1)  # fp32 tiles: keep registers and shared memory modest
    return cfg


def fp8_blockwise_mm(a, b, a_scale, b_scale, c):
    """c = blockwise-scaled a @ b.T in bf16 (shapes in the module docstring); returns c."""
    fnuz_t = getattr(torch, "float8_e4m3fnuz", None)
    if a.dtype not in (fnuz_t, getattr(torch, "float8_e4m3fn", None)) or b.dtype != a.dtype:
        raise TypeError(f"fp8_blockwise_mm: a and b must both be float8_e4m3fnuz or float8_e4m3fn, "
                        f"got {a.dtype} and {b.dtype}")
    m, k = a.shape
    n = b.shape[0]
    if k % SCALE_BLOCK or b.shape[1] != k:
        raise ValueError(f"fp8_blockwise_mm: k must be a multiple of {SCALE_BLOCK} and equal for a and b, "
                         f"got a {tuple(a.shape)}, b {tuple(b.shape)}")
    kb = k // SCALE_BLOCK
    if tuple(a_scale.shape) != (m, kb) or tuple(b_scale.shape) != (triton.cdiv(n, SCALE_BLOCK), kb):
        raise ValueError(f"fp8_blockwise_mm: scales must be [m, k/128] and [ceil(n/128), k/128], "
                         f"got {tuple(a_scale.shape)} and {tuple(b_scale.shape)}")
    fnuz = a.dtype == fnuz_t
    mode = _mode(a)
    out_scale = 1.0
    if mode == "nv":
        # Tensor cores want K-contiguous fp8 operands; the official column-major views are M/N-contiguous.
        # (Copied as bytes: fp8 copy kernels are not in every torch build.)
        a, b = _kmajor_bytes(a).view(torch.float8_e4m3fn), _kmajor_bytes(b).view(torch.float8_e4m3fn)
        if fnuz:
            out_scale = 0.25
    elif mode == "rocm":
        a, b = _kmajor_bytes(a).view(a.dtype), _kmajor_bytes(b).view(b.dtype)
    else:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    cfg = _config(m, n, mode)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    fp8_blockwise_gemm_kernel[grid](
        a, b, a_scale, b_scale, c,
        m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
        c.stride(0), c.stride(1),
        out_scale,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=SCALE_BLOCK, GROUP_M=8,
        NATIVE=mode != "decode", FNUZ=fnuz, WIDEN=mode == "nv",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return c
