"""CPU tier: a moving graph's capture bookkeeping (kernels/_common/moving_inputs.h, MovingCapture), compiled with the
host compiler against the CUDA headers: each bound map gets its own 128-byte-aligned slot of the device buffer in
the order the launches bind them, each input's table word is where the take kernel writes it, and a capture with
too many maps, an unknown input or a misaligned buffer is refused. (The take kernel itself runs in the GPU tier:
tests/test_mla_cuda_gpu.py, test_a_moving_graph_follows_inputs_new_every_call.)"""
import shutil
import subprocess
from pathlib import Path

import pytest

from host_cpp import ROOT, build_program


def _cuda_include() -> Path | None:
    """The CUDA toolkit's headers (cuda.h), where the machine has them."""
    nvcc = shutil.which("nvcc")
    for root in ([Path(nvcc).resolve().parent.parent] if nvcc else []) + [Path("/usr/local/cuda")]:
        if (root / "include" / "cuda.h").is_file():
            return root / "include"
    return None


PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include "moving_inputs.h"
using namespace kb;
#define EXPECT(c) do { if (!(c)) { printf("failed: %s (line %d)\n", #c, __LINE__); return 1; } } while (0)
template <class F> bool throws(F f) { try { f(); } catch (const std::runtime_error&) { return true; } return false; }
alignas(128) static unsigned char device[sizeof(MovingBuffer) + 128];  // stands in for the graph's buffer
int main() {
  MovingBuffer* b = reinterpret_cast<MovingBuffer*>(device);
  MovingCapture capture(device);
  EXPECT(capture.maps() == 0);
  CUtensorMap map;
  std::memset(&map, 0x5a, sizeof(map));
  const CUtensorMap* first = capture.bind(map, 1);
  const CUtensorMap* second = capture.bind(map, 6, 4096);
  EXPECT(first == &b->bound[0] && second == &b->bound[1] && capture.maps() == 2);
  EXPECT(reinterpret_cast<uintptr_t>(first) % 128 == 0 && reinterpret_cast<uintptr_t>(second) % 128 == 0);
  EXPECT(capture.slot(0) == reinterpret_cast<void* const*>(&b->table[0]));
  EXPECT(capture.slot(7) == reinterpret_cast<void* const*>(&b->table[7]));
  EXPECT(throws([&] { capture.slot(kMovingInputs); }) && throws([&] { capture.bind(map, -1); }));
  for (int i = 2; i < kMovingMaps; ++i) EXPECT(capture.bind(map, 0) == &b->bound[i]);
  EXPECT(throws([&] { capture.bind(map, 0); }) && capture.maps() == kMovingMaps);  // one too many
  EXPECT(throws([&] { MovingCapture misaligned(device + 64); }));
  const MovingTake take = capture.take(LateAddress{});
  EXPECT(take.buffer == b);
  EXPECT(sizeof(MovingBuffer) == kMovingBufferBytes && offsetof(MovingBuffer, bound) == 0);
  printf("ok\n");
  return 0;
}
"""


def test_moving_capture_bookkeeping(tmp_path):
    include = _cuda_include()
    if include is None:
        pytest.skip("no CUDA toolkit headers (cuda.h) on this machine")
    exe = build_program(tmp_path, PROGRAM, ROOT / "kernels" / "_common", include)
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
