// Torch-facing side of the moe CUDA backend: checks shapes and dtypes, takes the workspaces from the caching
// allocator (no cudaMalloc after the first call of a shape), hands raw pointers to moe.cu. The only file that sees
// torch.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "held_graphs.h"
#include "knobs.h"
#include "late_rings.h"
#include "moe_api.h"
#include "torch_check.h"

namespace {

void check_weights(const std::vector<torch::Tensor>& ws, int64_t rows, int64_t cols, const char* what) {
  for (const auto& w : ws) {
    KB_CHECK(w.is_cuda() && w.scalar_type() == at::kHalf && w.is_contiguous() && w.dim() == 2 &&
                 w.size(0) == rows && w.size(1) == cols,
             "moe_forward: every %s weight must be a contiguous fp16 CUDA tensor [%lld, %lld]", what,
             static_cast<long long>(rows), static_cast<long long>(cols));
  }
}

struct Workspaces {
  torch::Tensor meta, rows_pair, pair_row, route_hist, xs, h, y;
};

// y only without red_combine (GEMM 2 then adds into the output instead: 587 MB less at 8192 tokens).
Workspaces make_workspaces(const torch::Tensor& x, int64_t T, int64_t K, int64_t E, int64_t d, int64_t dexp,
                           const MoeConfig& config) {
  const auto i32 = x.options().dtype(torch::kInt);
  const int64_t y_rows = config.red_combine ? 0 : T * K + T;
  return Workspaces{torch::empty({2 * (E + 2)}, i32), torch::empty({T * K}, i32), torch::empty({T * K}, i32),
                    torch::empty({moe_route_hist_rows(static_cast<int>(T * K)) * E}, i32),
                    torch::empty({T * K, d}, x.options()),
                    torch::empty({T * K + T, dexp}, x.options()), torch::empty({y_rows, d}, x.options())};
}

// The call's workspaces. keep: the last shape's stay allocated per device and are reused by the next call of the
// same shape and configuration (stream-ordered on the current stream, so calls on one stream never overlap in
// them); otherwise new ones from the caching allocator, released when the call returns (the shipped default).
Workspaces workspaces(const torch::Tensor& x, int64_t T, int64_t K, int64_t E, int64_t d, int64_t dexp,
                      const MoeConfig& config) {
  if (!config.keep_workspaces) return make_workspaces(x, T, K, E, d, dexp, config);
  static std::mutex mu;
  // device -> (shape, workspaces); never destroyed: tensors freed after the CUDA context at exit would fail
  static auto* kept = new std::map<int, std::pair<std::vector<int64_t>, Workspaces>>();
  const std::vector<int64_t> shape{T, K, E, d, dexp, config.red_combine};
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*kept)[x.get_device()];
  if (slot.first != shape) {
    slot.second = Workspaces{};  // the previous shape's memory goes back to the allocator first
    slot.second = make_workspaces(x, T, K, E, d, dexp, config);
    slot.first = shape;
  }
  return slot.second;
}

// red_combine's output slot: x's device's late rings (late_rings.h). Its word holds the address of the output GEMM 2
// adds into, `published` the address last written there (so moe_experts can refuse an output that was not
// published). With late_output, the graphs the binding launches take that address from ring 0 after their launch.
// Made by the first eager call (moe_output runs before any capture).
kb::LateRings& output_slot(const torch::Tensor& like) { return *kb::late_rings(like, {2}); }

// Whether moe_replay launches held graphs (else entry.py's Python path replays them).
bool fast_replay_on() {
  return !kb::env_is("KBENCH_MOE_FAST_REPLAY", "0") && !kb::env_is("KBENCH_MOE_GRAPH", "0") &&
         !kb::env_is("KBENCH_MOE_FULL_KEY", "1") && !kb::env_is("KBENCH_MOE_PY_KEY", "1");
}

// Whether the graph captured last takes its output's address late (run_moe sets it in each capture, moe_hold_graph
// reads it): such a graph must be launched only by moe_replay, which publishes the address.
bool last_capture_late = false;

// A new output [T, d] fp16 whose address is written to x's device's slot on the current stream.
torch::Tensor publish_output(const torch::Tensor& x, kb::LateRings& slot) {
  torch::Tensor out = torch::empty({x.size(0), x.size(1)}, x.options());
  const char* err = moe_publish_output(reinterpret_cast<void**>(slot.word.data_ptr()), out.data_ptr(),
                                       c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, err ? err : "");
  slot.published = out.data_ptr();
  return out;
}

