"""mla-decode CUDA backend entry: projections through cuBLAS (torch), absorbed attention in one kernel.

data = (config, x [bs, 1, dim] bf16, kv_cache); output (out [bs, 1, dim] bf16, kv_cache.data with the new row).
Per head h, Wkvu holds W_UK[h] [128, 512] and W_UV[h] [128, 512], so q_nope . (W_UK latent) = (q_nope W_UK) . latent
and sum_t p_t W_UV latent_t = W_UV (sum_t p_t latent_t): attention runs once over the 576-wide latent cache, read in
place by ext.mla_attention (kernels/mla-decode/cuda/attention.cuh), which applies the keys' RoPE on the fly from
cos/sin tables built with the reference's own bf16 ops. `ext` is the load_inline module the template defines above.
Tiny problems (under 256 MB of per-head keys and values, e.g. prefill 1 at batch 16) follow the reference's op order
instead (kernels/mla-decode/_shared/reference_order.py): there its bf16 roundings are as large as the tolerance.
"""
import os

import torch
import torch.nn.functional as F

import reference_order
from task import input_t, output_t

_tables = {}  # (device, max_seq, rope) -> (cos, sin) [max_seq, rope/2] bf16: a constant of the problem


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


def custom_kernel(data: input_t) -> output_t:
    config, x, kv_cache = data
    bs = x.shape[0]
    heads, lora = config.n_heads, config.kv_lora_rank
    nope, rope, dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    if (heads, lora, nope, rope, dv) != (128, 512, 128, 64, 128):
        raise ValueError("the mla-decode cuda backend is built for DeepSeek's dims (128 heads, latent 512, nope 128, "
                         "rope 64, v 128); use the torch backend for others")
    q = F.linear(F.linear(x, config.Q_proj_down_weight), config.Q_proj_up_weight).view(bs, heads, nope + rope)
    kv, kv_len = kv_cache(F.linear(x, config.KV_proj_down_weight))            # writes row seq_len
    if reference_order.affordable(bs, kv_len, config):
        # tiny problems: the reference's bf16 roundings are as large as the tolerance; follow its op order
        y = reference_order.attend(q, kv[..., :lora], kv[..., lora:], config, kv_len)
        return F.linear(y.reshape(bs, 1, heads * dv), config.wo_weight), kv_cache.data
    cos, sin = _rope_tables(kv_cache.data.shape[1], rope, x.device)
    w_kvu = config.KV_proj_up_weight.view(heads, nope + dv, lora)
    q_nope_absorbed = torch.bmm(q[..., :nope].transpose(0, 1), w_kvu[:, :nope])          # [H, bs, lora]
    if os.environ.get("KBENCH_MLA_FUSED_Q") == "1":  # candidate: one launch (docs/mla-decode-notes.md)
        q_full = ext.mla_assemble_q(q_nope_absorbed, q, cos, sin, kv_len - 1)  # noqa: F821 (ext: template)
    else:
        q_full = torch.empty((bs, heads, lora + rope), dtype=x.dtype, device=x.device)
        q_full[..., :lora] = q_nope_absorbed.transpose(0, 1)
        # q's RoPE at position kv_len - 1, as the reference computes it: x * cos + rotate_half(x) * sin in bf16
        c, s = cos[kv_len - 1].repeat(2), sin[kv_len - 1].repeat(2)
        q_rope = q[..., nope:]
        q_full[..., lora:] = q_rope * c + torch.cat((-q_rope[..., rope // 2:], q_rope[..., :rope // 2]), dim=-1) * s
    o_latent = ext.mla_attention(q_full, kv_cache.data, kv_len, cos, sin)  # noqa: F821 (ext: template) [bs, H, lora]
    y = torch.bmm(o_latent.transpose(0, 1), w_kvu[:, nope:].transpose(1, 2))  # [H, bs, v]
    out = F.linear(y.transpose(0, 1).reshape(bs, 1, heads * dv), config.wo_weight)
    return out, kv_cache.data
