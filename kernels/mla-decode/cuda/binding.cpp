// Torch-facing side of the mla-decode CUDA backend: checks the tensors, takes the output (and, for split plans,
// the partial buffers) from the caching allocator, hands raw pointers to mla.cu. The only file that sees torch.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "driver_api.h"
#include "held_graphs.h"
#include "knobs.h"
#include "late_rings.h"
#include "mla_api.h"
#include "torch_check.h"

// lens: int32 [1] on q's device (the cache length the kernels read from device memory).
static void check_lengths(const torch::Tensor& lens, const torch::Tensor& q, const char* who) {
  KB_CHECK(lens.scalar_type() == at::kInt && lens.numel() == 1 && lens.device() == q.device(),
           "%s: lens must be an int32 tensor of one element on q's device", who);
}

// The query's RoPE inputs: cos/sin bf16 [max_seq, 32] (the tables), lens as check_lengths wants it.
static void check_rope_inputs(const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& lens,
                              const torch::Tensor& q, const char* who) {
  KB_CHECK(cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 && cos.is_contiguous() &&
               sin.is_contiguous() && cos.size(1) == 32 && sin.sizes() == cos.sizes(),
           "%s: cos and sin must be contiguous bf16 [max_seq, 32]", who);
  check_lengths(lens, q, who);
}

// The caller's device-side length, or a new one holding kv_len.
static torch::Tensor device_length(const c10::optional<torch::Tensor>& lens, int64_t kv_len, const torch::Tensor& q,
                                   const char* who) {
  if (!lens.has_value()) return torch::full({1}, kv_len, q.options().dtype(torch::kInt));
  check_lengths(*lens, q, who);
  return *lens;
}

// q [bs, 128, 576] bf16 (absorbed q_nope | roped q_rope); cache [bs, max_seq, 576] bf16 holding kv_len rows;
// cos, sin [max_seq, 32] bf16 (the reference's RoPE of positions 0 .. max_seq-1); lens: int32 [1] on the device
// holding kv_len, what the kernel reads (so a captured graph replays for any length; made here when absent).
// Returns [bs, 128, 512] bf16: softmax(q k^T / sqrt(192)) @ latent per head, with RoPE applied to the cached keys.
// (cache_ref: where a moving graph's capture reads the cache: moving_inputs.h)
static torch::Tensor attention_run(const torch::Tensor& q, const torch::Tensor& cache, int64_t kv_len,
                                   const torch::Tensor& cos, const torch::Tensor& sin,
                                   const c10::optional<torch::Tensor>& lens, const MovingRef& cache_ref) {
  TORCH_CHECK(q.is_cuda() && q.scalar_type() == at::kBFloat16 && q.is_contiguous() && q.dim() == 3 &&
                  q.size(1) == 128 && q.size(2) == 576,
              "mla_attention: q must be a contiguous bf16 CUDA tensor [bs, 128, 576]");
  TORCH_CHECK(cache.scalar_type() == at::kBFloat16 && cache.is_contiguous() && cache.dim() == 3 &&
                  cache.size(0) == q.size(0) && cache.size(2) == 576,
              "mla_attention: cache must be a contiguous bf16 tensor [bs, max_seq, 576]");
  TORCH_CHECK(cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.size(0) >= cache.size(1) && cos.size(1) == 32 && sin.sizes() == cos.sizes(),
              "mla_attention: cos and sin must be contiguous bf16 [max_seq, 32]");
  const torch::Tensor len_dev = device_length(lens, kv_len, q, "mla_attention");
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t bs = q.size(0), max_seq = cache.size(1);
  torch::Tensor out = torch::empty({bs, 128, 512}, q.options());
  MlaArgs a{};
  a.q = q.data_ptr();
  a.cache = cache.data_ptr();
  a.cos_tab = cos.data_ptr();
  a.sin_tab = sin.data_ptr();
  a.out = out.data_ptr();
  a.bs = static_cast<int>(bs);
  a.max_seq = static_cast<int>(max_seq);
  a.kv_len = static_cast<int>(kv_len);
  a.kv_len_dev = len_dev.data_ptr<int>();
  const MlaConfig config = mla_config(a.bs, a.kv_len, mla_num_sms());
  a.config = config;
  a.cache_ref = cache_ref;
  kb::print_config_once([&](char* buf, int size) {
    const int len = snprintf(buf, size, "mla_attention bs=%d kv_len=%d: ", a.bs, a.kv_len);
    mla_describe(config, buf + len, size - len);
  });
  torch::Tensor part_o, part_ml;
  if (config.splits > 1) {
    part_o = torch::empty({config.splits, bs, 128, 512}, q.options().dtype(torch::kFloat));
    part_ml = torch::empty({config.splits, bs, 128, 2}, q.options().dtype(torch::kFloat));
    a.part_o = part_o.data_ptr<float>();
    a.part_ml = part_ml.data_ptr<float>();
  }
  const char* err = mla_run(a, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, err ? err : "");
  return out;
}

torch::Tensor mla_attention(torch::Tensor q, torch::Tensor cache, int64_t kv_len, torch::Tensor cos, torch::Tensor sin,
                            c10::optional<torch::Tensor> lens) {
  return attention_run(q, cache, kv_len, cos, sin, lens, {});
}