// x [T, d] fp16 and every expert's weights, for K experts a token.
void check_layer(const torch::Tensor& x, int64_t K, const std::vector<torch::Tensor>& gate,
                 const std::vector<torch::Tensor>& up, const std::vector<torch::Tensor>& down) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kHalf && x.dim() == 2, "moe_forward: x must be fp16 [T, d]");
  TORCH_CHECK(gate.size() == up.size() && up.size() == down.size() && gate.size() >= 2,
              "moe_forward: pass gate, up and down of every routed expert, then of the shared expert");
  const int64_t T = x.size(0), d = x.size(1);
  const int64_t E = static_cast<int64_t>(gate.size()) - 1, dexp = gate[0].size(1);
  const char* why = moe_supported(static_cast<int>(T), static_cast<int>(K), static_cast<int>(E),
                                  static_cast<int>(d), static_cast<int>(dexp));
  TORCH_CHECK(why == nullptr, why ? why : "");
  check_weights(gate, d, dexp, "gate");
  check_weights(up, d, dexp, "up");
  check_weights(down, dexp, d, "down");
}

// MoeArgs' fields that follow from x (contiguous [T, d]), the weights, K, the workspaces and the configuration: what
// moe_run and moe_run_shared_gemm1 both read. The routing inputs and the output are the caller's.
MoeArgs layer_args(const torch::Tensor& x, const std::vector<torch::Tensor>& gate,
                   const std::vector<torch::Tensor>& up, const std::vector<torch::Tensor>& down, int64_t K,
                   const Workspaces& ws, const MoeConfig& config) {
  const int64_t E = static_cast<int64_t>(gate.size()) - 1;
  MoeArgs a{};
  a.x = x.data_ptr();
  for (int64_t g = 0; g <= E; ++g) {
    a.w_gate[g] = gate[g].data_ptr();
    a.w_up[g] = up[g].data_ptr();
    a.w_down[g] = down[g].data_ptr();
  }
  a.T = static_cast<int>(x.size(0));
  a.K = static_cast<int>(K);
  a.E = static_cast<int>(E);
  a.d = static_cast<int>(x.size(1));
  a.dexp = static_cast<int>(gate[0].size(1));
  a.meta = ws.meta.data_ptr<int>();
  a.rows_pair = ws.rows_pair.data_ptr<int>();
  a.pair_row = ws.pair_row.data_ptr<int>();
  a.xs = ws.xs.data_ptr();
  a.h = ws.h.data_ptr();
  a.y = ws.y.data_ptr();
  a.route_hist = ws.route_hist.data_ptr<int>();
  a.skip_empty_halves = config.skip_empty_halves;
  a.stages = config.stages;
  a.split_route = config.split_route;
  a.async_epilogue = config.async_epilogue;
  a.shared_gather = config.shared_gather;
  a.gather_lsu = config.gather_lsu;
  a.band = config.band;
  a.bk32 = config.bk32;
  a.decode_ahead = config.decode_ahead;
  return a;
}

}  // namespace

