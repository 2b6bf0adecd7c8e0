// v11 candidates, NOT selected by the plan (measured 30-110% slower than the default on H100; docs/fp8-mm-notes.md
// v11-v11c): flags 32 / 64 (below), 128 / 256 (A widened in registers, further down), + 512 (integer-ALU
// conversion). Reachable only through fp8_gemm_with_sched; all checked correct on every benchmark shape.
// Flag 32 / 64: the exact (fp16-MMA) GEMM with the fp8 -> fp16 widening fused in.
// The transpose pass writes fp8 K-major bytes (half the bytes of the widened copy); the producer warpgroup
// TMA-loads fp8 tiles (one 128-byte swizzle span = one 128-k block per row, half the L2->SM bytes) into an fp8 ring;
// all 4 of its warps convert each block (cvt.rn.f16x2.e4m3x2, exact) into the same swizzled fp16 K-major ring
// (2 stages of 64 k per block) the consumers of fp8_gemm_kernel<128, true> read; thread 0 also issues the TMA loads,
// K8 blocks ahead of the conversion. The consumers are schedule 0 (lock step) of the default kernel.
// Ordering: converter threads store with st.shared, then fence.proxy.async.shared::cta (generic -> async proxy, so
// wgmma sees the data), __syncwarp, one arrive per warp on full16 (count 4); consumers free the fp16 stages on
// empty16 (count 8, one per consumer warp) as before; converters free fp8 stages on empty8 (count 4) after their
// loads returned (the stores that consume the loaded registers precede the arrive).
// Shared memory (BN 128, C staged in column halves): K16 fp16 stages + K8 fp8 stages, 33280 B each (A 16 KB,
// B 16 KB, 128 a_scales), K8 + K16 = 6.
#pragma once
#include "gemm.cuh"