// The absorbed query in one launch: qn [heads, bs, 512] bf16 (q_nope W_UK per head, the bmm's output), q [bs, heads,
// 192] bf16 (q_nope | un-rotated q_rope), cos/sin [max_seq, 32] bf16, lens int32 [1] on the device holding kv_len
// (the decoded row sits at kv_len - 1). Returns q_full [bs, heads, 576] bf16, what mla_attention takes.
torch::Tensor mla_assemble_q(torch::Tensor qn, torch::Tensor q, torch::Tensor cos, torch::Tensor sin,
                             torch::Tensor lens) {
  TORCH_CHECK(qn.is_cuda() && qn.scalar_type() == at::kBFloat16 && qn.is_contiguous() && qn.dim() == 3 &&
                  qn.size(2) == 512,
              "mla_assemble_q: qn must be a contiguous bf16 CUDA tensor [heads, bs, 512]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.is_contiguous() && q.dim() == 3 && q.size(0) == qn.size(1) &&
                  q.size(1) == qn.size(0) && q.size(2) == 192,
              "mla_assemble_q: q must be a contiguous bf16 tensor [bs, heads, 192]");
  check_rope_inputs(cos, sin, lens, q, "mla_assemble_q");
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t heads = qn.size(0), bs = qn.size(1);
  torch::Tensor q_full = torch::empty({bs, heads, 576}, q.options());
  const char* err = launch_mla_assemble_q(qn.data_ptr(), q.data_ptr(), cos.data_ptr(), sin.data_ptr(), q_full.data_ptr(),
                                          static_cast<int>(bs), static_cast<int>(heads), lens.data_ptr<int>(),
                                          static_cast<int>(cos.size(0)), c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, err ? err : "");
  return q_full;
}

// q_full [bs, heads, 576] bf16 whose latent columns the bmm wrote: the rope columns, in place, as mla_assemble_q
// writes them.
void mla_rope_q(torch::Tensor q_full, torch::Tensor q, torch::Tensor cos, torch::Tensor sin, torch::Tensor lens) {
  TORCH_CHECK(q_full.is_cuda() && q_full.scalar_type() == at::kBFloat16 && q_full.is_contiguous() &&
                  q_full.dim() == 3 && q_full.size(2) == 576,
              "mla_rope_q: q_full must be a contiguous bf16 CUDA tensor [bs, heads, 576]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.is_contiguous() && q.dim() == 3 && q.size(0) == q_full.size(0) &&
                  q.size(1) == q_full.size(1) && q.size(2) == 192 && q.device() == q_full.device(),
              "mla_rope_q: q must be a contiguous bf16 tensor [bs, heads, 192] on q_full's device");
  check_rope_inputs(cos, sin, lens, q, "mla_rope_q");
  const c10::cuda::CUDAGuard guard(q.device());
  const char* err = launch_mla_assemble_q(nullptr, q.data_ptr(), cos.data_ptr(), sin.data_ptr(), q_full.data_ptr(),
                                          static_cast<int>(q_full.size(0)), static_cast<int>(q_full.size(1)),
                                          lens.data_ptr<int>(), static_cast<int>(cos.size(0)),
                                          c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, err ? err : "");
}

// The configuration mla_linear runs x [..., k] w [n, k]^T with: linear.cuh's, or bn 0 (cuBLAS) where none fits the
// shape (more than 128 rows, k not a multiple of 64, n not of 4) or the tensors are not contiguous and aligned.
static LinearConfig linear_plan(const torch::Tensor& x, const torch::Tensor& w) {
  const int64_t k = w.size(1), n = w.size(0), m = x.numel() / std::max<int64_t>(k, 1);
  const bool aligned = x.is_contiguous() && w.is_contiguous() && (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16) == 0 &&
                       (reinterpret_cast<uintptr_t>(w.data_ptr()) % 16) == 0;
  return aligned && m <= 128 ? mla_linear_config(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k))
                             : LinearConfig{0, 0, false};
}

// KBENCH_MLA_FUSED_DOWN (on): the step's kv_down and q_down (both of x) in one launch (finding 54).
static bool fused_down_on() { return kb::env_int("KBENCH_MLA_FUSED_DOWN", 1) != 0; }

// The configuration of one launch computing x w1^T and x w2^T (linear.cuh's pair), or bn 0 where it does not fit
// (linear_plan's conditions for both, or no single wave holds both projections' tiles).
static LinearConfig pair_plan(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& w2) {
  if (!linear_plan(x, w1).bn || !linear_plan(x, w2).bn || w1.size(1) != w2.size(1)) return LinearConfig{0, 0, false};
  const int64_t k = w1.size(1), m = x.numel() / std::max<int64_t>(k, 1);
  return mla_linear_pair_config(static_cast<int>(m), static_cast<int>(w1.size(0)), static_cast<int>(w2.size(0)),
                                static_cast<int>(k));
}

// mla_linear with y_slot (a late output, late_address.h): the kernel stores to the address that device word holds
// then, and the returned tensor is never written; x_ref, w_ref: x and w are a moving graph's inputs
// (moving_inputs.h). Both on linear.cuh only: the caller checks linear_plan first. absorb: linear_absorb_out's
// launch (the caller checked that it fits).
static torch::Tensor linear_out(const torch::Tensor& x, const torch::Tensor& w, void* const* y_slot,
                                const MovingRef& x_ref = {}, const MovingRef& w_ref = {},
                                const LinearAbsorb* absorb = nullptr) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 &&
                  w.device() == x.device() && w.dim() == 2 && x.size(-1) == w.size(1),
              "mla_linear: x [..., k] and w [n, k] must be bf16 CUDA tensors on one device");
  const int64_t k = w.size(1), n = w.size(0), m = x.numel() / std::max<int64_t>(k, 1);
  const LinearConfig config = linear_plan(x, w);
  TORCH_CHECK(config.bn || (!y_slot && !x_ref.capture && !w_ref.capture),
              "mla_linear: a late output or a moving input needs linear.cuh, and no configuration fits");
  kb::print_config_once([&](char* buf, int size) {
    const int len = snprintf(buf, size, "mla_linear m=%lld n=%lld k=%lld%s: ", (long long)m, (long long)n,
                             (long long)k, absorb ? " absorbing W_UK" : "");
    if (config.bn) linear_describe(config, buf + len, size - len);
    else snprintf(buf + len, size - len, "cuBLAS (no LinearConfig fits)");
  });
  if (!config.bn) return at::linear(x, w);
  const c10::cuda::CUDAGuard guard(x.device());
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  torch::Tensor y = torch::empty(sizes, x.options());
  const char* err = launch_mla_linear(config, x.data_ptr(), w.data_ptr(), y.data_ptr(), static_cast<int>(m),
                                      static_cast<int>(n), static_cast<int>(k), c10::cuda::getCurrentCUDAStream().stream(),
                                      y_slot, x_ref, w_ref, nullptr, absorb);
  TORCH_CHECK(err == nullptr, err ? err : "");
  return y;
}

