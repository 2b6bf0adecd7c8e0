"""Energy a FLOP of Hopper's warpgroup MMA as moe's grouped GEMMs issue it, with fp32 against fp16 accumulators, on
every SM at once (at the board's power cap, where moe's GEMMs run: docs/moe-notes.md, twenty-first and thirty-second
sessions).

    python benchmarks/wgmma_energy_probe.py [--seconds 3] [--rounds 2] [--record]

Why: a wgmma m64n256k16 reads and writes its 64 x 256 accumulators in the register file every k16 step, 64 KB a
warpgroup at fp32 against 10 KB of shared-memory operands, so the accumulators may be a large share of a MAC's
energy; fp16 accumulators halve them. fp16 accumulation over moe's K (7168) is too coarse for the tolerance, so the
candidate adds an fp16 chain into fp32 registers every `promote` k-64 stages; this probe prices that before any
kernel is written.

What runs: one CTA an SM (132 on an H100), two consumer warpgroups as grouped_gemm.cuh has them, a ring of 3 stages
in shared memory holding what a GEMM 1 stage holds (A: 128 rows x 64 k of x-like values, randn; B: 64 k x 256
columns, N-major, randn / sqrt(2048) like the expert weights), filled once. Each warpgroup walks the ring: wgmma
fence, 4 x m64n256k16 (its 64 A rows, the stage's B), commit, wait for all but the last group, next stage; a tile's
chain restarts every 112 stages (K = 7168). No global memory traffic after the fill, so the figures are the MMAs'
(and the promotions') alone. Variants:
  f32           fp32 accumulators (the shipped kernels' form)
  f32-zero-a    the same with every A value 0 (the eighth session's zero rows that slowed GEMM 1)
  f32-zero-wg1, f32-zero-rows, f32-ones-rows   some A rows 0 or 1.0, as padding rows would be (VARIANTS says which)
  f32-mix-ctas, f32-mix-stages   zero rows in some CTAs or some stages only: does mixing cost beyond the average?
  f16-pN        fp16 accumulators, added into fp32 every N stages (N = 112: one chain a tile, no promotion inside)
Per variant: NVML's energy counter and the host clock over back-to-back launches (benchmarks/energy.py measure),
the variants taking turns for --rounds rounds. Printed: TFLOP/s, W, median SM MHz, pJ a FLOP, the share of
samples with the power cap set. --record appends rows to benchmarks/results/moe.csv (backend wgmma-probe/VARIANT,
one stage table in the README; metrics host-loop (us a launch, the host clock over the loop) and energy (mJ a
launch)).
"""
from __future__ import annotations

import argparse
import statistics

import torch
from torch.utils.cpp_extension import load_inline

import energy
from kbench import benchlib, generator

CTAS_PER_SM, STAGES, CHAIN, STAGES_PER_LAUNCH = 1, 3, 112, 112 * 200
FLOP_PER_STAGE_CTA = 2 * 4 * 2 * 64 * 256 * 16  # warpgroups x wgmmas x (multiply + add) x m x n x k

