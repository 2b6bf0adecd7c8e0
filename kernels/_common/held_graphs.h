// Captured CUDA graphs a binding launches itself, each with what it was captured on (torch-facing: included by the
// bindings' .cpp only). graph_replay.py's GraphReplay captures a call and hands the graph to the binding (on_capture);
// the binding's fast path compares a call's inputs with a held graph's and launches it in the same extension call.
// Why: the official timer starts right after a synchronize that waited for the GPU, and the host then runs 1.7-2.5x
// slower than when warm (docs/moe-notes.md, thirtieth session): the Python between the call and the launch (the key,
// the lookup, the replay) cost two to three times what a warm loop shows.
#pragma once
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <array>
#include <chrono>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "knobs.h"

namespace kb {

// A tensor as a graph depends on it, appended to `out`: address, dtype, rank, sizes, strides. Without `address`
// (a graph that takes the tensor's address each call: moving_inputs.h), only the address's alignment to 16 bytes,
// which a tensor map needs.
inline void describe_tensor(const at::Tensor& t, std::vector<int64_t>& out, bool address = true) {
  const auto at = reinterpret_cast<int64_t>(t.data_ptr());
  out.insert(out.end(), {address ? at : at % 16, static_cast<int64_t>(t.scalar_type()), t.dim()});
  out.insert(out.end(), t.sizes().begin(), t.sizes().end());
  out.insert(out.end(), t.strides().begin(), t.strides().end());
}

// Every value of `tensors` (a dict's values in its order, or a sequence's items) described; false where one is not
// a tensor.
template <class Items>
bool describe_tensors(const Items& tensors, std::vector<int64_t>& out) {
  for (const auto item : tensors) {
    PyObject* value;
    if constexpr (std::is_same_v<Items, py::dict>) {
      value = item.second.ptr();
    } else {
      value = item.ptr();
    }
    if (!THPVariable_Check(value)) return false;
    describe_tensor(THPVariable_Unpack(value), out);
  }
  return true;
}

struct HeldGraph {
  py::object owner;   // the GraphReplay that captured it: a caller with another one (a test's fresh one) gets no hit
  py::object graph;   // the torch.cuda.CUDAGraph: owns the executable graph and its memory pool
  py::object output;  // what the captured call returned (the graph's own buffers), or None
  cudaGraphExec_t exec = nullptr;
  std::vector<int64_t> inputs;  // the binding's description of the call's inputs at capture
  std::string config;           // the binding's text of the knobs at capture
  bool late = false;            // takes its output's address after the launch (late_address.h)
  bool moving = false;          // takes its inputs' addresses after the launch too (moving_inputs.h)
  py::object keep;              // what its launches read besides its pool's tensors (a moving graph's buffer)
  // (late graphs) the description of what its kernels read before they take the late address, so that it may be
  // launched once these match and the rest of `inputs` is checked behind the launch (guess); empty: never so
  std::vector<int64_t> head;
};

// The graphs of one GraphReplay (the newest capture's owner), at most as many as it keeps (its `keep`), newest
// first: a capture for another owner (a test's fresh GraphReplay) lets the previous owner's graphs and their memory
// pools go. One store a binding (held_graphs()); the GIL serialises its callers.
class HeldGraphs {
 public:
  void hold(HeldGraph held) {
    TORCH_CHECK(held.exec != nullptr && !held.inputs.empty(), "held graph: no executable graph or no inputs");
    const size_t keep = py::hasattr(held.owner, "keep") ? held.owner.attr("keep").cast<size_t>() : 2;
    const py::object owner = held.owner;
    all_.insert(all_.begin(), std::move(held));
    size_t mine = 0;
    for (auto it = all_.begin(); it != all_.end();) {
      if (it->owner.is(owner) && ++mine <= keep) {
        ++it;
      } else {
        it = all_.erase(it);
      }
    }
  }

  bool empty() const { return all_.empty(); }

  // The graph `owner` captured on exactly `inputs` with the knobs' text `config` (the callers keep it from call to
  // call: kb::KnobsMemo), moved to the front and counted; null where none.
  const HeldGraph* find(const py::object& owner, const std::vector<int64_t>& inputs, const std::string& config) {
    for (size_t i = 0; i < all_.size(); ++i) {
      if (!all_[i].owner.is(owner) || all_[i].inputs != inputs || all_[i].config != config) continue;
      if (i) std::swap(all_[0], all_[i]);
      ++replays_;
      return &all_[0];
    }
    return nullptr;
  }

  // The newest graph of `owner` that may be launched before its inputs are checked (a non-empty head, equal to
  // `head`) with the knobs' text `config`; null where none. The caller must publish its late address, or null to
  // call it off, once find() has compared the whole description (the pointer is valid until then).
  const HeldGraph* guess(const py::object& owner, const std::vector<int64_t>& head, const std::string& config) const {
    for (const HeldGraph& g : all_)
      if (g.late && !g.head.empty() && g.owner.is(owner) && g.head == head && g.config == config) return &g;
    return nullptr;
  }

  // How many graphs find() handed out since the last time this was asked (the caller's GraphReplay cannot see those
  // replays: graph_replay.GraphReplay.replayed_elsewhere).
  int64_t take_replays() {
    const int64_t n = replays_;
    replays_ = 0;
    return n;
  }

 private:
  std::vector<HeldGraph> all_;
  int64_t replays_ = 0;
};

// static: g++ marks the static local of an inline function with external linkage STB_GNU_UNIQUE (readelf shows it),
// which glibc binds to one object a process whichever module loads it, so every extension in one process (moe and
// mla-decode in one pytest run, a benchmark's --rev builds) would share one store of graphs and one replay
// count. Internal linkage gives each binding its own (binding.cpp is the one file that includes this).
static inline HeldGraphs& held_graphs() {
  static auto* held = new HeldGraphs;  // never destroyed: Python objects must not die after Python
  return *held;
}

// The host time (us) of each step of the last fast-path call, read by the benchmarks' phase tables
// (benchmarks/moe_launch_phases.py): which step the host's slowness after the official timer's synchronize lands on.
// One clock read a step (~25 ns), so always on.
class StepTimes {
 public:
  void start() {
    n_ = 0;
    first_ = last_ = std::chrono::steady_clock::now();
  }
  // `name` (a literal) took the time since start() or the previous mark.
  void mark(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    if (n_ < steps_.size()) steps_[n_++] = {name, std::chrono::duration<double, std::micro>(now - last_).count()};
    last_ = now;
  }
  // (name, us) of each step the last call passed, in order.
  std::vector<std::pair<std::string, double>> last() const {
    return {steps_.begin(), steps_.begin() + static_cast<std::ptrdiff_t>(n_)};
  }
  // When the last call's start() ran, in ns of the monotonic clock Python's time.perf_counter_ns reads (Linux):
  // the host time before the call reached the binding is the caller's window start subtracted from it.
  int64_t start_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(first_.time_since_epoch()).count();
  }

 private:
  std::array<std::pair<const char*, double>, 16> steps_{};
  size_t n_ = 0;
  std::chrono::steady_clock::time_point first_, last_;
};

static inline StepTimes& replay_steps() {  // (static: one a binding, as held_graphs())
  static StepTimes steps;
  return steps;
}

// `held`'s graph launched on the current stream.
inline void launch(const HeldGraph& held) {
  C10_CUDA_CHECK(cudaGraphLaunch(held.exec, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace kb