// The decode step's projections: x [..., k] bf16 (contiguous, at most 128 rows in all), w [n, k] bf16 (contiguous).
// Returns x w^T [..., n] bf16, F.linear's result, from linear.cuh; through at::linear (cuBLAS) where no
// configuration of that kernel fits the shape (more rows, k not a multiple of 64, n not of 4).
torch::Tensor mla_linear(torch::Tensor x, torch::Tensor w) { return linear_out(x, w, nullptr); }

// x w1^T [..., n1] and x w2^T [..., n2] (bf16) in one launch of `config` (pair_plan's); x_ref, w1_ref, w2_ref: where
// they are a moving graph's inputs.
static std::tuple<torch::Tensor, torch::Tensor> pair_out(const LinearConfig& config, const torch::Tensor& x,
                                                         const torch::Tensor& w1, const torch::Tensor& w2,
                                                         const MovingRef& x_ref = {}, const MovingRef& w1_ref = {},
                                                         const MovingRef& w2_ref = {}) {
  const int64_t k = x.size(-1), m = x.numel() / k;
  kb::print_config_once([&](char* buf, int size) {  // (KBENCH_PRINT_CONFIG, as linear_out prints a single one's)
    const int len = snprintf(buf, size, "mla_linear pair m=%lld n=%lld+%lld k=%lld: ", (long long)m,
                             (long long)w1.size(0), (long long)w2.size(0), (long long)k);
    linear_describe(config, buf + len, size - len);
  });
  const c10::cuda::CUDAGuard guard(x.device());
  auto sizes = x.sizes().vec();
  sizes.back() = w1.size(0);
  torch::Tensor y1 = torch::empty(sizes, x.options());
  sizes.back() = w2.size(0);
  torch::Tensor y2 = torch::empty(sizes, x.options());
  const LinearSecond second{w2.data_ptr(), y2.data_ptr(), static_cast<int>(w2.size(0)), w2_ref};
  const char* err = launch_mla_linear(config, x.data_ptr(), w1.data_ptr(), y1.data_ptr(), static_cast<int>(m),
                                      static_cast<int>(w1.size(0)), static_cast<int>(k),
                                      c10::cuda::getCurrentCUDAStream().stream(), nullptr, x_ref, w1_ref, &second);
  TORCH_CHECK(err == nullptr, err ? err : "");
  return {y1, y2};
}

// KBENCH_MLA_ABSORB_UK (on): the step's q_up CTAs also multiply each head's q_nope by its W_UK into the query's
// latent columns (linear.cuh's kAbsorb, finding 59); 0: the per-head GEMM after q_up (head_gemm.cuh), as before.
static bool absorb_uk_on() { return kb::env_int("KBENCH_MLA_ABSORB_UK", 1) != 0; }

// q = x w^T [bs, 128 * 192] (the step's q_up; only each head's 64 rope columns written) and, in the same launch,
// q_full[:, h, :512] = q_nope_h W_UK_h with W_UK_h = rows [256 h, 256 h + 128) of w_kv_up [128 * 256, 512];
// undefined where linear.cuh cannot (another configuration than one 192-column head a CTA, unaligned or
// non-contiguous tensors): then the caller runs both.
static torch::Tensor linear_absorb_out(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& w_kv_up,
                                       torch::Tensor& q_full, const MovingRef& w_ref, const MovingRef& uk_ref) {
  const int64_t k = w.size(1), n = w.size(0), m = x.numel() / std::max<int64_t>(k, 1);
  const LinearConfig config = linear_plan(x, w);
  const bool fits = config.bn && mla_linear_absorbs(config, static_cast<int>(n)) && w_kv_up.is_contiguous() &&
                    w_kv_up.scalar_type() == at::kBFloat16 && w_kv_up.numel() == 128 * 256 * 512 &&
                    reinterpret_cast<uintptr_t>(w_kv_up.data_ptr()) % 16 == 0 && q_full.is_contiguous() &&
                    q_full.size(0) == m && q_full.numel() == m * 128 * 576;
  if (!fits) return torch::Tensor();
  const LinearAbsorb absorb{w_kv_up.data_ptr(), q_full.data_ptr(), uk_ref};
  return linear_out(x, w, nullptr, {}, w_ref, &absorb);
}

