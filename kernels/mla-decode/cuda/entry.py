"""mla-decode CUDA backend entry: absorbed attention in one kernel, wo through linear.cuh, the other projections
through cuBLAS (torch).

data = (config, x [bs, 1, dim] bf16, kv_cache); output (out [bs, 1, dim] bf16, kv_cache.data with the new row).
Per head h, Wkvu holds W_UK[h] [128, 512] and W_UV[h] [128, 512], so q_nope . (W_UK latent) = (q_nope W_UK) . latent
and sum_t p_t W_UV latent_t = W_UV (sum_t p_t latent_t): attention runs once over the 576-wide latent cache, read in
place by ext.mla_attention (kernels/mla-decode/cuda/attention.cuh), which applies the keys' RoPE on the fly from
cos/sin tables built with the reference's own bf16 ops. `ext` is the load_inline module the template defines above.
The whole step, the cache append included (KVCache.forward's write done on the device at the row the kernels read
from device memory; the module's counter advanced on the host), is replayed as one CUDA graph while the inputs stay
at their addresses (graph_replay: benchmark mode calls with the same tensors): the GPU starts ~40 us after the call
does, where the host's launches up to the attention kernel used to keep it idle ~300 us (notes, finding 11); one
graph serves the growing cache.
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
_side_streams = {}  # device -> torch.cuda.Stream
_graphs = graph_replay.GraphReplay()
_input_key = graph_replay.InputKey()
# The knobs mla_config (mla_config.h) and linear_config (linear_config.h) read on every call: a captured graph holds
# the configuration they chose, so they are part of its key.
_CONFIG_KNOBS = ("KBENCH_MLA_SPLITS", "KBENCH_MLA_PREFETCH_TABLES", "KBENCH_MLA_S_ONCE", "KBENCH_MLA_ROPE_FIRST",
                 "KBENCH_MLA_SEESAW", "KBENCH_MLA_LINEAR", "KBENCH_MLA_LINEAR_BN", "KBENCH_MLA_LINEAR_SPLITS",
                 "KBENCH_MLA_LINEAR_PDL")


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


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for the process (the cache append runs there, joined before the attention)."""
    if device not in _side_streams:
        _side_streams[device] = torch.cuda.Stream(device)
    return _side_streams[device]


def _step(config, x: torch.Tensor, cache: torch.Tensor, kv_len: int, cos, sin, lens) -> torch.Tensor:
    """The whole decode step: the new cache row, q projections, absorption, attention, W_UV and wo. x [bs, 1, dim]
    bf16, cache [bs, max_seq, 576] bf16 holding kv_len - 1 rows (row kv_len - 1 is written here), lens int32 [1]
    holding kv_len on the device. Returns [bs, 1, dim]. Captured as one graph (graph_replay): nothing here may
    depend on kv_len on the host but mla_attention's configuration (the kernels and the append read lens)."""
    bs = x.shape[0]
    heads, lora = config.n_heads, config.kv_lora_rank
    nope, rope, dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    # KVCache.forward's append (data[:, seq_len] = c_kv) at the row lens - 1 read on the device, so that the append
    # is inside the graph (the host's first launch is the graph's). In a graph it runs on a side stream beside the q
    # projections, which leave most SMs idle at 128 rows; run eagerly (inputs that move, leaderboard mode) the host's
    # launches are the bottleneck, and the fork and join would only add to them.
    main = torch.cuda.current_stream()
    side = _side_stream(x.device) if torch.cuda.is_current_stream_capturing() else main
    if side is not main:
        side.wait_stream(main)
    with torch.cuda.stream(side):
        cache.index_copy_(1, (lens - 1).long(), F.linear(x, config.KV_proj_down_weight))
    q = F.linear(F.linear(x, config.Q_proj_down_weight), config.Q_proj_up_weight).view(bs, heads, nope + rope)
    w_kvu = config.KV_proj_up_weight.view(heads, nope + dv, lora)
    # q_full [bs, H, 576] = (q_nope W_UK) | q_rope with the reference's RoPE at kv_len - 1. The per-head bmm writes
    # its [H, bs, lora] result straight into q_full's latent columns (cuBLAS takes the strided output as it is:
    # ldc = H * 576, batch stride 576), so no transpose pass; ext.mla_rope_q writes the rope columns.
    q_full = torch.empty(bs, heads, lora + rope, device=x.device, dtype=x.dtype)
    torch.bmm(q[..., :nope].transpose(0, 1), w_kvu[:, :nope], out=q_full[..., :lora].transpose(0, 1))
    ext.mla_rope_q(q_full, q, cos, sin, lens)  # noqa: F821 (ext: template)
    if side is not main:
        main.wait_stream(side)  # the attention reads the new row
    o_latent = ext.mla_attention(q_full, cache, kv_len, cos, sin, lens)  # noqa: F821 (ext: template) [bs, H, lora]
    # y [bs, H, v], written by the per-head bmm through a transposed view: wo reads it as [bs, H * v] in place
    y = torch.empty(bs, heads, dv, device=x.device, dtype=x.dtype)
    torch.bmm(o_latent.transpose(0, 1), w_kvu[:, nope:].transpose(1, 2), out=y.transpose(0, 1))
    # wo through linear.cuh where its configuration fits (linear_config.h; KBENCH_MLA_LINEAR=0: cuBLAS): 93 -> 88 us.
    # The q projections stay with cuBLAS, which reads their W as fast as torch.sum does (docs/mla-decode-notes.md,
    # finding 24).
    return ext.mla_linear(y.view(bs, 1, heads * dv), config.wo_weight)  # noqa: F821 (ext: template)


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
    lens.fill_(kv_len)
    step = lambda: _step(config, x, cache, kv_len, cos, sin, lens)  # noqa: E731
    if os.environ.get("KBENCH_MLA_GRAPH") == "0":  # the launches one by one (docs/mla-decode-notes.md)
        out = step()
    else:
        key = _input_key((x, cache, config.KV_proj_down_weight, config.Q_proj_down_weight, config.Q_proj_up_weight,
                          config.KV_proj_up_weight, config.wo_weight, cos, sin, lens),
                         graph_replay.env_values(_CONFIG_KNOBS))
        out = _graphs.replay(key, step).clone()
    kv_cache.seq_len = kv_len  # what KVCache.forward does after its append (the append ran in the step)
    return out, cache