CUDA = r"""
#include <cuda_fp16.h>
#include "sm90.cuh"
#include "wgmma.cuh"
using namespace kb::sm90;

constexpr int kStages = 3, kStageBytes = 49152, kABytes = 16384, kChain = 112;

// src [gridDim.x][kStages][kStageBytes / 2] fp16: each CTA's ring contents (the swizzle only permutes random
// values, so they are copied as they lie). sink [gridDim.x * 256]: one value a thread, so nothing is dead code.
// kPromote = 0: fp32 accumulators; else fp16 accumulators added into fp32 ones every kPromote stages.
template <int kPromote>
__global__ void __launch_bounds__(256, 1) burn(const uint4* src, int stages, float* sink) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint4* mine = src + size_t(blockIdx.x) * (kStages * kStageBytes / 16);
  for (int i = threadIdx.x; i < kStages * kStageBytes / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(base)[i] = mine[i];
  fence_proxy_async_smem();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  float acc[128];
  uint32_t half_acc[64];
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  for (int i = 0; i < 64; ++i) half_acc[i] = 0u;
  float kept = 0.f;
  for (int it = 0; it < stages; ++it) {
    const int s = it % kStages, in_chain = it % kChain;
    const uint64_t da = make_desc_sw128(base + s * kStageBytes + wg * 8192);
    const uint64_t db = make_desc_sw128(base + s * kStageBytes + kABytes, 8192, 1024);
    wgmma_fence();
    if constexpr (kPromote == 0) {
      for (int q = 0; q < 4; ++q)
        wgmma_m64n256k16_f16<1>(acc, da + 2 * q, db + (2048 >> 4) * q, in_chain > 0 || q > 0);
      wgmma_commit();
      wgmma_wait<1>();
    } else {
      const bool fresh = in_chain % kPromote == 0;
      for (int q = 0; q < 4; ++q)
        wgmma_m64n256k16_f16_f16acc<1>(half_acc, da + 2 * q, db + (2048 >> 4) * q, !fresh || q > 0);
      wgmma_commit();
      if ((in_chain + 1) % kPromote == 0 || in_chain + 1 == kChain) {
        wgmma_wait<0>();
        for (int i = 0; i < 64; ++i) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&half_acc[i]));
          acc[2 * i] += f.x;
          acc[2 * i + 1] += f.y;
        }
      } else {
        wgmma_wait<1>();
      }
    }
    if (in_chain + 1 == kChain) {  // a tile's end: its sums leave, the next chain starts from zero
      wgmma_wait<0>();
      for (int i = 0; i < 128; ++i) {
        kept += acc[i];
        if constexpr (kPromote != 0) acc[i] = 0.f;
      }
    }
  }
  wgmma_wait<0>();
  sink[blockIdx.x * 256 + threadIdx.x] = kept;
}

template <int kPromote>
void launch(torch::Tensor src, torch::Tensor sink, int64_t stages) {
  const int smem = kStages * kStageBytes + 1024;
  cudaFuncSetAttribute(burn<kPromote>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  burn<kPromote><<<sink.numel() / 256, 256, smem, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const uint4*>(src.data_ptr()), int(stages), sink.data_ptr<float>());
}

void run(torch::Tensor src, torch::Tensor sink, int64_t stages, int64_t promote) {
  switch (promote) {
    case 0: return launch<0>(src, sink, stages);
    case 1: return launch<1>(src, sink, stages);
    case 2: return launch<2>(src, sink, stages);
    case 4: return launch<4>(src, sink, stages);
    case 8: return launch<8>(src, sink, stages);
    case 16: return launch<16>(src, sink, stages);
    case 112: return launch<112>(src, sink, stages);
    default: TORCH_CHECK(false, "wgmma_energy_probe: promote must be 0, 1, 2, 4, 8, 16 or 112, not ", promote);
  }
}
"""

# name -> (promote, what A holds): "randn" everywhere, "zero" everywhere, or randn with some rows replaced:
# "zero-wg1" the second warpgroup's 64 rows (a half tile past its group's end, not skipped), "zero-rows" / "ones-rows"
# the last 32 rows of each warpgroup's 64 (padding rows inside a computed half: zeros, or the eighth session's 1.0)
# "mix-ctas": zero-rows in every other CTA, randn in the rest (SMs on padded tiles beside SMs on full ones);
# "mix-stages": zero-rows in each CTA's first ring stage only (padded and full stages in turn on one SM)
VARIANTS = {"f32": (0, "randn"), "f32-zero-a": (0, "zero"), "f32-zero-wg1": (0, "zero-wg1"),
            "f32-zero-rows": (0, "zero-rows"), "f32-ones-rows": (0, "ones-rows"),
            "f32-mix-ctas": (0, "mix-ctas"), "f32-mix-stages": (0, "mix-stages"),
            **{f"f16-p{n}": (n, "randn") for n in (1, 2, 4, 8, 16, 112)}}