// The step's q_up with W_UK absorbed (linear_absorb_out) for the tests: x [m, 1536] and w [128 * 192, 1536] bf16,
// w_kv_up [128 * 256, 512] bf16, q_full [m, 128, 576] bf16, whose latent columns are written; returns x w^T [m,
// 128 * 192] with only each head's rope columns written (all the step reads of it), or None where linear.cuh's
// kAbsorb does not fit.
c10::optional<torch::Tensor> mla_linear_absorb(torch::Tensor x, torch::Tensor w, torch::Tensor w_kv_up,
                                               torch::Tensor q_full) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 && w.dim() == 2 &&
                  x.size(-1) == w.size(1) && q_full.scalar_type() == at::kBFloat16 && w.device() == x.device() &&
                  w_kv_up.device() == x.device() && q_full.device() == x.device(),
              "mla_linear_absorb: x [m, k], w [n, k], w_kv_up and q_full must be bf16 tensors on one CUDA device");
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor y = linear_absorb_out(x, w, w_kv_up, q_full, {}, {});
  if (!y.defined()) return c10::nullopt;
  return y;
}

// Both projections of one x in one launch, as the step runs kv_down and q_down: (x w1^T [..., n1], x w2^T [..., n2])
// bf16, x [..., k] and w1 [n1, k], w2 [n2, k] bf16 contiguous; None where no pair configuration fits (pair_plan).
c10::optional<std::tuple<torch::Tensor, torch::Tensor>> mla_linear_pair(torch::Tensor x, torch::Tensor w1,
                                                                        torch::Tensor w2) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kBFloat16 && w1.scalar_type() == at::kBFloat16 &&
                  w2.scalar_type() == at::kBFloat16 && w1.dim() == 2 && w2.dim() == 2 && x.size(-1) == w1.size(1) &&
                  x.size(-1) == w2.size(1) && w1.device() == x.device() && w2.device() == x.device(),
              "mla_linear_pair: x [..., k], w1 [n1, k] and w2 [n2, k] must be bf16 CUDA tensors on one device");
  const LinearConfig config = pair_plan(x, w1, w2);
  if (!config.bn) return c10::nullopt;
  return pair_out(config, x, w1, w2);
}

namespace {
// The fast path's late rings on each device (late_rings.h): a graph only mla_replay launches takes each call's
// output address and cache length after its launch (ring 0, into the word the wo projection stores through), so the
// host writes nothing by the stream before it, and the wo projection stores into the call's own output (no copy of
// the graph's buffer after it). A moving graph (moving_inputs.h) also takes the call's input addresses (ring 1,
// records of kb::kMovingInputs addresses). Made where `make` (never inside a stream capture: it allocates), else null
// where none is yet.
kb::LateRings* late_step(const torch::Tensor& like, bool make) {
  return kb::late_rings(like, {2, kb::kMovingInputs}, make);
}
constexpr int kOutputRing = 0, kInputsRing = 1;

// Whether mla_replay launches held graphs (else entry.py's Python path replays them).
bool fast_replay_on() { return !kb::env_is("KBENCH_MLA_FAST_REPLAY", "0") && !kb::env_is("KBENCH_MLA_GRAPH", "0"); }

// Whether the step captured last takes its output and length late (mla_step sets it in each capture,
// mla_hold_graph reads it): such a graph must be launched only by mla_replay, which publishes them.
bool last_capture_late = false;

// The step captured last, where it is a moving graph (its inputs' addresses taken late: moving_inputs.h): its
// bookkeeping and its device buffer (from the graph's pool), for mla_hold_graph.
struct MovingStep {
  std::unique_ptr<kb::MovingCapture> capture;
  torch::Tensor buffer;
};
MovingStep last_capture_moving;

// The step's inputs in the order entry.py passes them (x, cache, the five weights, cos, sin, lens): the first seven
// are a moving graph's record (leaderboard mode regenerates them; the tables and the length are the process's own).
constexpr int kStepMoving = 7;
static_assert(kStepMoving <= kb::kMovingInputs, "the record holds every moving input");
}  // namespace

// c [H, m, n] = a [H, m, k] . b [H, k, n] per head (bf16), at::bmm_out's contract for the step's two per-head GEMMs,
// through head_gemm.cuh (KBENCH_MLA_HEAD_GEMM=0: at::bmm_out, cuBLAS). a and c: the last dim contiguous, any row and
// head strides; b: n contiguous (rows of k) or k contiguous (a transposed view); m <= 128, n % 128 == 0, k % 64 == 0,
// a's and b's strides multiples of 8 elements. Returns c.
// (b_ref: b is a moving graph's input, which the kernel reads through the capture's table word: moving_inputs.h)
static torch::Tensor head_bmm_out(torch::Tensor c, const torch::Tensor& a, const torch::Tensor& b,
                                  const MovingRef& b_ref = {}) {
  const void* const* b_slot = b_ref.capture ? b_ref.capture->slot(b_ref.input) : nullptr;
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && c.dim() == 3 && a.size(0) == b.size(0) && c.size(0) == a.size(0) &&
                  a.size(2) == b.size(1) && c.size(1) == a.size(1) && c.size(2) == b.size(2),
              "mla_bmm_out: c [H, m, n] = a [H, m, k] . b [H, k, n]");
  TORCH_CHECK(a.is_cuda() && a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16 &&
                  c.scalar_type() == at::kBFloat16 && b.device() == a.device() && c.device() == a.device(),
              "mla_bmm_out: a, b and c must be bf16 tensors on one CUDA device");
  if (kb::env_int("KBENCH_MLA_HEAD_GEMM", 1) == 0) {
    TORCH_CHECK(!b_slot, "mla_bmm_out: a moving input needs head_gemm.cuh (KBENCH_MLA_HEAD_GEMM=1)");
    return at::bmm_out(c, a, b);
  }
  const int64_t heads = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  const bool b_k_major = b.stride(2) != 1;
  auto aligned = [](const torch::Tensor& t, int64_t s1, int64_t s0) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && s1 % 8 == 0 && s0 % 8 == 0;
  };
  TORCH_CHECK(a.stride(2) == 1 && c.stride(2) == 1 && (b.stride(2) == 1 || b.stride(1) == 1) &&
                  aligned(a, a.stride(1), a.stride(0)) &&
                  aligned(b, b_k_major ? b.stride(2) : b.stride(1), b.stride(0)) && m >= 1 && m <= 128 &&
                  n % 128 == 0 && k % 64 == 0 && k > 0,
              "mla_bmm_out: needs contiguous last dims of a and c, b with n or k contiguous, 16-byte aligned rows, "
              "m <= 128, n a multiple of 128 and k of 64 (KBENCH_MLA_HEAD_GEMM=0 takes any shape through cuBLAS)");
  const c10::cuda::CUDAGuard guard(a.device());
  const char* err = launch_mla_head_gemm(a.data_ptr(), a.stride(1), a.stride(0), b.data_ptr(),
                                         b_k_major ? b.stride(2) : b.stride(1), b.stride(0), b_k_major, c.data_ptr(),
                                         c.stride(1), c.stride(0), static_cast<int>(heads), static_cast<int>(m),
                                         static_cast<int>(n), static_cast<int>(k),
                                         c10::cuda::getCurrentCUDAStream().stream(), b_slot, b_ref.offset);
  TORCH_CHECK(err == nullptr, err ? err : "");
  return c;
}

