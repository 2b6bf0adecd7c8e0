// The stream's own 32- and 64-bit writes to device memory (cuStreamWriteValue32 / 64, stream memory operations),
// fetched through the runtime as tma_host.h fetches its encoder (no -lcuda at link time). Why: a value a captured
// graph reads from device memory (an output's address, a cache length) must be written before each replay, and a
// kernel launch for it costs the host 5-12 us at the start of a host-timed call (docs/moe-notes.md, thirtieth
// session); a stream write is one driver call. Each returns false where the driver has no such write (the caller
// then launches its kernel).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

namespace kb {

template <class Fn>
Fn driver_entry_point(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    return reinterpret_cast<Fn>(p);
  return nullptr;
}

// `value` into the 4 bytes at `at` (device memory) when the stream reaches this point
inline bool stream_write_u32(cudaStream_t stream, void* at, uint32_t value) {
  using Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  static Fn fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { fn = driver_entry_point<Fn>("cuStreamWriteValue32"); });
  return fn && fn(stream, reinterpret_cast<CUdeviceptr>(at), value, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS;
}

// `value` into the 8 bytes at `at` (device memory) when the stream reaches this point
inline bool stream_write_u64(cudaStream_t stream, void* at, uint64_t value) {
  using Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  static Fn fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { fn = driver_entry_point<Fn>("cuStreamWriteValue64"); });
  return fn && fn(stream, reinterpret_cast<CUdeviceptr>(at), value, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS;
}

}  // namespace kb