// x [T, d] fp16; experts [T, K] int64 and scores [T, K] fp16 (torch.topk of the router's softmax); gate, up
// [d, dexp] and down [dexp, d] fp16 per routed expert, then the shared expert's three. Returns out [T, d] fp16, or
// (combine false) Y [T*K + T, d] fp16, the experts' outputs before the weighted sum (moe_combine makes out from it).
// With red_combine there is no Y: moe_experts (combine false) adds into `published`, the tensor moe_output returned
// (checked against the slot), and returns an undefined tensor.
// stage_ms (dev builds): filled with the five stages' times (route, gather, GEMM 1, GEMM 2, combine) when given.
// pre (moe_layer): the workspaces whose H rows of the shared expert moe_run_shared_gemm1 already wrote; the caller
// has checked x and the weights then.
static torch::Tensor run_moe(torch::Tensor x, torch::Tensor experts, torch::Tensor scores,
                             std::vector<torch::Tensor> gate, std::vector<torch::Tensor> up,
                             std::vector<torch::Tensor> down, std::vector<double>* stage_ms, bool combine,
                             const c10::optional<torch::Tensor>& published = c10::nullopt,
                             const Workspaces* pre = nullptr, const MoeConfig* chosen = nullptr,
                             const torch::Tensor* logits = nullptr) {
  TORCH_CHECK(experts.scalar_type() == at::kLong && scores.scalar_type() == at::kHalf && experts.dim() == 2 &&
                  scores.sizes() == experts.sizes() && experts.size(0) == x.size(0),
              "moe_forward: experts (int64) and scores (fp16) must both be [T, K]");
  if (!pre) check_layer(x, experts.size(1), gate, up, down);
  const int64_t T = x.size(0), d = x.size(1), K = experts.size(1);
  const int64_t E = static_cast<int64_t>(gate.size()) - 1, dexp = gate[0].size(1);
  const c10::cuda::CUDAGuard guard(x.device());
  x = x.contiguous();
  experts = experts.contiguous();
  scores = scores.contiguous();

  // moe_layer passes the configuration its shared-expert launch used (pre's workspaces were made for it)
  const MoeConfig config = chosen ? *chosen : moe_config(static_cast<int>(T), static_cast<int>(K), static_cast<int>(E));
  kb::print_config_once([&](char* buf, int size) {
    const int len = snprintf(buf, size, "moe_forward T=%lld K=%lld E=%lld: ", (long long)T, (long long)K,
                             (long long)E);
    moe_describe(config, buf + len, size - len);
  });
  const Workspaces ws = pre ? *pre : workspaces(x, T, K, E, d, dexp, config);
  torch::Tensor out;
  kb::LateRings* const slot = config.red_combine ? &output_slot(x) : nullptr;
  if (slot) {
    if (combine) {
      out = publish_output(x, *slot);
    } else {
      TORCH_CHECK(published.has_value() && published->defined() && published->sizes() == x.sizes() &&
                      published->scalar_type() == at::kHalf && published->data_ptr() == slot->published,
                  "moe_experts: with KBENCH_MOE_RED_COMBINE=1 pass the [T, d] tensor moe_output just returned");
    }
  } else if (combine) {
    out = torch::empty({T, d}, x.options());
  }

  MoeArgs a = layer_args(x, gate, up, down, K, ws, config);
  a.experts = experts.data_ptr<int64_t>();
  a.scores = scores.data_ptr();
  a.logits = logits ? logits->data_ptr() : nullptr;  // then moe_run writes experts and scores
  a.out = combine ? out.data_ptr() : nullptr;
  a.out_slot = slot ? reinterpret_cast<void* const*>(slot->word.data_ptr()) : nullptr;
  a.shared_done = pre != nullptr;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusActive) {
    // a graph moe_replay will launch takes its output's address after the launch; one the Python path replays reads
    // the slot the host wrote before it
    last_capture_late = slot && !combine && config.late_output && fast_replay_on();
    if (last_capture_late) a.late = slot->rings[0]->view();
  }
  cudaEvent_t events[6];
  if (stage_ms)
    for (auto& e : events) cudaEventCreate(&e);
  const char* err = moe_run(a, stream, stage_ms ? events : nullptr);
  if (stage_ms) {
    cudaEventSynchronize(events[5]);
    for (int i = 0; i < 5; ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, events[i], events[i + 1]);
      stage_ms->push_back(ms);
    }
    for (auto& e : events) cudaEventDestroy(e);
  }
  TORCH_CHECK(err == nullptr, err ? err : "");
  if (combine) return out;
  return config.red_combine ? torch::Tensor() : ws.y;
}

torch::Tensor moe_forward(torch::Tensor x, torch::Tensor experts, torch::Tensor scores,
                          std::vector<torch::Tensor> gate, std::vector<torch::Tensor> up,
                          std::vector<torch::Tensor> down) {
  return run_moe(x, experts, scores, gate, up, down, nullptr, true);
}

// The output of the next moe_experts call when GEMM 2 adds into it (MoeConfig::red_combine): a new [T, d] fp16
// tensor whose address goes to the device slot the kernels read (so a captured graph serves it), zeroed by that
// call's gather. None otherwise (moe_combine makes the output after moe_experts). x [T, d] fp16, as moe_experts'.
c10::optional<torch::Tensor> moe_output(torch::Tensor x, int64_t K, int64_t E) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kHalf && x.dim() == 2, "moe_output: x must be fp16 [T, d]");
  if (!moe_config(static_cast<int>(x.size(0)), static_cast<int>(K), static_cast<int>(E)).red_combine)
    return c10::nullopt;
  const c10::cuda::CUDAGuard guard(x.device());
  return publish_output(x, output_slot(x));
}

