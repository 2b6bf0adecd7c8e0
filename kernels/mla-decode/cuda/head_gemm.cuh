// The two per-head GEMMs of the absorbed step (W_UK into the query, W_UV out of the attention), in place of cuBLAS's
// strided batched GEMM: cuBLAS spent ~190 us of host time before the first one's launch in leaderboard mode's eager
// windows, while the GPU waited (docs/mla-decode-notes.md, finding 32). These GEMMs are small (2.1 GFLOP and 16.8 MB
// of weights each), so a plain mma.sync kernel is enough.
//
// For every head h: C[h] [m, n] = A[h] [m, k] . B[h] [k, n], bf16 operands, fp32 sums, bf16 results (as cuBLAS's bf16
// GEMM rounds). A and C rows are strided (the heads interleave within a token's row); B[h] is either [k][n] row-major
// (kBKMajor = false: W_UK[h], n contiguous) or [n][k] row-major (kBKMajor = true: W_UV[h] read as its transpose).
// CTA = (128 columns of n, head h), 8 warps as 4 (m) x 2 (n), each 32 x 64 of C through m16n8k16; k in chunks of 32,
// double-buffered by cp.async; rows past m are read from row m - 1 and not stored.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace mla {

constexpr int kHgThreads = 256;
constexpr int kHgBM = 128, kHgBN = 128, kHgBK = 32;
constexpr int kHgAPitch = kHgBK + 8;   // bf16: 80-byte rows, conflict-free ldmatrix
constexpr int kHgBnPitch = kHgBN + 8;  // kBKMajor = false: [32 k][136]
constexpr int kHgBkPitch = kHgBK + 8;  // kBKMajor = true: [128 n][40]

struct HeadGemmArgs {
  const __nv_bfloat16* a;
  long long a_row, a_head;  // element strides of A's rows and heads
  const __nv_bfloat16* b;
  long long b_row, b_head;  // of B's stored rows (k rows, or n rows when kBKMajor) and heads
  __nv_bfloat16* c;
  long long c_row, c_head;
  int m, n, k;  // m <= 128; n a multiple of 128; k a multiple of 32
};

__device__ __forceinline__ void hg_cp16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}

__device__ __forceinline__ void hg_ldm_x4(const void* smem, uint32_t (&r)[4], bool trans) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  if (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void hg_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <bool kBKMajor>
__global__ void __launch_bounds__(kHgThreads) head_gemm_kernel(const HeadGemmArgs p) {
  constexpr int kBElems = kBKMajor ? kHgBN * kHgBkPitch : kHgBK * kHgBnPitch;
  __shared__ __align__(16) __nv_bfloat16 s_a[2][kHgBM * kHgAPitch];
  __shared__ __align__(16) __nv_bfloat16 s_b[2][kBElems];
  const int h = blockIdx.y, n0 = blockIdx.x * kHgBN;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const __nv_bfloat16* a = p.a + h * p.a_head;
  const __nv_bfloat16* b = p.b + h * p.b_head;

  // one chunk of k: A 128 x 32 (4 16-byte pieces a row) and B 32 x 128 or 128 x 32, two pieces of each a thread
  auto load = [&](int kc, int buf) {
    const int k0 = kc * kHgBK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int piece = t + i * kHgThreads;  // 0..511
      const int row = piece / 4, col = (piece % 4) * 8;
      const int src_row = row < p.m ? row : p.m - 1;
      hg_cp16(&s_a[buf][row * kHgAPitch + col], a + src_row * p.a_row + k0 + col);
      if constexpr (kBKMajor) {  // n rows of 32 k
        hg_cp16(&s_b[buf][row * kHgBkPitch + col], b + (n0 + row) * p.b_row + k0 + col);
      } else {  // 32 k rows of 128 n: 16 pieces a row
        const int krow = piece / 16, ncol = (piece % 16) * 8;
        hg_cp16(&s_b[buf][krow * kHgBnPitch + ncol], b + (k0 + krow) * p.b_row + n0 + ncol);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  const int wm = (warp / 2) * 32, wn = (warp % 2) * 64;  // this warp's 32 x 64 of the tile
  float acc[2][8][4] = {};
  const int chunks = p.k / kHgBK;
  load(0, 0);
  for (int kc = 0; kc < chunks; ++kc) {
    const int buf = kc & 1;
    if (kc + 1 < chunks) {
      load(kc + 1, buf ^ 1);
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kHgBK; ks += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)  // rows wm + 16 i + (lane % 16), k ks + (lane / 16) * 8
        hg_ldm_x4(&s_a[buf][(wm + 16 * i + lane % 16) * kHgAPitch + ks + (lane / 16) * 8], af[i], false);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // n-tiles 2j, 2j + 1: r0, r1 = b0, b1 of the first; r2, r3 of the second
        uint32_t bf[4];
        if constexpr (kBKMajor) {  // lane: n row (lane % 8) + (lane / 16) * 8, k ks + ((lane / 8) % 2) * 8
          hg_ldm_x4(&s_b[buf][(wn + 16 * j + lane % 8 + (lane / 16) * 8) * kHgBkPitch + ks + ((lane / 8) % 2) * 8], bf,
                    false);
        } else {  // lane: k row ks + (lane % 8) + ((lane / 8) % 2) * 8, n (lane / 16) * 8
          hg_ldm_x4(&s_b[buf][(ks + lane % 8 + ((lane / 8) % 2) * 8) * kHgBnPitch + wn + 16 * j + (lane / 16) * 8],
                    bf, true);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          hg_mma(acc[i][2 * j], af[i], bf[0], bf[1]);
          hg_mma(acc[i][2 * j + 1], af[i], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration's load
  }
  __nv_bfloat16* c = p.c + h * p.c_head;
  const int g = lane / 4, tc = 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = wm + 16 * i + g + 8 * half;
        if (row < p.m)
          *reinterpret_cast<__nv_bfloat162*>(c + row * p.c_row + n0 + wn + 8 * jn + tc) =
              __floats2bfloat162_rn(acc[i][jn][2 * half], acc[i][jn][2 * half + 1]);
      }
}

}  // namespace mla