namespace fp8mm {

// Four e4m3 bytes -> two fp16x2 words (bytes 0,1 -> lo; 2,3 -> hi), exact. Splitting the word with mov.b32 lets
// ptxas pick the upper half directly instead of shifting it down first.
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// D(64x128, fp32) (+)= A(64x16, f16, registers: the wgmma A fragment a[0..3]) * B(128x16, f16, smem K-major)^T
__device__ __forceinline__ void wgmma_m64n128k16_f16_ra(float* d, const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

// Four e4m3 bytes -> two fp16x2 words, selectable (flag 512 of plan.sched):
//   kAlu = false: cvt.rn.f16x2.e4m3x2 (F2FP), o0 = bytes (0, 1), o1 = bytes (2, 3), exact values.
//   kAlu = true:  integer ALU, o0 = bytes (0, 2), o1 = bytes (1, 3), each value times 2^-8 (exact, subnormals
//                 included: (b & 0x7F) << 7 is the fp16 pattern of |v| 2^-8, the sign moves from bit 7 to 15;
//                 the 2^8 per operand is folded into the block scale). Per word: x = b << 8 in each half (PRMT or
//                 LOP3), m = x & 0x7F00 (LOP3), h = x - m / 2 (IMAD.HI with -2^31): 3 ops per fp16x2.
// Any consistent order is fine: A and B go through the same function and the k order inside a block is free.
template <bool kAlu>
__device__ __forceinline__ void conv4(uint32_t w, uint32_t& o0, uint32_t& o1) {
  if constexpr (kAlu) {
    const uint32_t xe = __byte_perm(w, 0u, 0x2404);  // [0, b0, 0, b2]
    const uint32_t xo = w & 0xFF00FF00u;              // [0, b1, 0, b3]
    asm("mad.hi.s32 %0, %1, %2, %3;" : "=r"(o0) : "r"(xe & 0x7F007F00u), "r"(0x80000000u), "r"(xe));
    asm("mad.hi.s32 %0, %1, %2, %3;" : "=r"(o1) : "r"(xo & 0x7F007F00u), "r"(0x80000000u), "r"(xo));
  } else {
    e4m3x4_to_f16x4(w, o0, o1);
  }
}
// Block scale factor: 0.25 undoes the 2x per operand of reading fnuz bytes as e4m3fn; the ALU conversion adds 2^8
// per operand.
template <bool kAlu>
constexpr float kBlockScale = kAlu ? 16384.f : 0.25f;

template <int K8>
struct FusedShape {
  static constexpr int kF8Stages = K8;
  static constexpr int kF16Stages = 6 - K8;
  static constexpr int kTile = kBM * kRowBytes;  // 16 KB: 128 rows x 128 bytes (A or B, fp8 or fp16 stage)
  static constexpr int kCPitch = GemmShape<128, true>::kCPitch;
  static constexpr int kCBytes = 2 * 64 * kCPitch;
  static constexpr int kSmemBytes =
      1024 + 2 * (kF8Stages + kF16Stages) * kTile + (kF8Stages + kF16Stages) * kBM * 4 + kCBytes +
      2 * (kF8Stages + kF16Stages) * 8;
  static_assert(kSmemBytes <= kSmemLimit, "shared memory over budget");
};

// The CTA's k-blocks in order: (unit, kb) over u = blockIdx.x, blockIdx.x + gridDim.x, ...
struct BlockIter {
  int u, kb;
  Unit w;
  __device__ __forceinline__ void start(const GemmParams& p) {
    u = blockIdx.x;
    if (u < p.num_units) {
      w = decode_unit(p, u);
      kb = w.kb0;
    }
  }
  __device__ __forceinline__ bool valid(const GemmParams& p) const { return u < p.num_units; }
  __device__ __forceinline__ void next(const GemmParams& p) {
    if (++kb >= w.kb1) {
      u += gridDim.x;
      if (u < p.num_units) {
        w = decode_unit(p, u);
        kb = w.kb0;
      }
    }
  }
};

template <int K8, bool kAlu = false>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_fused_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                          const __grid_constant__ CUtensorMap tm_sa, const GemmParams p) {
  using S = FusedShape<K8>;
  constexpr int BN = 128;
  constexpr int kS16 = S::kF16Stages;
  constexpr int kAcc = BN / 2;
  constexpr int kTile = S::kTile;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_a = base;                  // fp16 ring, K16 x 16 KB
  uint8_t* s_b = s_a + kS16 * kTile;    // fp16 ring
  uint8_t* s_a8 = s_b + kS16 * kTile;   // fp8 ring, K8 x 16 KB
  uint8_t* s_b8 = s_a8 + K8 * kTile;    // fp8 ring
  float* s_sa = reinterpret_cast<float*>(s_b8 + K8 * kTile);  // per fp16 stage (valid in a block's first stage)
  float* s_sa8 = s_sa + kS16 * kBM;                            // per fp8 stage (TMA)
  uint8_t* s_c = reinterpret_cast<uint8_t*>(s_sa8 + K8 * kBM);
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + S::kCBytes);  // fp16 ring: converters -> consumers
  uint64_t* empty = full + kS16;                                   // fp16 ring: consumers -> converters
  uint64_t* full8 = empty + kS16;                                  // fp8 ring: TMA -> converters
  uint64_t* empty8 = full8 + K8;                                   // fp8 ring: converters -> TMA

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kS16; ++s) {
      mbar_init(&full[s], 4);   // one arrive per converter warp
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    for (int s = 0; s < K8; ++s) {
      mbar_init(&full8[s], 1);  // arrive_expect_tx + TMA bytes
      mbar_init(&empty8[s], 4);
    }
    fence_mbar_init();
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
    tma_prefetch_desc(&tm_sa);
  }
  __syncthreads();
  asm volatile("griddepcontrol.wait;" ::: "memory");

  if (wg == 0) {
    setmaxnreg_dec<72>();  // 72 + 2 x 216 <= 512 (the converters need more than the default producer's 40)
    const int r = threadIdx.x;  // this thread converts row r of the A and B tiles
    const int lane = r % 32;
    const int rx = r & 7;       // the 128-byte swizzle XORs 16-byte chunk indices with (row & 7)
    BlockIter ld, cv;
    ld.start(p);
    cv.start(p);
    int ls = 0, cs = 0, s16 = 0;
    uint32_t lphase = 0, cphase = 0, phase16 = 0;
    int loaded = 0, converted = 0;
    for (; cv.valid(p); cv.next(p)) {
      if (r == 0) {
        // Keep K8 blocks in flight ahead of the conversion (the stage freed by the previous iteration).
        while (loaded < converted + K8 && ld.valid(p)) {
          mbar_wait(&empty8[ls], lphase ^ 1);
          mbar_arrive_expect_tx(&full8[ls], 2 * kTile + kBM * 4);
          tma_load_2d(s_a8 + ls * kTile, &tm_a, &full8[ls], ld.kb * kBK, ld.w.mt * kBM);
          tma_load_2d(s_b8 + ls * kTile, &tm_b, &full8[ls], ld.kb * kBK, ld.w.nt * BN);
          tma_load_2d(s_sa8 + ls * kBM, &tm_sa, &full8[ls], ld.w.mt * kBM, ld.kb);
          ld.next(p);
          ++loaded;
          if (++ls == K8) {
            ls = 0;
            lphase ^= 1;
          }
        }
      }
      mbar_wait(&full8[cs], cphase);
      const uint8_t* src_a = s_a8 + cs * kTile + r * kRowBytes;
      const uint8_t* src_b = s_b8 + cs * kTile + r * kRowBytes;
#pragma unroll 1
      for (int h = 0; h < 2; ++h) {
        // fp8 chunk 4h + j (k = 64h + 16j .. +15) -> fp16 chunks 2j, 2j + 1 of this half's stage.
#pragma unroll
        for (int op = 0; op < 2; ++op) {
          const uint8_t* src = op == 0 ? src_a : src_b;
          uint4 in[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) in[j] = *reinterpret_cast<const uint4*>(src + (((4 * h + j) ^ rx) * 16));
          if (op == 0) mbar_wait(&empty[s16], phase16 ^ 1);
          uint8_t* dst = (op == 0 ? s_a : s_b) + s16 * kTile + r * kRowBytes;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint4 v = in[j];
            uint4 o0, o1;
            conv4<kAlu>(v.x, o0.x, o0.y);
            conv4<kAlu>(v.y, o0.z, o0.w);
            conv4<kAlu>(v.z, o1.x, o1.y);
            conv4<kAlu>(v.w, o1.z, o1.w);
            *reinterpret_cast<uint4*>(dst + (((2 * j) ^ rx) * 16)) = o0;
            *reinterpret_cast<uint4*>(dst + (((2 * j + 1) ^ rx) * 16)) = o1;
          }
        }
        if (h == 0 && r < 32)
          reinterpret_cast<float4*>(s_sa + s16 * kBM)[r] = reinterpret_cast<const float4*>(s_sa8 + cs * kBM)[r];
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(&full[s16]);
        if (++s16 == kS16) {
          s16 = 0;
          phase16 ^= 1;
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty8[cs]);
      ++converted;
      if (++cs == K8) {
        cs = 0;
        cphase ^= 1;
      }
    }
    return;
  }

  setmaxnreg_inc<216>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4;
  const int frag_col = 2 * (lane % 4);
  int s = 0;
  uint32_t phase = 0;

  for (int u = blockIdx.x; u < p.num_units; u += gridDim.x) {
    const Unit w = decode_unit(p, u);
    const int row0 = w.mt * kBM + cw * 64;
    const int col0 = w.nt * BN;
    const float* sb_col = p.sb + (long long)(col0 / 128) * p.sb_s0;
    float total[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = 0.f;
    for (int kb = w.kb0; kb < w.kb1; ++kb) {
      float acc[kAcc];
      const float sbv = __ldg(sb_col + kb * p.sb_s1);
      const int s_first = s;
      float sa0 = 0.f, sa1 = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mbar_wait(&full[s], phase);
        if (h == 0) {
          sa0 = s_sa[s * kBM + cw * 64 + frag_row];
          sa1 = s_sa[s * kBM + cw * 64 + frag_row + 8];
        }
        const uint64_t da = make_desc_k128_sw128(s_a + s * kTile + cw * 64 * kRowBytes);
        const uint64_t db = make_desc_k128_sw128(s_b + s * kTile);
        wgmma_fence();
#pragma unroll
        for (int q = 0; q < kRowBytes / 32; ++q) wgmma_tile<BN, true>(acc, da + 2 * q, db + 2 * q, h > 0 || q > 0);
        if (++s == kS16) {
          s = 0;
          phase ^= 1;
        }
      }
      const int s_last = s == 0 ? kS16 - 1 : s - 1;
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kAcc; ++i) reg_fence(acc[i]);
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(&empty[s_last]);
        mbar_arrive(&empty[s_first]);
      }
      const float f0 = sa0 * sbv * kBlockScale<kAlu>, f1 = sa1 * sbv * kBlockScale<kAlu>;