torch::Tensor mla_bmm_out(torch::Tensor c, torch::Tensor a, torch::Tensor b) { return head_bmm_out(c, a, b); }

// The configuration mla_linear runs for y [m, n] = x [m, k] w [n, k]^T on the current device: [bn, splits, pdl]
// (bn 0: cuBLAS). For the tests and the benchmark.
std::vector<int64_t> mla_linear_plan(int64_t m, int64_t n, int64_t k) {
  const LinearConfig c = mla_linear_config(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
  return {c.bn, c.splits, c.pdl ? 1 : 0};
}

// Whether a capture of the step at these inputs can be a moving graph (KBENCH_MLA_MOVING, on): every launch that
// reads an input must take its address from the graph's first kernel, so the four projections that read one on
// linear.cuh, the per-head GEMMs on head_gemm.cuh and the attention on the s-once kernel (wo's projection: the late
// output already asks for linear.cuh).
static bool moving_step_fits(const torch::Tensor& x2, const torch::Tensor& cache, const torch::Tensor& w_kv_down,
                             const torch::Tensor& w_q_down, const torch::Tensor& w_q_up, int64_t kv_len) {
  if (kb::env_int("KBENCH_MLA_MOVING", 1) == 0 || kb::env_int("KBENCH_MLA_HEAD_GEMM", 1) == 0) return false;
  const MlaConfig attention = mla_config(static_cast<int>(cache.size(0)), static_cast<int>(kv_len), mla_num_sms());
  // q_up's x is q_low [bs, dq], made by the step (contiguous, aligned)
  const bool q_up = w_q_up.is_contiguous() && reinterpret_cast<uintptr_t>(w_q_up.data_ptr()) % 16 == 0 &&
                    w_q_up.size(1) == w_q_down.size(0) &&
                    mla_linear_config(static_cast<int>(x2.size(0)), static_cast<int>(w_q_up.size(0)),
                                      static_cast<int>(w_q_up.size(1))).bn;
  return attention.s_once && !attention.seesaw && linear_plan(x2, w_kv_down).bn && linear_plan(x2, w_q_down).bn &&
         q_up;
}

// The host time of each step of the last eager mla_step (not a capture), for benchmarks/mla_decode.py --windows
// --leaderboard: where an eager window's time goes before the attention is launched.
static inline kb::StepTimes& eager_steps() {
  static kb::StepTimes steps;
  return steps;
}

// One decode step, the whole of it (entry.py's docstring has the maths): x [bs, 1, dim] bf16; cache [bs, max_seq,
// 576] bf16 holding kv_len - 1 rows (row kv_len - 1 is written here); the config's weights as it holds them
// (w_kv_down [576, dim], w_q_down [dq, dim], w_q_up [128 * 192, dq], w_kv_up [128 * 256, 512], w_o [dim, 128 * 128],
// bf16); cos/sin the RoPE tables; lens int32 [1] on the device: written with kv_len here when not capturing (a
// graph reads it as it is at its launch: the caller writes it, or a late graph takes it); moving_ok: a capture may
// take its inputs' addresses late (a moving graph, KBENCH_MLA_MOVING). Returns out [bs, 1, dim] bf16.
// Why one C++ call: a call without a graph (a new input layout's first; every leaderboard-mode call before moving
// graphs, finding 51) runs the step eagerly; from Python its ~12 launches cost the host ~1 ms while the GPU waited
// (docs/mla-decode-notes.md, finding 31). The
// projections go through mla_linear (linear.cuh) and the per-head GEMMs through mla_bmm_out (head_gemm.cuh) rather
// than cuBLAS for the same reason: cuBLAS spent 50-190 us of host time a call before its launch (finding 32). The
// graph captures this same call; inside a capture the append runs on a side stream beside the q projections, which
// leave most SMs idle at 128 rows.
torch::Tensor mla_step(torch::Tensor x, torch::Tensor cache, torch::Tensor w_kv_down, torch::Tensor w_q_down,
                       torch::Tensor w_q_up, torch::Tensor w_kv_up, torch::Tensor w_o, int64_t kv_len,
                       torch::Tensor cos, torch::Tensor sin, torch::Tensor lens, bool moving_ok) {
  constexpr int64_t kH = 128, kNope = 128, kRope = 64, kV = 128, kLora = 512;
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.dim() == 3 && x.size(1) == 1,
              "mla_step: x must be a contiguous bf16 CUDA tensor [bs, 1, dim]");
  TORCH_CHECK(cache.scalar_type() == at::kBFloat16 && cache.is_contiguous() && cache.dim() == 3 &&
                  cache.size(0) == x.size(0) && cache.size(2) == kLora + kRope && cache.device() == x.device() &&
                  reinterpret_cast<uintptr_t>(cache.data_ptr()) % 16 == 0,
              "mla_step: cache must be a contiguous bf16 tensor [bs, max_seq, 576] on x's device");
  TORCH_CHECK(kv_len >= 1 && kv_len <= cache.size(1), "mla_step: kv_len must lie in [1, max_seq]");
  TORCH_CHECK(w_kv_up.numel() == kH * (kNope + kV) * kLora && w_q_up.size(0) == kH * (kNope + kRope) &&
                  w_kv_down.dim() == 2 && w_kv_down.size(0) == kLora + kRope,
              "mla_step: built for 128 heads, nope 128, rope 64, v 128, latent 512");
  check_rope_inputs(cos, sin, lens, x, "mla_step");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t bs = x.size(0);
  const torch::Tensor x2 = x.view({bs, x.size(2)});
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(main.stream(), &capture));
  kb::StepTimes no_steps, &steps = capture == cudaStreamCaptureStatusNone ? eager_steps() : no_steps;
  steps.start();
  if (capture == cudaStreamCaptureStatusNone &&
      !kb::stream_write(main.stream(), lens.data_ptr(), static_cast<uint32_t>(kv_len)))
    lens.fill_(kv_len);
  steps.mark("length");
  // KBENCH_MLA_LATE (on): a capture for mla_replay takes the call's output address and cache length from the late
  // ring after its launch. Its ring is made by the eager call before the capture (GraphReplay runs one first).
  const bool want_late = kb::env_int("KBENCH_MLA_LATE", 1) != 0 && fast_replay_on();
  kb::LateRings* late_ring = want_late ? late_step(x, capture == cudaStreamCaptureStatusNone) : nullptr;
  // y [bs, H, v]: the W_UV bmm's output, which wo reads as [bs, H * v] (made here: whether wo runs on linear.cuh,
  // which a late output needs, depends on it)
  torch::Tensor y = torch::empty({bs, kH, kV}, x.options());
  kb::LateAddress late{};
  if (capture == cudaStreamCaptureStatusActive && late_ring && linear_plan(y.view({bs, 1, kH * kV}), w_o).bn)
    late = late_ring->rings[kOutputRing]->view(reinterpret_cast<unsigned*>(lens.data_ptr<int>()));
  // KBENCH_MLA_MOVING (on): a late capture takes the inputs' addresses late too, where every launch that reads one
  // can (moving_inputs.h): its first kernel takes them, so one graph serves inputs at any address.
  std::unique_ptr<kb::MovingCapture> moving;
  torch::Tensor moving_buffer;
  if (capture == cudaStreamCaptureStatusActive) {
    last_capture_late = late.ring != nullptr;
    last_capture_moving = {};
    if (late.ring && moving_ok && moving_step_fits(x2, cache, w_kv_down, w_q_down, w_q_up, kv_len)) {
      moving_buffer = torch::empty({static_cast<int64_t>(kb::kMovingBufferBytes)}, x.options().dtype(torch::kByte));
      moving = std::make_unique<kb::MovingCapture>(moving_buffer.data_ptr());
      const char* err = launch_moving_take(moving->take(late_ring->rings[kInputsRing]->view()), main.stream());
      TORCH_CHECK(err == nullptr, err ? err : "");
    }
  }
  // where a launch of a moving capture reads `t`, the step's input `input` (else: at t's own address)
  const torch::Tensor* step_inputs[kStepMoving] = {&x, &cache, &w_kv_down, &w_q_down, &w_q_up, &w_kv_up, &w_o};
  auto ref = [&](int input, const torch::Tensor& t) {
    if (!moving) return MovingRef{};
    return MovingRef{moving.get(), input,
                     static_cast<const char*>(t.data_ptr()) - static_cast<const char*>(step_inputs[input]->data_ptr())};
  };
  steps.mark("late+y");
  // q_low [bs, dq] = x w_q_down^T and row [bs, 576] = x w_kv_down^T: one launch where they fit one wave together, so
  // that the q path does not wait for kv_down's CTAs (finding 54); else each on its own, kv_down on the side stream
  torch::Tensor q_low, row;
  const LinearConfig pair = fused_down_on() ? pair_plan(x2, w_q_down, w_kv_down) : LinearConfig{0, 0, false};
  if (pair.bn) {
    std::tie(q_low, row) = pair_out(pair, x2, w_q_down, w_kv_down, ref(0, x2), ref(3, w_q_down), ref(2, w_kv_down));
    steps.mark("down");
  }
  auto append = [&] {
    if (!row.defined()) row = linear_out(x2, w_kv_down, nullptr, ref(0, x2), ref(2, w_kv_down));  // [bs, 576]
    steps.mark("kv_down");
    const char* err = launch_mla_append_row(row.data_ptr(), cache.data_ptr(), static_cast<int>(bs),
                                            static_cast<int>(cache.size(1)), lens.data_ptr<int>(), late,
                                            c10::cuda::getCurrentCUDAStream().stream(),
                                            moving ? moving->slot(1) : nullptr);
    TORCH_CHECK(err == nullptr, err ? err : "");
    steps.mark("append");
  };
  // events for the fork and the join (a capture turns them into the graph's edges; destroyed once recorded)
  cudaEvent_t forked = nullptr, appended = nullptr;
  if (capture == cudaStreamCaptureStatusActive) {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, x.get_device());
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&appended, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(forked, main.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(side.stream(), forked, 0));
    const c10::cuda::CUDAStreamGuard on_side(side);
    append();
    C10_CUDA_CHECK(cudaEventRecord(appended, side.stream()));
  } else {
    append();
  }
  // The per-head GEMMs through head_gemm.cuh, eager or captured: cuBLAS spent ~190 us of host time before its first
  // launch in an eager window (finding 32), and inside a capture it would be the process's first cuBLAS call (the
  // projections run on linear.cuh), which fails there: its set-up is not capturable (finding 33).
  if (!q_low.defined()) q_low = linear_out(x2, w_q_down, nullptr, ref(0, x2), ref(3, w_q_down));
  steps.mark("q_down");
  const torch::Tensor w_kvu = w_kv_up.view({kH, kNope + kV, kLora});
  // q_full [bs, H, 576] = (q_nope W_UK) | roped q_rope: q_up's CTAs write the latent columns themselves (absorb_uk),
  // or the per-head bmm writes its [H, bs, 512] result straight into them (a strided output: rows H * 576 apart);
  // mla_rope_q the rope columns
  torch::Tensor q_full = torch::empty({bs, kH, kLora + kRope}, x.options());
  torch::Tensor q_flat = absorb_uk_on() ? linear_absorb_out(q_low, w_q_up, w_kv_up, q_full, ref(4, w_q_up),
                                                            ref(5, w_kv_up))
                                        : torch::Tensor();
  const bool absorbed = q_flat.defined();
  if (!absorbed) q_flat = linear_out(q_low, w_q_up, nullptr, {}, ref(4, w_q_up));
  const torch::Tensor q = q_flat.view({bs, kH, kNope + kRope});
  steps.mark("q_up");
  if (!absorbed) {
    torch::Tensor q_latent = q_full.narrow(2, 0, kLora).transpose(0, 1);
    const torch::Tensor w_uk = w_kvu.narrow(1, 0, kNope);
    head_bmm_out(q_latent, q.narrow(2, 0, kNope).transpose(0, 1), w_uk, ref(5, w_uk));
  }
  steps.mark("bmm_uk");
  auto join = [&] {  // the attention reads the new row (and, late, the query's RoPE the length the append took)
    if (!appended) return;
    C10_CUDA_CHECK(cudaStreamWaitEvent(main.stream(), appended, 0));
    C10_CUDA_CHECK(cudaEventDestroy(forked));
    C10_CUDA_CHECK(cudaEventDestroy(appended));
    appended = nullptr;
  };
  if (late.ring) join();
  mla_rope_q(q_full, q, cos, sin, lens);
  join();
  steps.mark("rope_q");
  const torch::Tensor o_latent = attention_run(q_full, cache, kv_len, cos, sin, lens, ref(1, cache));  // [bs, H, 512]
  steps.mark("attention");
  // y written by the per-head bmm through a transposed view: wo reads it as [bs, H * v] in place
  torch::Tensor y_heads = y.transpose(0, 1);
  const torch::Tensor w_uv = w_kvu.narrow(1, kNope, kV).transpose(1, 2);
  head_bmm_out(y_heads, o_latent.transpose(0, 1), w_uv, ref(5, w_uv));
  steps.mark("bmm_uv");
  // late: the graph's own output tensor is never written; each call's is the one mla_replay publishes
  torch::Tensor out = linear_out(y.view({bs, 1, kH * kV}), w_o,
                                 late.ring ? reinterpret_cast<void* const*>(late_ring->word.data_ptr()) : nullptr, {},
                                 ref(6, w_o));
  steps.mark("wo");
  if (moving) last_capture_moving = {std::move(moving), std::move(moving_buffer)};
  return out;
}

