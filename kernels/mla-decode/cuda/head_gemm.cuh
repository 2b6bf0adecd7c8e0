// The two per-head GEMMs of the absorbed step (W_UK into the query, W_UV out of the attention), in place of cuBLAS's
// strided batched GEMM: cuBLAS spent ~190 us of host time before the first one's launch in leaderboard mode's eager
// windows, while the GPU waited (docs/mla-decode-notes.md, finding 32), and inside the graph its capture would be the
// process's first cuBLAS call, which cannot be captured (finding 33). These GEMMs are small (2.1 GFLOP and 16.8 MB of
// weights each), so a plain mma.sync kernel is enough.
//
// For every head h: C[h] [m, n] = A[h] [m, k] . B[h] [k, n], bf16 operands, fp32 sums, bf16 results (as cuBLAS's bf16
// GEMM rounds). A and C rows are strided (the heads interleave within a token's row); B[h] is either [k][n] row-major
// (kBKMajor = false: W_UK[h], n contiguous) or [n][k] row-major (kBKMajor = true: W_UV[h] read as its transpose).
// CTA = (128 columns of n, head h), 8 warps as 4 (m) x 2 (n), each 32 x 64 of C through m16n8k16; k in chunks of 64
// through a ring of kStages cp.async stages (every chunk of W_UK's k = 128 in flight at once, three of W_UV's 512);
// rows past m are read from row m - 1 and not stored. The tile leaves through shared memory as 256-byte row segments.
// Why these choices (docs/mla-decode-notes.md, finding 33): the first version (k chunks of 32, two stages, 4-byte
// stores of C) read 573 / 689 GB/s of weights against cuBLAS's 1104 / 978; both GEMMs move ~36 MB (W 16.8 MB, the
// other operand and C), ~12 us at 3 TB/s, so the bytes in flight a SM and C's write pattern set their time.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "sm90.cuh"  // smem_u32, ldmatrix_x4 (_trans)

namespace mla {

constexpr int kHgThreads = 256;
constexpr int kHgBM = 128, kHgBN = 128, kHgBK = 64;
constexpr int kHgAPitch = kHgBK + 8;   // bf16: 144-byte rows, conflict-free ldmatrix
constexpr int kHgBnPitch = kHgBN + 8;  // kBKMajor = false: [64 k][136]
constexpr int kHgBkPitch = kHgBK + 8;  // kBKMajor = true: [128 n][72]
constexpr int kHgCPitch = kHgBN + 8;   // the epilogue's staged tile: [128 m][136]
constexpr int kHgStageElems = kHgBM * kHgAPitch + (kHgBK * kHgBnPitch > kHgBN * kHgBkPitch ? kHgBK * kHgBnPitch
                                                                                            : kHgBN * kHgBkPitch);
constexpr int hg_smem_bytes(int stages) { return stages * kHgStageElems * 2; }
static_assert(kHgBM * kHgCPitch <= 2 * kHgStageElems, "the staged C tile fits in two stages");

struct HeadGemmArgs {
  const __nv_bfloat16* a;
  long long a_row, a_head;  // element strides of A's rows and heads
  const __nv_bfloat16* b;
  long long b_row, b_head;  // of B's stored rows (k rows, or n rows when kBKMajor) and heads
  __nv_bfloat16* c;
  long long c_row, c_head;
  int m, n, k;  // m <= 128; n a multiple of 128; k a multiple of 64
  const void* const* b_slot;  // a moving graph: B is b_offset bytes past the address this device word holds (else b)
  long long b_offset;
};

__device__ __forceinline__ void hg_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <bool kBKMajor, int kStages>
__global__ void __launch_bounds__(kHgThreads, 2) head_gemm_kernel(const HeadGemmArgs p) {
  static_assert(kStages >= 2, "the staged C tile reuses two stages");
  extern __shared__ __align__(16) __nv_bfloat16 hg_smem[];
  const int h = blockIdx.y, n0 = blockIdx.x * kHgBN;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const __nv_bfloat16* a = p.a + h * p.a_head;
  const __nv_bfloat16* b =
      (p.b_slot ? reinterpret_cast<const __nv_bfloat16*>(static_cast<const char*>(*p.b_slot) + p.b_offset) : p.b) +
      h * p.b_head;
  auto s_a = [&](int buf) { return hg_smem + buf * kHgStageElems; };
  auto s_b = [&](int buf) { return hg_smem + buf * kHgStageElems + kHgBM * kHgAPitch; };

  // one chunk of k: A 128 x 64 (8 16-byte pieces a row) and B 64 x 128 or 128 x 64, four pieces of each a thread
  auto load = [&](int kc, int buf) {
    const int k0 = kc * kHgBK;
    __nv_bfloat16* sa = s_a(buf);
    __nv_bfloat16* sb = s_b(buf);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int piece = t + i * kHgThreads;  // 0..1023
      const int row = piece / 8, col = (piece % 8) * 8;
      const int src_row = row < p.m ? row : p.m - 1;
      kb::sm90::cp_async_16(&sa[row * kHgAPitch + col], a + src_row * p.a_row + k0 + col);
      if constexpr (kBKMajor) {  // n rows of 64 k
        kb::sm90::cp_async_16(&sb[row * kHgBkPitch + col], b + (n0 + row) * p.b_row + k0 + col);
      } else {  // 64 k rows of 128 n: 16 pieces a row
        const int krow = piece / 16, ncol = (piece % 16) * 8;
        kb::sm90::cp_async_16(&sb[krow * kHgBnPitch + ncol], b + (k0 + krow) * p.b_row + n0 + ncol);
      }
    }
  };

