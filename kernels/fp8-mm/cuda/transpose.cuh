// Transpose pass that turns the column-major fp8 operands into the K-major layout wgmma requires, optionally
// widening to fp16 on the way. Both operands go through ONE launch: blocks [0, a.tiles) do A, the rest B.
#pragma once
#include <cstdint>

namespace fp8mm {

constexpr int kTrTile = 128;  // a tile is 128 (k) x 128 (output rows) source bytes
constexpr int kTrThreads = 256;

struct TransposeJob {
  const uint8_t* src;  // [k][rows] bytes, rows contiguous (the column-major [rows, k] operand)
  void* dst;           // [rows][k] K-contiguous: bytes, or fp16 when widening
  int rows;            // m or n; multiple of 16
  int k;               // multiple of 128
  int tiles;           // ceil(rows/128) * k/128
};

// Swap a 4x4 byte block: w[j] holds bytes (row j, col 0..3); afterwards w[c] holds bytes (col c, row 0..3).
__device__ __forceinline__ void transpose4x4(uint32_t& w0, uint32_t& w1, uint32_t& w2, uint32_t& w3) {
  const uint32_t t0 = __byte_perm(w0, w1, 0x5140), t1 = __byte_perm(w0, w1, 0x7362);
  const uint32_t t2 = __byte_perm(w2, w3, 0x5140), t3 = __byte_perm(w2, w3, 0x7362);
  w0 = __byte_perm(t0, t2, 0x5410);
  w1 = __byte_perm(t0, t2, 0x7632);
  w2 = __byte_perm(t1, t3, 0x5410);
  w3 = __byte_perm(t1, t3, 0x7632);
}

// Two e4m3 bytes (bits [16h, 16h+16) of w, low byte first) -> fp16x2, exactly (every e4m3 value the problem
// produces is a normal fp16 number; hardware cvt on sm_89+).
template <int kHalf>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
  const uint16_t pair = static_cast<uint16_t>(kHalf ? (w >> 16) : (w & 0xFFFFu));
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(pair));
  return r;
}

// Phase 1: 16-byte coalesced loads of the 128x128 source tile into shared memory (4 per thread, all in flight
// before the first store). Phase 2: warp w takes k rows [16w, 16w+16) and lane l output rows [4l, 4l+4);
// it reads 16 words (conflict-free: the word column is the lane), transposes four 4x4 byte blocks in
// registers and stages its 4 rows x 16 k in an XOR-swizzled output tile. Phase 3: coalesced 16-byte stores,
// 128 (fp8) or 256 (fp16) contiguous bytes per output row.
template <bool kF16>
__global__ void __launch_bounds__(kTrThreads) transpose_pair_kernel(TransposeJob ja, TransposeJob jb) {
  constexpr int kOutChunks = kF16 ? 16 : 8;  // 16-byte chunks per output row of the tile
  __shared__ __align__(16) uint32_t in_tile[kTrTile][kTrTile / 4];
  __shared__ __align__(16) uint4 out_tile[kTrTile * kOutChunks];

  const bool is_a = blockIdx.x < ja.tiles;
  // Field-wise selects keep the parameters in the constant bank (a reference to either struct would not).
  const uint8_t* src = is_a ? ja.src : jb.src;
  uint8_t* dst = static_cast<uint8_t*>(is_a ? ja.dst : jb.dst);
  const int rows = is_a ? ja.rows : jb.rows;
  const int k = is_a ? ja.k : jb.k;
  const int t = is_a ? blockIdx.x : blockIdx.x - ja.tiles;
  const int row_tiles = (rows + kTrTile - 1) / kTrTile;
  const int r0 = (t % row_tiles) * kTrTile;  // output row (m or n) offset
  const int k0 = (t / row_tiles) * kTrTile;
  const int tid = threadIdx.x;

  uint4 v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + i * kTrThreads;  // 0..1023: 128 k-rows x 8 chunks of 16 bytes
    const int r = r0 + (idx & 7) * 16;
    v[i] = r < rows ? __ldg(reinterpret_cast<const uint4*>(src + (size_t)(k0 + (idx >> 3)) * rows + r))
                    : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + i * kTrThreads;
    *reinterpret_cast<uint4*>(&in_tile[idx >> 3][(idx & 7) * 4]) = v[i];
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  uint32_t w[16];
#pragma unroll
  for (int q = 0; q < 16; ++q) w[q] = in_tile[warp * 16 + q][lane];
#pragma unroll
  for (int q = 0; q < 4; ++q) transpose4x4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
  // Now w[4q + c] = the 4 k-bytes 16*warp + 4q .. +3 of output row 4*lane + c.
  const int swz = lane & 7;  // == (row >> 2) & 7 for the 4 rows of this lane
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int row = lane * 4 + c;
    if constexpr (kF16) {
      out_tile[row * kOutChunks + ((2 * warp) ^ swz)] =
          make_uint4(e4m3x2_to_f16x2<0>(w[c]), e4m3x2_to_f16x2<1>(w[c]),
                     e4m3x2_to_f16x2<0>(w[4 + c]), e4m3x2_to_f16x2<1>(w[4 + c]));
      out_tile[row * kOutChunks + ((2 * warp + 1) ^ swz)] =
          make_uint4(e4m3x2_to_f16x2<0>(w[8 + c]), e4m3x2_to_f16x2<1>(w[8 + c]),
                     e4m3x2_to_f16x2<0>(w[12 + c]), e4m3x2_to_f16x2<1>(w[12 + c]));
    } else {
      out_tile[row * kOutChunks + (warp ^ swz)] = make_uint4(w[c], w[4 + c], w[8 + c], w[12 + c]);
    }
  }
  __syncthreads();

  constexpr int kElem = kF16 ? 2 : 1;
#pragma unroll
  for (int i = 0; i < kOutChunks / 2; ++i) {
    const int idx = tid + i * kTrThreads;
    const int row = idx / kOutChunks, q = idx % kOutChunks;
    if (r0 + row < rows)
      *reinterpret_cast<uint4*>(dst + ((size_t)(r0 + row) * k + k0) * kElem + q * 16) =
          out_tile[row * kOutChunks + (q ^ ((row >> 2) & 7))];
  }
  // Lets the GEMM (launched with PDL) start its prologue once every block got here; it still waits for our
  // stores to be complete and visible (griddepcontrol.wait) before reading them.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

}  // namespace fp8mm