// (step, host us) of the last eager mla_step (length, late+y, kv_down, append, q_down, q_up, bmm_uk, rope_q,
// attention, bmm_uv, wo), and when it started (ns of the clock time.perf_counter_ns reads): for the benchmarks.
std::pair<std::vector<std::pair<std::string, double>>, int64_t> mla_eager_steps() {
  return {eager_steps().last(), eager_steps().start_ns()};
}

// ---- entry.py's fast path: a held graph of mla_step launched from here (_common/held_graphs.h says why) ----

namespace {
std::vector<std::string> graph_knobs;  // entry.py's _CONFIG_KNOBS, as mla_hold_graph last got them
bool graph_knobs_new = true;          // mla_hold_graph set them since mla_replay last read their values

// What a step's graph depends on: the inputs (x, cache, the five weights, cos, sin, lens) described, then the
// device; false where one is not a tensor. moving: a moving graph's, where the first kStepMoving inputs count by
// their addresses' alignment only (their maps need 16 bytes).
bool describe_step(const py::tuple& inputs, std::vector<int64_t>& out, bool moving) {
  out.clear();
  if (inputs.size() != 10) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!THPVariable_Check(inputs[i].ptr())) return false;
    kb::describe_tensor(THPVariable_Unpack(inputs[i].ptr()), out, !moving || static_cast<int>(i) >= kStepMoving);
  }
  out.push_back(THPVariable_Unpack(inputs[0].ptr()).get_device());
  out.push_back(moving ? 1 : 0);
  return true;
}

