// What every backend's host side hands its binding after enqueueing kernels: nullptr, or one line naming what failed.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>

namespace kb {

// The last launch's error as "<what>: launch failed: <CUDA's reason>" (valid until this thread's next call), or nullptr.
inline const char* launch_error(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return nullptr;
  static thread_local char msg[256];
  snprintf(msg, sizeof(msg), "%s: launch failed: %s", what, cudaGetErrorString(err));
  return msg;
}

}  // namespace kb
