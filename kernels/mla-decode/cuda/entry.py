"""mla-decode CUDA backend entry: the whole decode step in one extension call (ext.mla_step, binding.cpp): the
projections through linear.cuh, the per-head GEMMs through head_gemm.cuh, absorbed attention in one kernel.

data = (config, x [bs, 1, dim] bf16, kv_cache); output (out [bs, 1, dim] bf16, kv_cache.data with the new row).
Per head h, Wkvu holds W_UK[h] [128, 512] and W_UV[h] [128, 512], so q_nope . (W_UK latent) = (q_nope W_UK) . latent
and sum_t p_t W_UV latent_t = W_UV (sum_t p_t latent_t): attention runs once over the 576-wide latent cache, read in
place by ext.mla_attention (kernels/mla-decode/cuda/attention.cuh), which applies the keys' RoPE on the fly from
cos/sin tables built with the reference's own bf16 ops. `ext` is the load_inline module the template defines above.
The whole step, the cache append included (KVCache.forward's write done on the device at the row the kernels read
from device memory; the module's counter advanced on the host), is replayed as one CUDA graph while the inputs stay
at their addresses (graph_replay: benchmark mode calls with the same tensors): the GPU starts ~40 us after the call
does, where the host's launches up to the attention kernel used to keep it idle ~300 us (notes, finding 11); one
graph serves the growing cache. The graph takes its inputs' addresses after its launch too (KBENCH_MLA_MOVING,
kernels/_common/moving_inputs.h), so it also serves inputs that move every call (leaderboard mode regenerates them:
notes, finding 51). Without a graph (its first call, or KBENCH_MLA_GRAPH=0) the step runs eagerly, one C++ call
issuing its ~12 launches (Python between them had kept the GPU waiting ~0.5-1 ms: notes, finding 31).
Tiny problems (under 256 MB of per-head keys and values, e.g. prefill 1 at batch 16) follow the reference's op order
instead (kernels/mla-decode/_shared/reference_order.py): there its bf16 roundings are as large as the tolerance.
"""
import os

import torch
import torch.nn.functional as F

import graph_replay
import reference_order
from task import input_t, output_t

_tables = {}  # (device, max_seq, rope) -> (cos, sin) [max_seq, rope/2] bf16: a constant of the problem
_lengths = {}  # device -> int32 [1]: the cache length the kernels read
# keep 4: a moving graph and one on its capture's own addresses for each of two input layouts (_hold)
_graphs = graph_replay.GraphReplay(keep=4, recur=2)
_input_key = graph_replay.InputKey()
# The knobs mla_config (mla_config.h) and linear_config (linear_config.h) read on every call: a captured graph holds
# the configuration they chose, so they are part of its key.
_CONFIG_KNOBS = ("KBENCH_MLA_SPLITS", "KBENCH_MLA_PREFETCH_TABLES", "KBENCH_MLA_S_ONCE", "KBENCH_MLA_ROPE_FIRST",
                 "KBENCH_MLA_SEESAW", "KBENCH_MLA_LINEAR", "KBENCH_MLA_LINEAR_BN", "KBENCH_MLA_LINEAR_SPLITS",
                 "KBENCH_MLA_LINEAR_PDL", "KBENCH_MLA_HEAD_GEMM", "KBENCH_MLA_BULK_STORE",
                 "KBENCH_MLA_STAGED_ST", "KBENCH_MLA_PERSISTENT", "KBENCH_MLA_NARROW_TAIL", "KBENCH_MLA_LATE",
                 "KBENCH_MLA_MOVING", "KBENCH_MLA_FUSED_DOWN", "KBENCH_MLA_ABSORB_UK",
                 "KBENCH_MLA_SPLIT_RELEASE")
_EAGER_FIRST = ("KBENCH_MLA_EAGER_FIRST",)  # (how the Python path orders its work, not what a graph holds)
if not graph_replay.BINDING_LAUNCHES:  # (a graph replayed from Python takes nothing late)
    os.environ.setdefault("KBENCH_MLA_LATE", "0")


def _rope_tables(max_seq: int, rope: int, device: torch.device):
    """cos/sin of the reference's RoPE angles for positions 0 .. max_seq-1, with its ops: theta in bf16 on the
    CPU, einsum(positions, theta) in bf16 on the device, cos/sin rounded to bf16."""
    key = (device, max_seq, rope)
    if key not in _tables:
        half = rope // 2
        theta = (10000 ** (-torch.arange(0, half, dtype=torch.bfloat16) / half)).to(device)
        angles = torch.einsum("s,d->sd", torch.arange(0, max_seq, device=device), theta)
        _tables[key] = (angles.cos().to(torch.bfloat16).contiguous(), angles.sin().to(torch.bfloat16).contiguous())
    return _tables[key]