// Whether mla_replay looks for moving graphs (KBENCH_MLA_MOVING; the graph's own text of the knobs says whether it
// was captured as one).
bool moving_on() { return kb::env_int("KBENCH_MLA_MOVING", 1) != 0; }
}  // namespace

// entry.py, after GraphReplay captured the step: `graph` (its cudaGraphExec_t as an integer, `exec`) held for
// mla_replay with the captured step's output (the graph's own buffer) and the knobs `knobs` as they are now.
// Returns whether it takes its output and cache length late (then only mla_replay may launch it: GraphReplay drops
// its own copy), and whether it takes its inputs' addresses too (a moving graph).
std::tuple<bool, bool> mla_hold_graph(py::object owner, py::object graph, int64_t exec, torch::Tensor output,
                                      py::tuple inputs, std::vector<std::string> knobs) {
  kb::HeldGraph held{owner, graph, py::cast(output), reinterpret_cast<cudaGraphExec_t>(exec), {}, {}};
  MovingStep moving = std::move(last_capture_moving);
  last_capture_moving = {};
  TORCH_CHECK(describe_step(inputs, held.inputs, moving.capture != nullptr),
              "mla_hold_graph: pass the step's ten input tensors");
  graph_knobs = std::move(knobs);
  graph_knobs_new = true;
  held.config = kb::env_text(graph_knobs);
  const bool late = held.late = last_capture_late;
  last_capture_late = false;
  if (moving.capture) {  // its maps and plan in place before its first launch
    const c10::cuda::CUDAGuard guard(moving.buffer.device());
    C10_CUDA_CHECK(moving.capture->upload());
    held.keep = py::cast(moving.buffer);
    held.moving = true;
  }
  const bool moved = held.moving;
  kb::held_graphs().hold(std::move(held));
  return {late, moved};
}

