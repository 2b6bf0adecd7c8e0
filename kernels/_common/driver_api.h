// Driver API functions the backends call, fetched through the runtime's entry points (so the extensions need no
// -lcuda at link time): cuTensorMapEncodeTiled (tma_host.h) and the stream's own 32- and 64-bit writes to device
// memory (cuStreamWriteValue32 / 64, stream memory operations). Why the writes: a value a captured graph reads from
// device memory (an output's address, a cache length) must be written before each replay, and a kernel launch for it
// costs the host 5-12 us at the start of a host-timed call (docs/moe-notes.md, thirtieth session); a stream write is
// one driver call.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace kb {

// The driver's `name` as a function of type Fn (its CUDA 12 version), or null where the driver has none.
template <class Fn>
Fn driver_entry_point(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    return reinterpret_cast<Fn>(p);
  return nullptr;
}

// `value` (uint32_t or uint64_t) into the 4 or 8 bytes at `at` (device memory) when the stream reaches this point;
// false where the driver has no such write (the caller then launches its kernel).
template <class T>
bool stream_write(cudaStream_t stream, void* at, T value) {
  static_assert(std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>, "a 32- or 64-bit write");
  using Fn = CUresult (*)(CUstream, CUdeviceptr, T, unsigned int);
  static const Fn fn =
      driver_entry_point<Fn>(sizeof(T) == 4 ? "cuStreamWriteValue32" : "cuStreamWriteValue64");
  return fn && fn(stream, reinterpret_cast<CUdeviceptr>(at), value, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS;
}

}  // namespace kb