  const int wm = (warp / 2) * 32, wn = (warp % 2) * 64;  // this warp's 32 x 64 of the tile
  float acc[2][8][4] = {};
  const int chunks = p.k / kHgBK;
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {  // every group is committed, empty or not: wait_group counts them
    if (c < chunks) load(c, c);
    kb::sm90::cp_async_commit();
  }
  for (int kc = 0; kc < chunks; ++kc) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    __syncthreads();  // chunk kc landed for every thread, and every warp is done with chunk kc - 1's stage
    if (kc + kStages - 1 < chunks) load(kc + kStages - 1, (kc + kStages - 1) % kStages);
    kb::sm90::cp_async_commit();
    const __nv_bfloat16* sa = s_a(kc % kStages);
    const __nv_bfloat16* sb = s_b(kc % kStages);
#pragma unroll
    for (int ks = 0; ks < kHgBK; ks += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)  // rows wm + 16 i + (lane % 16), k ks + (lane / 16) * 8
        kb::sm90::ldmatrix_x4(&sa[(wm + 16 * i + lane % 16) * kHgAPitch + ks + (lane / 16) * 8], af[i][0], af[i][1],
                              af[i][2], af[i][3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // n-tiles 2j, 2j + 1: r0, r1 = b0, b1 of the first; r2, r3 of the second
        uint32_t bf[4];
        if constexpr (kBKMajor) {  // lane: n row (lane % 8) + (lane / 16) * 8, k ks + ((lane / 8) % 2) * 8
          kb::sm90::ldmatrix_x4(
              &sb[(wn + 16 * j + lane % 8 + (lane / 16) * 8) * kHgBkPitch + ks + ((lane / 8) % 2) * 8], bf[0], bf[1],
              bf[2], bf[3]);
        } else {  // lane: k row ks + (lane % 8) + ((lane / 8) % 2) * 8, n (lane / 16) * 8
          kb::sm90::ldmatrix_x4_trans(
              &sb[(ks + lane % 8 + ((lane / 8) % 2) * 8) * kHgBnPitch + wn + 16 * j + (lane / 16) * 8], bf[0], bf[1],
              bf[2], bf[3]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          hg_mma(acc[i][2 * j], af[i], bf[0], bf[1]);
          hg_mma(acc[i][2 * j + 1], af[i], bf[2], bf[3]);
        }
      }
    }
  }
  kb::sm90::cp_async_wait_all();  // (only empty groups are left)
  __syncthreads();                                        // every warp is done reading the ring: it holds C now
  __nv_bfloat16* s_c = hg_smem;
  const int g = lane / 4, tc = 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<__nv_bfloat162*>(&s_c[(wm + 16 * i + g + 8 * half) * kHgCPitch + wn + 8 * jn + tc]) =
            __floats2bfloat162_rn(acc[i][jn][2 * half], acc[i][jn][2 * half + 1]);
  __syncthreads();
  __nv_bfloat16* c = p.c + h * p.c_head + n0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // 16 threads a row: 256 contiguous bytes of it
    const int piece = t + i * kHgThreads, row = piece / 16, col = (piece % 16) * 8;
    if (row < p.m)
      *reinterpret_cast<uint4*>(c + row * p.c_row + col) = *reinterpret_cast<const uint4*>(&s_c[row * kHgCPitch + col]);
  }
}

}  // namespace mla