def ring_contents(ctas: int, fill: str) -> torch.Tensor:
    """[ctas, STAGES, 24576] fp16: per stage 8192 A values (128 rows of 64 k: row r is values [64 r, 64 r + 64), the
    swizzle moves 16-byte pieces within a row only), filled as VARIANTS' comment says, then 16384 B values
    (randn / sqrt(2048))."""
    stage_a = torch.randn(ctas, STAGES, 128, 64, device="cuda").half()
    if fill == "zero":
        stage_a.zero_()
    elif fill == "zero-wg1":
        stage_a[:, :, 64:] = 0
    elif fill in ("zero-rows", "ones-rows", "mix-ctas", "mix-stages"):
        ctas_at = slice(1, None, 2) if fill == "mix-ctas" else slice(None)
        stages_at = slice(0, 1) if fill == "mix-stages" else slice(None)
        for wg in range(2):
            stage_a[ctas_at, stages_at, 64 * wg + 32:64 * wg + 64] = 1 if fill == "ones-rows" else 0
    stage_a = stage_a.reshape(ctas, STAGES, 8192)
    stage_b = torch.randn(ctas, STAGES, 16384, device="cuda").half() / 2048 ** 0.5
    return torch.cat([stage_a, stage_b], dim=2).contiguous()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="each variant's loop a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    parser.add_argument("--record", action="store_true", help="append rows to benchmarks/results/moe.csv")
    args = parser.parse_args()
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"wgmma_energy_probe: unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    ext = load_inline("kbench_wgmma_energy_probe", cpp_sources="void run(torch::Tensor src, torch::Tensor sink, "
                      "int64_t stages, int64_t promote);",
                      cuda_sources="#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n" + CUDA,
                      functions=["run"], extra_include_paths=[str(generator.SHIPPED / "_common")],
                      extra_cuda_cflags=["-gencode=arch=compute_90a,code=sm_90a", "-O3"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = sms * CTAS_PER_SM
    sink = torch.empty(ctas * 256, device="cuda")
    inputs = {fill: ring_contents(ctas, fill) for fill in dict.fromkeys(VARIANTS[v][1] for v in chosen)}
    calls = {v: (lambda v=v: ext.run(inputs[VARIANTS[v][1]], sink, STAGES_PER_LAUNCH, VARIANTS[v][0]))
             for v in chosen}
    for v in chosen:  # a launch each first: an error surfaces here, not inside the timed loop
        calls[v]()
    torch.cuda.synchronize()
    counter = energy.EnergyCounter()
    runs = {v: [] for v in chosen}
    clocks = {v: [] for v in chosen}
    for _ in range(args.rounds):
        for v in chosen:
            runs[v].append(energy.measure(calls[v], counter, args.seconds, clocks=clocks[v]))
    flop = FLOP_PER_STAGE_CTA * ctas * STAGES_PER_LAUNCH
    gpu = torch.cuda.get_device_name(0)
    case = "dhidden: 7168; dexpert: 2048"  # the GEMM 1 stages the probe's ring mimics (rows take the problem's keys)
    lines, rows = [], []
    for v in chosen:
        mj, us, watts = (statistics.mean(r[i] for r in runs[v]) for i in range(3))
        mhz, capped, _ = energy.clock_summary(clocks[v])
        lines.append([v, f"{flop / us / 1e6:.0f}", f"{watts:.0f}", f"{mhz:.0f}", f"{mj * 1e9 / flop:.3f}",
                      f"{capped:.0%}", f"{us:.0f}"])
        rows += [benchlib.Row(gpu, 1, f"wgmma-probe/{v}", "host-loop", case, us),
                 benchlib.Row(gpu, 1, f"wgmma-probe/{v}", "energy", case, mj)]
    benchlib.table(f"wgmma energy probe, {gpu}, {ctas} CTAs, {args.rounds} rounds of {args.seconds:.0f} s",
                   ["variant", "TFLOP/s", "W", "SM MHz", "pJ/FLOP", "power cap", "us a launch"], lines)
    if args.record:
        print("recorded in", benchlib.record("moe", rows))


if __name__ == "__main__":
    main()
