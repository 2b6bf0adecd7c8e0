// The current device's SM count, read once a device, with a backend's one-time device setup (its kernels' shared-
// memory attributes) run before the count is first returned there. The persistent kernels launch one CTA an SM, so
// their hosts ask for this on every launch: after a device's first call, a lock and a load.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

namespace kb {

// `setup()` runs on the current device's first call, under the lock. Each call site's lambda is a type of its own,
// so each backend keeps its own table of the devices it has set up.
template <class Setup>
int sm_count_after(Setup setup) {
  static int sms[64] = {};
  static std::mutex mu;
  int dev = 0;
  cudaGetDevice(&dev);
  std::lock_guard<std::mutex> lock(mu);
  int& count = sms[dev & 63];
  if (count == 0) {
    setup();
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev);
  }
  return count;
}

inline int sm_count() {
  return sm_count_after([] {});
}

}  // namespace kb