// moe_output's result and the graph's launch key in one call, for entry.py's replay path: the addresses of x and of
// every tensor in `weights` (the dict's order) as bytes, 8 a tensor. Walking the 100 weights here instead of through
// Python's data_ptr() each, and one call instead of two, is host time inside the official window (the key took 14-25
// us on the GPU machines' hosts; docs/moe-notes.md, twenty-ninth session). x [T, d] fp16; weights: name -> tensor.
std::tuple<c10::optional<torch::Tensor>, py::bytes> moe_prepare(torch::Tensor x, py::dict weights, int64_t K,
                                                               int64_t E) {
  std::string key(8 * (1 + weights.size()), '\0');
  char* at = key.data();
  const auto put = [&](const void* address) {
    std::memcpy(at, &address, 8);
    at += 8;
  };
  put(x.data_ptr());
  for (const auto item : weights) {
    TORCH_CHECK(THPVariable_Check(item.second.ptr()), "moe_prepare: every value of the weights dict must be a tensor");
    put(THPVariable_Unpack(item.second.ptr()).data_ptr());
  }
  return {moe_output(x, K, E), py::bytes(key)};
}

// ---- entry.py's fast path: a held graph launched from here (_common/held_graphs.h says why) ----

namespace {

// What a moe graph depends on: device, K, E, the number of weights, then x and the weights (the dict's order)
// described; false where a weight is not a tensor.
bool describe_inputs(const torch::Tensor& x, const py::dict& weights, int64_t K, int64_t E, std::vector<int64_t>& out) {
  out.clear();
  out.insert(out.end(), {x.get_device(), K, E, static_cast<int64_t>(weights.size())});
  kb::describe_tensor(x, out);
  return kb::describe_tensors(weights, out);
}

// What a moe graph reads before its late take (the router's GEMM: x and the router weight), described as
// describe_inputs describes them; false where there is no tensor "router.weight".
bool describe_head(const torch::Tensor& x, const py::dict& weights, int64_t K, int64_t E, std::vector<int64_t>& out) {
  out.clear();
  out.insert(out.end(), {x.get_device(), K, E, static_cast<int64_t>(weights.size())});
  kb::describe_tensor(x, out);
  PyObject* router = PyDict_GetItemString(weights.ptr(), "router.weight");  // (borrowed)
  if (!router || !THPVariable_Check(router)) return false;
  kb::describe_tensor(THPVariable_Unpack(router), out);
  return true;
}

// KBENCH_MOE_SPECULATE (on): moe_replay launches the held graph whose head matches before describing and comparing
// all 101 inputs (~25 us of host time at 2048 tokens, right after the timer's synchronize), and calls it off (a null
// output address: GemmParams::abort_slot) where the whole comparison then picks another or none.
bool speculate_on() { return kb::env_int("KBENCH_MOE_SPECULATE", 1) != 0; }

// The configuration a launch would take for T tokens (its knobs as read now)
MoeConfig config_for_shape(int64_t T, int64_t K, int64_t E) {
  return moe_config(static_cast<int>(T), static_cast<int>(K), static_cast<int>(E));
}

// A configuration as text, what a held graph is keyed by (moe_describe lists every field, so a knob added to MoeConfig
// is compared without touching this).
std::string config_text(const MoeConfig& c) {
  char buf[512];
  moe_describe(c, buf, sizeof buf);
  return buf;
}

}  // namespace