#pragma unroll
      for (int i = 0; i < kAcc; ++i) total[i] += acc[i] * ((i & 2) ? f1 : f0);
    }
    store_tile<BN, true, true>(p, total, s_c + cw * 64 * S::kCPitch, cw, t, frag_row, frag_col, row0, col0,
                               w.kb0 / p.kb_per_split);
  }
}

// ---- v11b (plan.sched flag 128 / 256): A from registers -------------------------------------------------------
// Only B goes through the converters and the fp16 ring; each consumer thread reads its own A fragment straight from
// the fp8 stage (4 LDS.128 per block), widens it in registers (32 cvt) and issues wgmma with A in registers. Shared
// memory traffic per block is then that of the default kernel (TMA 32 KB + A 16 KB + B 16 KB read, 32 KB written,
// wgmma B 64 KB) and the converters' work halves. k is permuted inside each 128-k block, identically for A and B
// (the block's scales are shared, so the sum is unchanged): logical k = 16 s + 8 e + 2 t + f (k16 step s, fragment
// half e, thread t = lane % 4, f the element of a pair) sits at byte 32 t + 4 s + 2 e + f of the fp8 row, so a
// thread's A bytes for a row are 32 contiguous bytes, and B's 64-k half h of a row comes from 16-byte chunks 2t + h.
template <int K8>
struct FusedRaShape {
  static constexpr int kF8Stages = K8;                   // A + B fp8 + a_scales
  static constexpr int kF16Stages = K8 == 4 ? 4 : 6;     // B fp16, 64 k each
  static constexpr int kTile = kBM * kRowBytes;          // 16 KB
  static constexpr int kCPitch = GemmShape<128, true>::kCPitch;
  static constexpr int kCBytes = 2 * 64 * kCPitch;
  static constexpr int kSmemBytes = 1024 + kF8Stages * (2 * kTile + kBM * 4) + kF16Stages * kTile + kCBytes +
                                    2 * (kF8Stages + kF16Stages) * 8;
  static_assert(kSmemBytes <= kSmemLimit, "shared memory over budget");
};

