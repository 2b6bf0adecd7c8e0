"""Checks on the GPU the shared-memory conventions the moe and mla-decode kernels rely on, in isolation:
128-byte swizzled K-major A (sm90.cuh sw128_offset), and the N-major B descriptor (LBO = stride between 64-wide N
chunks, SBO = stride between 8-row K groups) of wgmma m64n256k16 with tnspB.

    python benchmarks/wgmma_layout_probe.py     # prints the worst error of each descriptor variant

The tiles are written by plain stores with the swizzle formula (what TMA writes), then one warpgroup multiplies.
"""
import torch
from torch.utils.cpp_extension import load_inline

from kbench import generator

CUDA = r"""
#include "sm90.cuh"
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
                      "int64_t lbo, int64_t sbo);", cuda_sources="#include <torch/extension.h>\n" + CUDA,
                      functions=["run"], extra_include_paths=[common],
                      extra_cuda_cflags=["-gencode=arch=compute_90a,code=sm_90a", "-O2"])
    a = torch.randn(64, 64, device="cuda").half()
    b = torch.randn(64, 256, device="cuda").half()
    ref = a.float() @ b.float()
    for name, lbo, sbo in (("LBO=8192 SBO=1024 (the kernels')", 8192, 1024), ("swapped", 1024, 8192)):
        d = ext.run(a, b, lbo, sbo)
        torch.cuda.synchronize()
        print(f"wgmma N-major B, {name}: max |err| {(d - ref).abs().max().item():.3g}", flush=True)


if __name__ == "__main__":
    main()