// entry.py, after GraphReplay captured the call (red_combine only: the graph adds into the output the slot names):
// `graph` (its cudaGraphExec_t as an integer, `exec`) held for moe_replay. Returns whether it takes its output's
// address late (then only moe_replay may launch it: GraphReplay drops its own copy).
bool moe_hold_graph(py::object owner, py::object graph, int64_t exec, torch::Tensor x, py::dict weights, int64_t K,
                    int64_t E) {
  kb::HeldGraph held{owner, graph, py::none(), reinterpret_cast<cudaGraphExec_t>(exec), {}, {}};
  TORCH_CHECK(describe_inputs(x, weights, K, E, held.inputs), "moe_hold_graph: every weight must be a tensor");
  const MoeConfig c = config_for_shape(x.numel() / x.size(-1), K, E);
  held.config = config_text(c);
  const bool late = held.late = last_capture_late;
  last_capture_late = false;
  // speculation is safe where nothing before the late take reads an input the head does not describe: the shared
  // expert's GEMM 1 runs after the routing (shared_gather), not before the router (shared_first alone)
  if (late && (c.shared_gather || !c.shared_first) && !describe_head(x, weights, K, E, held.head)) held.head.clear();
  kb::held_graphs().hold(std::move(held));
  return late;
}

// The fast path of custom_kernel: where `owner` holds a graph captured on these very inputs (the same tensors'
// addresses, dtypes, shapes and strides, K, E and knobs), a new output (x's shape) published to the slot and the
// graph launched on the current stream (late_output: launched first, then the output made and its address handed to
// the graph's routing through the late ring); else None (entry.py's own path runs). Off with KBENCH_MOE_FAST_REPLAY=0
// and on the paths that key the graph in Python (KBENCH_MOE_GRAPH=0, KBENCH_MOE_FULL_KEY=1, KBENCH_MOE_PY_KEY=1).
c10::optional<torch::Tensor> moe_replay(py::object owner, torch::Tensor x, py::dict weights, int64_t K, int64_t E) {
  kb::StepTimes& steps = kb::replay_steps();
  steps.start();
  kb::HeldGraphs& held = kb::held_graphs();
  // the knobs' values as of the last call unless a KBENCH_MOE_ variable changed (kb::KnobsMemo; the GIL serialises
  // callers): whether this path is on, and the configuration's text for the last (T, K, E)
  static kb::KnobsMemo knobs("KBENCH_MOE_");
  static bool fast = false, speculate = false;
  static std::string config;
  static std::array<int64_t, 3> config_for{-1, -1, -1};
  if (knobs.changed()) {
    fast = fast_replay_on();
    speculate = speculate_on();
    config_for = {-1, -1, -1};
  }
  if (held.empty() || !fast || x.dim() < 2) return c10::nullopt;
  const std::array<int64_t, 3> shape{x.numel() / x.size(-1), K, E};
  if (shape != config_for) {
    config = config_text(config_for_shape(shape[0], K, E));
    config_for = shape;
  }
  steps.mark("knobs");
  // speculate: the graph whose router inputs these are launched first; its GEMMs wait for the late address
  cudaGraphExec_t launched = nullptr;
  if (speculate) {
    static std::vector<int64_t> head;
    if (describe_head(x, weights, K, E, head))
      if (const kb::HeldGraph* guess = held.guess(owner, head, config)) {  // (so x is a CUDA tensor)
        const c10::cuda::CUDAGuard guard(x.device());
        kb::launch(*guess);
        launched = guess->exec;
        steps.mark("launch");
      }
  }
  static std::vector<int64_t> now;
  const bool described = describe_inputs(x, weights, K, E, now);
  steps.mark("describe");
  const kb::HeldGraph* graph = described ? held.find(owner, now, config) : nullptr;
  steps.mark("find");
  if (launched && (!graph || graph->exec != launched)) {
    // another graph's inputs (or none held): the launched one is called off (its GEMMs see a null output)
    output_slot(x).rings[0]->publish(nullptr);
    launched = nullptr;
  }
  if (!graph) return c10::nullopt;
  const c10::cuda::CUDAGuard guard(x.device());
  const torch::Tensor x2 = x.view({-1, x.size(-1)});
  kb::LateRings& slot = output_slot(x2);
  torch::Tensor out;
  if (!graph->late) {
    out = publish_output(x2, slot);
    steps.mark("output");
  }
  if (!launched) {
    kb::launch(*graph);
    steps.mark("launch");
  }
  if (graph->late) {
    // late_output: the GPU routes while the host makes the output. (Should the allocation fail now, the launched
    // graph's routing traps after 2 s without its address.)
    out = torch::empty({x2.size(0), x2.size(1)}, x2.options());
    slot.rings[0]->publish(out.data_ptr());
    slot.published = out.data_ptr();
    steps.mark("output");
  }
  return out.view(x.sizes());
}

