// Byte transpose that turns the column-major fp8 operands into the K-major layout FP8 wgmma requires.
// Both operands go through ONE launch: blocks [0, tiles_a) handle A, the rest handle B.
#pragma once
#include <cstdint>

namespace fp8mm {

constexpr int kTrTile = 128;     // tile is 128 (k) x 128 (rows of the output) bytes
constexpr int kTrThreads = 256;

struct TransposeJob {
  const uint8_t* src;  // [k][rows] bytes, rows contiguous (the column-major [rows, k] operand)
  uint8_t* dst;        // [rows][k] bytes, k contiguous
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

// Phase 1 copies a 128x128 byte tile into shared memory with 16-byte loads (4 per thread, all issued before
// the first store so they are in flight together). Phase 2: warp w takes k rows [16w, 16w+16), lane l takes
// output rows [4l, 4l+4): it reads 16 words (conflict-free: word column = lane), transposes four 4x4 byte
// blocks in registers and writes 4 x 16 bytes of K-contiguous output.
__global__ void __launch_bounds__(kTrThreads) transpose_pair_kernel(TransposeJob ja, TransposeJob jb) {
  __shared__ __align__(16) uint32_t tile[kTrTile][kTrTile / 4];

  const bool is_a = blockIdx.x < ja.tiles;
  // Field-wise selects keep the parameters in the constant bank (a reference to either struct would not).
  TransposeJob j;
  j.src = is_a ? ja.src : jb.src;
  j.dst = is_a ? ja.dst : jb.dst;
  j.rows = is_a ? ja.rows : jb.rows;
  j.k = is_a ? ja.k : jb.k;
  const int t = is_a ? blockIdx.x : blockIdx.x - ja.tiles;
  const int row_tiles = (j.rows + kTrTile - 1) / kTrTile;
  const int r0 = (t % row_tiles) * kTrTile;  // output row (m or n) offset
  const int k0 = (t / row_tiles) * kTrTile;
  const int tid = threadIdx.x;

  uint4 v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + i * kTrThreads;  // 0..1023: 128 k-rows x 8 chunks of 16 bytes
    const int kr = idx >> 3, ch = idx & 7;
    const int r = r0 + ch * 16;
    if (r < j.rows)
      v[i] = __ldg(reinterpret_cast<const uint4*>(j.src + (size_t)(k0 + kr) * j.rows + r));
    else
      v[i] = make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + i * kTrThreads;
    *reinterpret_cast<uint4*>(&tile[idx >> 3][(idx & 7) * 4]) = v[i];
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  const int r = r0 + lane * 4;
  if (r >= j.rows) return;  // rows is a multiple of 16, so a group of 4 is all in or all out
  uint32_t w[16];
#pragma unroll
  for (int q = 0; q < 16; ++q) w[q] = tile[warp * 16 + q][lane];
#pragma unroll
  for (int q = 0; q < 4; ++q) transpose4x4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
  // After the swaps, w[4q + c] = 4 k-bytes (16w+4q .. +3) of output row r+c.
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint4 o = make_uint4(w[c], w[4 + c], w[8 + c], w[12 + c]);
    *reinterpret_cast<uint4*>(j.dst + (size_t)(r + c) * j.k + k0 + warp * 16) = o;
  }
}

}  // namespace fp8mm