// The fast path of custom_kernel: where `owner` holds a graph of mla_step captured on these very inputs (the same
// tensors' addresses, dtypes, shapes and strides, and knobs), the graph launched on the current stream; else None
// (entry.py's own path runs). A late graph (KBENCH_MLA_LATE) is launched first, then a new output made and its
// address published with kv_len through the late ring; otherwise kv_len is written to `lens` (the last input) by
// the stream before the launch and a copy of the graph's output returned. Off with KBENCH_MLA_FAST_REPLAY=0 and with
// KBENCH_MLA_GRAPH=0.
c10::optional<torch::Tensor> mla_replay(py::object owner, py::tuple inputs, int64_t kv_len) {
  kb::StepTimes& steps = kb::replay_steps();
  steps.start();
  kb::HeldGraphs& held = kb::held_graphs();
  // the knobs' values as of the last call unless a KBENCH_MLA_ variable changed (kb::KnobsMemo; the GIL serialises
  // callers): whether this path and moving graphs are on, and the text of the graphs' knobs
  static kb::KnobsMemo knobs("KBENCH_MLA_");
  static bool fast = false, moving = false;
  static std::string knob_text;
  if (knobs.changed() || graph_knobs_new) {
    fast = fast_replay_on();
    moving = moving_on();
    knob_text = kb::env_text(graph_knobs);
    graph_knobs_new = false;
  }
  if (held.empty() || !fast) return c10::nullopt;
  steps.mark("knobs");
  static std::vector<int64_t> now;
  if (!describe_step(inputs, now, false)) return c10::nullopt;
  steps.mark("describe");
  // one captured on exactly these inputs (benchmark mode's: its maps are the kernels' parameters, no take kernel),
  // else a moving graph (any addresses: leaderboard mode's)
  const kb::HeldGraph* graph = held.find(owner, now, knob_text);
  if (!graph && moving && describe_step(inputs, now, true)) graph = held.find(owner, now, knob_text);
  if (!graph) return c10::nullopt;
  steps.mark("find");
  const torch::Tensor lens = THPVariable_Unpack(inputs[9].ptr());
  const c10::cuda::CUDAGuard guard(lens.device());
  if (graph->late) {
    // The GPU starts on the q projections while the host makes the output. (Should the allocation fail now, the
    // launched graph's append traps after 2 s without its address.)
    kb::launch(*graph);
    steps.mark("launch");
    const torch::Tensor x = THPVariable_Unpack(inputs[0].ptr());
    kb::LateRings* late = late_step(x, false);
    if (graph->moving) {  // its first kernel waits for these
      unsigned long long record[kb::kMovingInputs] = {};
      for (int i = 0; i < kStepMoving; ++i)
        record[i] = reinterpret_cast<unsigned long long>(THPVariable_Unpack(inputs[i].ptr()).data_ptr());
      late->rings[kInputsRing]->publish_record(record, kb::kMovingInputs);
      steps.mark("inputs");
    }
    torch::Tensor out = torch::empty(x.sizes(), x.options());  // [bs, 1, dim], as wo's output
    late->rings[kOutputRing]->publish(out.data_ptr(), static_cast<unsigned>(kv_len));
    steps.mark("output");
    return out;
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (!kb::stream_write(stream, lens.data_ptr(), static_cast<uint32_t>(kv_len))) lens.fill_(kv_len);
  steps.mark("length");
  kb::launch(*graph);
  steps.mark("launch");
  torch::Tensor out = graph->output.cast<torch::Tensor>().clone();  // the graph's buffer: overwritten by its next replay
  steps.mark("output");
  return out;
}

// (step, host us) of each step mla_replay's last call passed: knobs, describe, find, then launch and output (late),
// or length, launch and output (the copy); all where it launched, fewer where it returned None.
std::vector<std::pair<std::string, double>> mla_replay_steps() { return kb::replay_steps().last(); }

// How long (us) the last late graph waited on the GPU for its call's address and length (x's device; call after a
// synchronize), or 0 where none has run there.
double mla_late_wait_us(torch::Tensor x) {
  const kb::LateRings* step = late_step(x, false);
  return step ? step->rings[kOutputRing]->last_wait_us() : 0.0;
}

// How many calls mla_replay served since the last time this was asked (entry.py tells its GraphReplay).
int64_t mla_fast_replays() { return kb::held_graphs().take_replays(); }