def _device_length(device: torch.device) -> torch.Tensor:
    """int32 [1] on `device`, one per device for the process: the kernels read the cache length from it, so a
    captured graph (whose launches keep this address) replays for every length."""
    if device not in _lengths:
        _lengths[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _lengths[device]


def custom_kernel(data: input_t) -> output_t:
    config, x, kv_cache = data
    bs = x.shape[0]
    heads, lora = config.n_heads, config.kv_lora_rank
    nope, rope, dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    if (heads, lora, nope, rope, dv) != (128, 512, 128, 64, 128):
        raise ValueError("the mla-decode cuda backend is built for DeepSeek's dims (128 heads, latent 512, nope 128, "
                         "rope 64, v 128); use the torch backend for others")
    if reference_order.affordable(bs, kv_cache.seq_len + 1, config):
        # tiny problems: the reference's bf16 roundings are as large as the tolerance; follow its op order
        kv, kv_len = kv_cache(F.linear(x, config.KV_proj_down_weight))            # writes row seq_len
        q = F.linear(F.linear(x, config.Q_proj_down_weight), config.Q_proj_up_weight).view(bs, heads, nope + rope)
        y = reference_order.attend(q, kv[..., :lora], kv[..., lora:], config, kv_len)
        return F.linear(y.reshape(bs, 1, heads * dv), config.wo_weight), kv_cache.data
    cache = kv_cache.data
    kv_len = kv_cache.seq_len + 1
    if kv_len > cache.shape[1] or cache.dtype != torch.bfloat16:
        raise ValueError(f"the cache holds {cache.shape[1]} rows of {cache.dtype}: no room for row {kv_len - 1} "
                         f"(build it with a larger max_seq_len, in bf16)")
    cos, sin = _rope_tables(cache.shape[1], rope, x.device)
    lens = _device_length(x.device)
    inputs = (x, cache, config.KV_proj_down_weight, config.Q_proj_down_weight, config.Q_proj_up_weight,
              config.KV_proj_up_weight, config.wo_weight, cos, sin, lens)
    # The fast path: where the binding holds a graph captured on these inputs, it launches the graph, then makes the
    # output and hands the graph its address and the cache length through mapped memory (KBENCH_MLA_LATE; =0: the
    # length written by the stream before the launch and the graph's output copied), in this one call (the host runs
    # slowly right after the timer's synchronize: kernels/_common/held_graphs.h); KBENCH_MLA_FAST_REPLAY=0 (candidate
    # py-replay) and KBENCH_MLA_GRAPH=0 skip it.
    out = ext.mla_replay(_graphs, inputs, kv_len)  # noqa: F821 (ext: template)
    if out is None:
        if ext.mla_fast_replays():  # noqa: F821 (ext: template)
            _graphs.replayed_elsewhere()
        out = _python_path(inputs, kv_len)
    kv_cache.seq_len = kv_len  # what KVCache.forward does after its append (the append ran in the step)
    return out, cache


def _python_path(inputs: tuple, kv_len: int) -> torch.Tensor:
    """The step through graph_replay (captured on a key's first call, replayed after; each capture also held by the
    binding for mla_replay), or eagerly with KBENCH_MLA_GRAPH=0. inputs: x, cache, the five weights, cos, sin, lens.
    An eager mla_step writes the length itself; a graph replayed from here reads it from lens, written first. Where
    GraphReplay holds no graph (the binding holds the late ones), the step launches before the key is read
    (leaderboard mode's calls, eager: notes, finding 50; KBENCH_MLA_EAGER_FIRST=0, candidate `key-first`: the key
    and the length first, the build before)."""
    # moving_ok: a capture may take its inputs' addresses late (KBENCH_MLA_MOVING)
    step = lambda moving_ok=True: ext.mla_step(*inputs[:7], kv_len, *inputs[7:], moving_ok)  # noqa: E731,F821
    if os.environ.get("KBENCH_MLA_GRAPH") == "0":  # the launches one by one (docs/mla-decode-notes.md)
        return step()
    key = lambda: _input_key(inputs, graph_replay.env_values(_CONFIG_KNOBS))  # noqa: E731
    if len(_graphs) or graph_replay.env_values(_EAGER_FIRST)[0] in graph_replay.OFF:
        inputs[-1].fill_(kv_len)
        key = key()
    out = _graphs.replay(key, step, on_capture=lambda graph, output: _hold(graph, output, inputs, step))
    if _graphs.replayed:  # the graph's own buffer, overwritten by its next replay
        out = out.clone()
    return out


def _hold(graph, output: torch.Tensor, inputs: tuple, step) -> bool:
    """GraphReplay's on_capture: the new graph also held by the binding, for mla_replay. True where the graph takes
    its output's address and the cache length after the launch (KBENCH_MLA_LATE): then only mla_replay launches it.
    Where it is a moving graph (its inputs' addresses taken late), a second graph of the same call, on these inputs'
    own addresses, is held beside it: mla_replay launches that one while the inputs stay put (benchmark mode), where
    the moving graph's take kernel and maps in device memory cost ~2% (notes, finding 51)."""
    if not graph_replay.BINDING_LAUNCHES:  # (older torch keeps the Python path)
        return False
    late, moving = ext.mla_hold_graph(_graphs, graph, graph.raw_cuda_graph_exec(), output, inputs,  # noqa: F821
                                      list(_CONFIG_KNOBS))
    if moving:
        exact, exact_output = _graphs.capture_beside(lambda: step(False))
        ext.mla_hold_graph(_graphs, exact, exact.raw_cuda_graph_exec(), exact_output, inputs,  # noqa: F821
                           list(_CONFIG_KNOBS))
    return late
