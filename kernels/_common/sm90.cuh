// Hopper (sm_90a) PTX the kbench kernels share: mbarriers, TMA tile loads, clusters, wgmma fences and
// shared-memory matrix descriptors, register budgets, named barriers, proxy fences, the dependent launch's wait and
// system-scope flags.
// No torch, no CUTLASS: compiles standalone with nvcc. Backends include it through kernel.yml
// `include_dirs: [../../_common]`.
#pragma once
#include <cstdint>
#include <cuda.h>  // CUtensorMap (a 128-byte opaque struct); no driver symbols are linked from device code

namespace kb {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier -------------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Arrive once and announce how many bytes the TMA copies of this phase will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// Spin until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// The next stage of a ring of `stages` mbarrier-guarded buffers: the parity a waiter expects flips each time the
// ring wraps around.
__device__ __forceinline__ void ring_next(int& s, uint32_t& phase, int stages) {
  if (++s == stages) {
    s = 0;
    phase ^= 1;
  }
}

// ---- TMA ------------------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// 2-D tile load global -> shared (c0: inner coordinate, c1: outer); completion is signalled on `bar` as bytes.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// ---- clusters -------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of the cluster's CTAs, warps converged (release / acquire at cluster scope).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The shared::cluster address of CTA `rank`'s shared memory at the offset `local` has in this CTA.
__device__ __forceinline__ uint32_t mapa_shared(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

// ---- wgmma bookkeeping ----------------------------------------------------------------------------------
// Orders prior register/shared accesses before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// A consumer warp hands back the ring stage its previous wgmma group read: once at most the group just committed is
// in flight (with nothing in flight the wait returns at once), lane 0 arrives on that stage's empty barrier.
__device__ __forceinline__ void release_after_wgmma(uint64_t* empty_bar, int lane) {
  wgmma_wait<1>();
  __syncwarp();
  if (lane == 0) mbar_arrive(empty_bar);
}

// 2^x with one MUFU.EX2 (ex2.approx.ftz: ~2 ulp, denormal results flushed to 0, 2^-inf = 0). exp2f without
// --use_fast_math wraps the MUFU in a range fix-up (3 more instructions), which an online softmax does not need.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Keep the compiler from moving accumulator reads/writes across an in-flight wgmma.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Shared-memory matrix descriptor of a tile written by TMA with CU_TENSOR_MAP_SWIZZLE_128B into a 1024-byte
// aligned buffer whose rows are exactly 128 bytes.
//  K-major operand (rows = M or N, 128 bytes of K each): 8-row core groups are 1024 bytes apart (SBO); the
//    leading byte offset is unused. Advancing K by 16 bytes adds 1 to the address field.
//  MN-major operand (rows = K, 128 bytes = 64 16-bit elements of M/N each, in chunks of 64 M/N): LBO is the
//    distance between two 64-wide M/N chunks, SBO the distance between 8-row groups of K (1024). Advancing K by
//    16 rows adds 2048 bytes. (CUTLASS's canonical MN-major SW128 layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)).)
__device__ __forceinline__ uint64_t make_desc_swizzled(const void* smem_tile, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                       uint32_t swizzle) {
  const uint64_t addr = smem_u32(smem_tile);
  uint64_t desc = 0;
  desc |= (addr & 0x3FFFF) >> 4;                       // bits 0-13: start address / 16
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;   // bits 16-29: LBO / 16
  desc |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;   // bits 32-45: SBO / 16
  desc |= uint64_t(swizzle) << 62;                     // bits 62-63: 1 = 128-byte swizzle, 2 = 64-byte
  return desc;
}
__device__ __forceinline__ uint64_t make_desc_sw128(const void* smem_tile, uint32_t lbo_bytes = 16,
                                                    uint32_t sbo_bytes = 1024) {
  return make_desc_swizzled(smem_tile, lbo_bytes, sbo_bytes, 1);
}

// The same for a K-major tile written with CU_TENSOR_MAP_SWIZZLE_64B into rows of exactly 64 bytes (32 16-bit
// elements of K): 8-row core groups are 512 bytes apart (SBO; LBO unused for a swizzled K-major operand); advancing
// K by 16 elements (32 bytes) adds 2 to the address field, as in the 128-byte layout.
__device__ __forceinline__ uint64_t make_desc_sw64(const void* smem_tile) {
  return make_desc_swizzled(smem_tile, 16, 512, 2);
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` inside a 128B-swizzled tile of 128-byte rows (what
// TMA writes and wgmma reads): the chunk index is XORed with the row's position in its 8-row group.
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Four 8x8 matrices of 16-bit elements from a warp's registers into shared memory in one instruction: register j
// of lane l holds matrix j's row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (the layout of a wgmma accumulator's
// rows and column pairs); lane l gives the address of row l % 8 of matrix l / 8 (16 bytes a row).
__device__ __forceinline__ void stmatrix_x4(void* row, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_u32(row)), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// stmatrix_x4's inverse: the four matrices back into registers, the same lanes giving the same row addresses.
__device__ __forceinline__ void ldmatrix_x4(const void* row, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(row))
               : "memory");
}

// ldmatrix_x4 with each 8x8 matrix transposed (a row-major [k][n] tile read as mma.sync's column-major B).
__device__ __forceinline__ void ldmatrix_x4_trans(const void* row, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(row))
               : "memory");
}

// Generic-proxy writes to shared memory (st.shared, stmatrix) that wgmma or TMA read next: each writing thread
// fences before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The global timer in ns (beside clock64, a trace's SM clock: cycles over ns).
__device__ __forceinline__ long long global_ns() {
  long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// 16 bytes global -> shared through the load/store units (no registers, no TMA unit), L1 bypassed; completion by
// cp_async_wait_all after cp_async_commit.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// A bulk copy of bytes (a multiple of 16, both addresses 16-byte aligned) from global to shared memory; the bytes
// complete the transaction count of `bar` (arm it with mbar_arrive_expect_tx first).
__device__ __forceinline__ void bulk_load_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// A bulk copy of bytes (a multiple of 16, both addresses 16-byte aligned) from shared to global memory, in this
// thread's bulk group; the thread waits for the copy's reads of shared memory (not for its writes to land) before the
// buffer may change or the CTA exit. The source's generic-proxy writes need fence_proxy_async_smem first.
__device__ __forceinline__ void bulk_store_s2g(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// ---- register budget per warpgroup ------------------------------------------------------------------------
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}

// Named barrier among `count` threads (ids 1..15; id 0 is __syncthreads).
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Arrive on a named barrier without waiting (the other side of a bar.sync with the same id and count).
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// ---- programmatic dependent launch (a launch with cudaLaunchAttributeProgrammaticStreamSerialization) --------
// Wait until the grids this one depends on have completed and their writes are visible.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// ---- flags between GPUs (system scope) ------------------------------------------------------------------
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Spin until the epoch at *p (written by one peer with st_release_sys, only ever growing) has reached v. "Reached",
// not "equals": a fast peer may already have stamped epoch v + 1 (its next call) before this rank reads the word,
// and its data for epoch v is complete either way. The signed difference keeps this right across a wrap.
__device__ __forceinline__ void wait_flag_sys(const uint32_t* p, uint32_t v) {
  while (static_cast<int32_t>(ld_acquire_sys(p) - v) < 0) {
  }
}

}  // namespace sm90
}  // namespace kb
