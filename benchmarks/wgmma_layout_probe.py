"""Checks on the GPU the shared-memory conventions the moe and mla-decode kernels rely on, in isolation:
128-byte swizzled K-major A (sm90.cuh sw128_offset), the N-major B descriptor (LBO = stride between 64-wide N
chunks, SBO = stride between 8-row K groups) of wgmma m64n256k16 with tnspB, and TMA row gathers (128 one-row boxes
into a swizzled tile give the bytes one 128-row box gives: what moe's GEMM 1 relies on to gather its A rows).

    python benchmarks/wgmma_layout_probe.py     # prints the worst error of each descriptor variant

The tiles are written by plain stores with the swizzle formula (what TMA writes), then one warpgroup multiplies.
"""
import torch
from torch.utils.cpp_extension import load_inline

from kbench import generator

CUDA = r"""
#include "sm90.cuh"
#include "tma_host.h"
#include "wgmma.cuh"
using namespace kb::sm90;

// a [64][64] fp16 row-major (K-major), b [64][256] fp16 row-major (N-major), d [64][256] fp32.
__global__ void probe(const __half* a, const __half* b, float* d, int lbo, int sbo) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* sa = smem;              // 64 rows x 128 bytes
  uint8_t* sb = smem + 8192;       // 4 chunks of 64 k-rows x 128 bytes (64 n each)
  for (int i = threadIdx.x; i < 64 * 8; i += 128) {
    const int r = i / 8, c = i % 8;
    *reinterpret_cast<uint4*>(sa + sw128_offset(r, c)) = *reinterpret_cast<const uint4*>(a + r * 64 + c * 8);
  }
  for (int i = threadIdx.x; i < 64 * 32; i += 128) {
    const int k = i / 32, c16 = i % 32, chunk = c16 / 8, c = c16 % 8;   // 16-byte piece c16 of row k
    *reinterpret_cast<uint4*>(sb + chunk * 8192 + sw128_offset(k, c)) =
        *reinterpret_cast<const uint4*>(b + k * 256 + c16 * 8);
  }
  fence_proxy_async_smem();
  __syncthreads();
  float acc[128];
  const uint64_t da = make_desc_sw128(sa), db = make_desc_sw128(sb, lbo, sbo);
  wgmma_fence();
  for (int q = 0; q < 4; ++q) wgmma_m64n256k16_f16<1>(acc, da + 2 * q, db + (2048 >> 4) * q, q > 0);
  wgmma_commit();
  wgmma_wait<0>();
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  for (int c = 0; c < 32; ++c)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e)
        d[(warp * 16 + lane / 4 + 8 * h) * 256 + 8 * c + 2 * (lane % 4) + e] = acc[4 * c + 2 * h + e];
}

// x [128][64] fp16: one 128-row box into buf 0, 128 one-row boxes into buf 1; both copied out to out [2][128*64].
__global__ void tma_rows(const __grid_constant__ CUtensorMap whole, const __grid_constant__ CUtensorMap rows,
                         uint16_t* out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, 2 * 16384);
    tma_load_2d(smem, &whole, &bar, 0, 0);
    for (int r = 0; r < 128; ++r) tma_load_2d(smem + 16384 + r * 128, &rows, &bar, 0, r);
  }
  mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < 2 * 8192; i += blockDim.x) out[i] = reinterpret_cast<const uint16_t*>(smem)[i];
}

torch::Tensor gather_probe(torch::Tensor x) {
  CUtensorMap whole, rows;
  kb::make_map_2d(&whole, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, x.data_ptr(), 64, 128, 128, 64, 128, CU_TENSOR_MAP_SWIZZLE_128B);
  kb::make_map_2d(&rows, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, x.data_ptr(), 64, 128, 128, 64, 1, CU_TENSOR_MAP_SWIZZLE_128B);
  auto out = torch::empty({2, 8192}, x.options());
  cudaFuncSetAttribute(tma_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768 + 1024);
  tma_rows<<<1, 128, 32768 + 1024>>>(whole, rows, (uint16_t*)out.data_ptr());
  return out;
}

torch::Tensor run(torch::Tensor a, torch::Tensor b, int64_t lbo, int64_t sbo) {
  auto d = torch::empty({64, 256}, a.options().dtype(torch::kFloat));
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 8192 + 32768 + 1024);
  probe<<<1, 128, 8192 + 32768 + 1024>>>((const __half*)a.data_ptr(), (const __half*)b.data_ptr(),
                                          d.data_ptr<float>(), (int)lbo, (int)sbo);
  return d;
}
"""


def main():
    common = str(generator.SHIPPED / "_common")
    ext = load_inline("kbench_wgmma_probe", cpp_sources="torch::Tensor run(torch::Tensor a, torch::Tensor b, "
                      "int64_t lbo, int64_t sbo); torch::Tensor gather_probe(torch::Tensor x);",
                      cuda_sources="#include <torch/extension.h>\n" + CUDA,
                      functions=["run", "gather_probe"], extra_include_paths=[common],
                      extra_cuda_cflags=["-gencode=arch=compute_90a,code=sm_90a", "-O2"])
    a = torch.randn(64, 64, device="cuda").half()
    b = torch.randn(64, 256, device="cuda").half()
    ref = a.float() @ b.float()
    for name, lbo, sbo in (("LBO=8192 SBO=1024 (the kernels')", 8192, 1024), ("swapped", 1024, 8192)):
        d = ext.run(a, b, lbo, sbo)
        torch.cuda.synchronize()
        print(f"wgmma N-major B, {name}: max |err| {(d - ref).abs().max().item():.3g}", flush=True)
    x = torch.randn(128, 64, device="cuda").half()
    try:
        both = ext.gather_probe(x)
        torch.cuda.synchronize()
        same = torch.equal(both[0], both[1])
        print(f"TMA one-row boxes into a 128B-swizzled tile: {'same bytes as one 128-row box' if same else 'DIFFER'}",
              flush=True)
    except Exception as exc:  # noqa: BLE001 - an illegal address says as much as a mismatch
        print(f"TMA one-row boxes into a 128B-swizzled tile: failed ({type(exc).__name__}: {exc})", flush=True)


if __name__ == "__main__":
    main()