// How long (us) the last graph that took its output's address late waited for it on the GPU (x's device; call after
// a synchronize), or 0 where none has run there.
double moe_late_wait_us(torch::Tensor x) { return output_slot(x).rings[0]->last_wait_us(); }

// (step, host us) of each step moe_replay's last call passed: knobs, launch (speculate: first), describe, find,
// launch, output (output before launch where the graph does not take its address late); all five where it launched,
// fewer where it returned None.
std::vector<std::pair<std::string, double>> moe_replay_steps() { return kb::replay_steps().last(); }

// How many calls moe_replay served since the last time this was asked (entry.py tells its GraphReplay).
int64_t moe_fast_replays() { return kb::held_graphs().take_replays(); }

// The layer up to the weighted sum: Y [T*K + T, d] fp16 (pair t*K + k: expert k's output for token t; rows T*K + t:
// the shared expert's). entry.py replays this part as one CUDA graph and runs moe_combine after it. With
// red_combine: `out` is moe_output's tensor, which this call fills (the kernels find it through the slot); returns
// None.
c10::optional<torch::Tensor> moe_experts(torch::Tensor x, torch::Tensor experts, torch::Tensor scores,
                                         std::vector<torch::Tensor> gate, std::vector<torch::Tensor> up,
                                         std::vector<torch::Tensor> down, c10::optional<torch::Tensor> out) {
  torch::Tensor y = run_moe(x, experts, scores, gate, up, down, nullptr, false, out);
  if (!y.defined()) return c10::nullopt;
  return y;
}

// The router and then moe_experts in one call: x [..., d] fp16 (the layer's input as it comes), router_w [E, d] fp16;
// scores = softmax(x router_w^T) and their top K unsorted, through the same ATen ops as the reference's
// F.linear / softmax / topk, so the same experts win every tie. Returns (moe_experts' result, top scores [T, K]).
// Why in C++: leaderboard mode's inputs move every run, so the call runs eagerly, and Python between these ops kept
// the GPU waiting (docs/moe-notes.md, fifteenth session); the graph captures the same call.
// MoeConfig::shared_first: the shared expert's GEMM 1 (it needs only x) is launched before the router, so the GPU
// has work while the host runs the router's ops (cuBLAS's host time, ~150 us, in leaderboard mode's eager calls).
std::tuple<c10::optional<torch::Tensor>, torch::Tensor> moe_layer(torch::Tensor x, torch::Tensor router_w, int64_t K,
                                                                  std::vector<torch::Tensor> gate,
                                                                  std::vector<torch::Tensor> up,
                                                                  std::vector<torch::Tensor> down,
                                                                  c10::optional<torch::Tensor> out) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kHalf && x.dim() >= 2 && router_w.dim() == 2 &&
                  router_w.size(1) == x.size(-1),
              "moe_layer: x [..., d] and router_w [E, d] must be fp16 CUDA tensors");
  const c10::cuda::CUDAGuard guard(x.device());
  const torch::Tensor x2 = x.view({-1, x.size(-1)});
  const int64_t T = x2.size(0), d = x2.size(1), E = static_cast<int64_t>(gate.size()) - 1;
  const MoeConfig config = moe_config(static_cast<int>(T), static_cast<int>(K), static_cast<int>(E));
  Workspaces ws;
  if (config.shared_first) {  // the shared expert's GEMM 1 needs only x: launched before the router
    check_layer(x2, K, gate, up, down);
    TORCH_CHECK(x2.is_contiguous(), "moe_layer: x must be contiguous");
    ws = workspaces(x2, T, K, E, d, gate[0].size(1), config);
    const char* err = moe_run_shared_gemm1(layer_args(x2, gate, up, down, K, ws, config),
                                           c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == nullptr, err ? err : "");
  }
  // the logits by the reference's own op (x as it comes: the same cuBLAS call); the softmax and top-k by ATen's ops
  // or, fused_topk, by moe_run's first launch with their numerics (router.cuh)
  TORCH_CHECK(router_w.size(0) == E, "moe_layer: router_w must have one row per routed expert (E = gate's count - 1)");
  const torch::Tensor logits = at::linear(x, router_w);
  torch::Tensor scores, experts;
  if (config.fused_topk) {
    TORCH_CHECK(logits.is_contiguous(), "moe_layer: the router's logits must be contiguous");
    scores = torch::empty({T, K}, x.options());
    experts = torch::empty({T, K}, x.options().dtype(torch::kLong));
  } else {
    const auto [top_scores, top_experts] = at::topk(logits.softmax(-1), K, -1, true, false);
    scores = top_scores.view({-1, K});
    experts = top_experts.view({-1, K});
  }
  const torch::Tensor logits_2d = config.fused_topk ? logits.view({-1, E}) : torch::Tensor();
  torch::Tensor y = run_moe(x2, experts, scores, gate, up, down, nullptr, false, out,
                            config.shared_first ? &ws : nullptr, &config, config.fused_topk ? &logits_2d : nullptr);
  if (!y.defined()) return {c10::nullopt, scores};
  return {y, scores};
}