template <int K8, bool kAlu = false>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_fused_ra_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                             const __grid_constant__ CUtensorMap tm_sa, const GemmParams p) {
  using S = FusedRaShape<K8>;
  constexpr int BN = 128;
  constexpr int kS16 = S::kF16Stages;
  constexpr int kAcc = BN / 2;
  constexpr int kTile = S::kTile;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* s_a8 = base;                 // fp8 ring: A
  uint8_t* s_b8 = s_a8 + K8 * kTile;    // fp8 ring: B
  uint8_t* s_b = s_b8 + K8 * kTile;     // fp16 ring: B (64 k per stage)
  float* s_sa8 = reinterpret_cast<float*>(s_b + kS16 * kTile);
  uint8_t* s_c = reinterpret_cast<uint8_t*>(s_sa8 + K8 * kBM);
  uint64_t* full = reinterpret_cast<uint64_t*>(s_c + S::kCBytes);  // fp16 ring: converters -> consumers
  uint64_t* empty = full + kS16;                                   // fp16 ring: consumers -> converters
  uint64_t* full8 = empty + kS16;                                  // fp8 ring: TMA -> converters and consumers
  uint64_t* empty8 = full8 + K8;                                   // fp8 ring: both -> TMA

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kS16; ++s) {
      mbar_init(&full[s], 4);
      mbar_init(&empty[s], 8);
    }
    for (int s = 0; s < K8; ++s) {
      mbar_init(&full8[s], 1);
      mbar_init(&empty8[s], 12);  // 4 converter warps (B read) + 8 consumer warps (A read)
    }
    fence_mbar_init();
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
    tma_prefetch_desc(&tm_sa);
  }
  __syncthreads();
  asm volatile("griddepcontrol.wait;" ::: "memory");

  if (wg == 0) {
    setmaxnreg_dec<72>();
    const int r = threadIdx.x;  // this thread converts row r of the B tile
    const int lane = r % 32;
    const int rx = r & 7;
    BlockIter ld, cv;
    ld.start(p);
    cv.start(p);
    int ls = 0, cs = 0, s16 = 0;
    uint32_t lphase = 0, cphase = 0, phase16 = 0;
    int loaded = 0, converted = 0;
    for (; cv.valid(p); cv.next(p)) {
      if (r == 0) {
        while (loaded < converted + K8 && ld.valid(p)) {
          mbar_wait(&empty8[ls], lphase ^ 1);
          mbar_arrive_expect_tx(&full8[ls], 2 * kTile + kBM * 4);
          tma_load_2d(s_a8 + ls * kTile, &tm_a, &full8[ls], ld.kb * kBK, ld.w.mt * kBM);
          tma_load_2d(s_b8 + ls * kTile, &tm_b, &full8[ls], ld.kb * kBK, ld.w.nt * BN);
          tma_load_2d(s_sa8 + ls * kBM, &tm_sa, &full8[ls], ld.w.mt * kBM, ld.kb);
          ld.next(p);
          ++loaded;
          if (++ls == K8) {
            ls = 0;
            lphase ^= 1;
          }
        }
      }
      mbar_wait(&full8[cs], cphase);
      const uint8_t* src = s_b8 + cs * kTile + r * kRowBytes;
#pragma unroll 1
      for (int h = 0; h < 2; ++h) {
        uint4 in[4];  // in[t] = bytes 32 t + 16 h .. +15 of the row: words s' = 0..3 (k16 step 4 h + s')
#pragma unroll
        for (int t = 0; t < 4; ++t) in[t] = *reinterpret_cast<const uint4*>(src + (((2 * t + h) ^ rx) * 16));
        mbar_wait(&empty[s16], phase16 ^ 1);
        uint8_t* dst = s_b + s16 * kTile + r * kRowBytes;
#pragma unroll
        for (int sp = 0; sp < 4; ++sp) {
          uint4 lo, hi;  // fp16 chunks 2 sp (e = 0) and 2 sp + 1 (e = 1): word t from thread slot t
          const uint32_t w0 = sp == 0 ? in[0].x : sp == 1 ? in[0].y : sp == 2 ? in[0].z : in[0].w;
          const uint32_t w1 = sp == 0 ? in[1].x : sp == 1 ? in[1].y : sp == 2 ? in[1].z : in[1].w;
          const uint32_t w2 = sp == 0 ? in[2].x : sp == 1 ? in[2].y : sp == 2 ? in[2].z : in[2].w;
          const uint32_t w3 = sp == 0 ? in[3].x : sp == 1 ? in[3].y : sp == 2 ? in[3].z : in[3].w;
          conv4<kAlu>(w0, lo.x, hi.x);
          conv4<kAlu>(w1, lo.y, hi.y);
          conv4<kAlu>(w2, lo.z, hi.z);
          conv4<kAlu>(w3, lo.w, hi.w);
          *reinterpret_cast<uint4*>(dst + (((2 * sp) ^ rx) * 16)) = lo;
          *reinterpret_cast<uint4*>(dst + (((2 * sp + 1) ^ rx) * 16)) = hi;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(&full[s16]);
        if (++s16 == kS16) {
          s16 = 0;
          phase16 ^= 1;
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty8[cs]);
      ++converted;
      if (++cs == K8) {
        cs = 0;
        cphase ^= 1;
      }
    }
    return;
  }

  setmaxnreg_inc<216>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const int frag_row = warp * 16 + lane / 4;
  const int frag_col = 2 * (lane % 4);
  const int ta = lane % 4;          // A: this thread's 32-byte segment of its rows
  const int rxa = (lane / 4) & 7;   // swizzle of rows frag_row and frag_row + 8 (tile rows are 8-aligned)
  int s = 0, s8 = 0;
  uint32_t phase = 0, phase8 = 0;

  for (int u = blockIdx.x; u < p.num_units; u += gridDim.x) {
    const Unit w = decode_unit(p, u);
    const int row0 = w.mt * kBM + cw * 64;
    const int col0 = w.nt * BN;
    const float* sb_col = p.sb + (long long)(col0 / 128) * p.sb_s0;
    float total[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = 0.f;
    for (int kb = w.kb0; kb < w.kb1; ++kb) {
      float acc[kAcc];
      uint32_t a[8][4];
      const float sbv = __ldg(sb_col + kb * p.sb_s1);
      mbar_wait(&full8[s8], phase8);
      const float sa0 = s_sa8[s8 * kBM + cw * 64 + frag_row];
      const float sa1 = s_sa8[s8 * kBM + cw * 64 + frag_row + 8];
      {
        const uint8_t* ra = s_a8 + s8 * kTile + (cw * 64 + frag_row) * kRowBytes;
        const uint4 q0 = *reinterpret_cast<const uint4*>(ra + (((2 * ta) ^ rxa) * 16));
        const uint4 q1 = *reinterpret_cast<const uint4*>(ra + (((2 * ta + 1) ^ rxa) * 16));
        const uint4 q2 = *reinterpret_cast<const uint4*>(ra + 8 * kRowBytes + (((2 * ta) ^ rxa) * 16));
        const uint4 q3 = *reinterpret_cast<const uint4*>(ra + 8 * kRowBytes + (((2 * ta + 1) ^ rxa) * 16));
        const uint32_t rg[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};   // row frag_row, step s
        const uint32_t rg8[8] = {q2.x, q2.y, q2.z, q2.w, q3.x, q3.y, q3.z, q3.w};  // row frag_row + 8
#pragma unroll
        for (int st = 0; st < 8; ++st) {
          conv4<kAlu>(rg[st], a[st][0], a[st][2]);
          conv4<kAlu>(rg8[st], a[st][1], a[st][3]);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty8[s8]);  // A is in registers: the stage may be refilled
      if (++s8 == K8) {
        s8 = 0;
        phase8 ^= 1;
      }
      const int s_first = s;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mbar_wait(&full[s], phase);
        const uint64_t db = make_desc_k128_sw128(s_b + s * kTile);
        wgmma_fence();
#pragma unroll
        for (int q = 0; q < 4; ++q) wgmma_m64n128k16_f16_ra(acc, a[4 * h + q], db + 2 * q, h > 0 || q > 0);
        if (++s == kS16) {
          s = 0;
          phase ^= 1;
        }
      }
      const int s_last = s == 0 ? kS16 - 1 : s - 1;
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kAcc; ++i) reg_fence(acc[i]);
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(&empty[s_last]);
        mbar_arrive(&empty[s_first]);
      }
      const float f0 = sa0 * sbv * kBlockScale<kAlu>, f1 = sa1 * sbv * kBlockScale<kAlu>;
#pragma unroll
      for (int i = 0; i < kAcc; ++i) total[i] += acc[i] * ((i & 2) ? f1 : f0);
    }
    store_tile<BN, true, true>(p, total, s_c + cw * 64 * S::kCPitch, cw, t, frag_row, frag_col, row0, col0,
                               w.kb0 / p.kb_per_split);
  }
}

}  // namespace fp8mm