// router.cuh alone, for tests: (scores [T, K] fp16, experts [T, K] int64), what torch.topk(logits.softmax(-1), K,
// sorted=False) returns, from logits [T, E] fp16 (E <= 64).
std::tuple<torch::Tensor, torch::Tensor> moe_router_topk(torch::Tensor logits, int64_t K) {
  TORCH_CHECK(logits.is_cuda() && logits.scalar_type() == at::kHalf && logits.dim() == 2,
              "moe_router_topk: logits must be fp16 CUDA [T, E]");
  const c10::cuda::CUDAGuard guard(logits.device());
  logits = logits.contiguous();
  const int64_t T = logits.size(0), E = logits.size(1);
  torch::Tensor scores = torch::empty({T, K}, logits.options());
  torch::Tensor experts = torch::empty({T, K}, logits.options().dtype(torch::kLong));
  torch::Tensor hist = torch::empty({moe_route_hist_rows(static_cast<int>(T * K)) * E},
                                    logits.options().dtype(torch::kInt));
  const char* err = moe_run_router_topk(logits.data_ptr(), static_cast<int>(T), static_cast<int>(K),
                                        static_cast<int>(E), scores.data_ptr(), experts.data_ptr<int64_t>(),
                                        hist.data_ptr<int>(), c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, err ? err : "");
  return {scores, experts};
}

// out [T, d] fp16 = Y's shared row + sum_k scores[t, k] * Y's pair row (fp32, slot order, rounded once), into a new
// tensor. y [T*K + T, d] fp16 from moe_experts, scores [T, K] fp16.
torch::Tensor moe_combine(torch::Tensor y, torch::Tensor scores) {
  TORCH_CHECK(scores.is_cuda() && scores.scalar_type() == at::kHalf && scores.dim() == 2 && scores.is_contiguous(),
              "moe_combine: scores must be a contiguous fp16 CUDA tensor [T, K]");
  const int64_t T = scores.size(0), K = scores.size(1);
  TORCH_CHECK(y.is_cuda() && y.scalar_type() == at::kHalf && y.dim() == 2 && y.is_contiguous() &&
                  y.size(0) == T * K + T && y.size(1) % 8 == 0 && y.get_device() == scores.get_device(),
              "moe_combine: y must be moe_experts' contiguous fp16 [T*K + T, d] on the scores' device");
  const c10::cuda::CUDAGuard guard(y.device());
  torch::Tensor out = torch::empty({T, y.size(1)}, y.options());
  const char* err = moe_run_combine(y.data_ptr(), scores.data_ptr(), out.data_ptr(), static_cast<int>(T),
                                    static_cast<int>(K), static_cast<int>(y.size(1)),
                                    c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, err ? err : "");
  return out;
}

#ifdef KBENCH_DEV
// Benchmarks only: the same call, plus the five stages' device times in ms (route, gather, GEMM 1, GEMM 2,
// combine), recorded with CUDA events between the launches.
std::tuple<torch::Tensor, std::vector<double>> moe_forward_staged(torch::Tensor x, torch::Tensor experts,
                                                                  torch::Tensor scores,
                                                                  std::vector<torch::Tensor> gate,
                                                                  std::vector<torch::Tensor> up,
                                                                  std::vector<torch::Tensor> down) {
  std::vector<double> ms;
  torch::Tensor out = run_moe(x, experts, scores, gate, up, down, &ms, true);
  return {out, ms};
}
#endif  // KBENCH_DEV
