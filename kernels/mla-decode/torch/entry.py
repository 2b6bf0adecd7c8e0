"""mla-decode in plain PyTorch: one decode step of multi-head latent attention with the up-projections absorbed.

data = (config, x, kv_cache):
  config: Q_proj_down_weight Wqd [dq, dim], Q_proj_up_weight Wqu [H*(nope+rope), dq], KV_proj_down_weight
    Wkvd [lora+rope, dim], KV_proj_up_weight Wkvu [H*(nope+v), lora], wo_weight Wo [dim, H*v], all bf16;
    n_heads H=128, kv_lora_rank lora=512, qk_nope_head_dim nope=128, qk_rope_head_dim rope=64, v_head_dim v=128.
  x [bs, 1, dim] bf16; kv_cache: module with .data [bs, max_seq, lora+rope] bf16 holding `seq_len` rows, and
    kv_cache(c_kv) appending c_kv [bs, 1, lora+rope] and returning (data[:, :seq_len], seq_len).
Output: (out [bs, 1, dim] bf16, kv_cache.data) with the new latent row written at the old seq_len.

Absorption (why it is fast): per head h, Wkvu holds W_UK[h] [nope, lora] and W_UV[h] [v, lora], so
  q_nope . (W_UK latent) = (q_nope W_UK) . latent   and   sum_t p_t W_UV latent_t = W_UV (sum_t p_t latent_t).
Attention then runs once over the 576-wide latent cache, read in place (no per-head keys/values, no cache copy);
only the 64 rope columns of the cache are rotated into a small new tensor.
"""
import math

import torch

from task import input_t, output_t


# theta per (rope width, device): a constant of the problem, not of the inputs, so it is built once.
_thetas = {}


def _theta(width: int, device: torch.device) -> torch.Tensor:
    """[width/2] bf16 inverse frequencies, computed on the CPU as the reference does (CPU and GPU pow can round
    differently in bf16), then moved once."""
    key = (width, device)
    if key not in _thetas:
        half = width // 2
        _thetas[key] = (10000 ** (-torch.arange(0, half, dtype=torch.bfloat16) / half)).to(device)
    return _thetas[key]


def _rope(x: torch.Tensor, start: int) -> torch.Tensor:
    """RoPE exactly as the reference computes it, in bf16 (its coarse bf16 angles included, so the rotations match):
    x [..., s, r] at positions start..start+s-1 -> same shape."""
    s, r = x.shape[-2], x.shape[-1]
    positions = torch.arange(start, start + s, device=x.device)
    angles = torch.einsum("s,d->sd", positions, _theta(r, x.device))
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def custom_kernel(data: input_t) -> output_t:
    config, x, kv_cache = data
    bs = x.shape[0]
    heads, lora = config.n_heads, config.kv_lora_rank
    nope, rope, dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim

    xt = x.view(bs, -1)
    q = (xt @ config.Q_proj_down_weight.T) @ config.Q_proj_up_weight.T        # [bs, H*(nope+rope)]
    q = q.view(bs, heads, nope + rope)
    kv, kv_len = kv_cache((xt @ config.KV_proj_down_weight.T).view(bs, 1, lora + rope))  # writes row seq_len
    latent, k_rope = kv[..., :lora], kv[..., lora:]                            # [bs, kv_len, lora|rope] views

    w_kvu = config.KV_proj_up_weight.view(heads, nope + dv, lora)
    w_uk, w_uv = w_kvu[:, :nope], w_kvu[:, nope:]                              # [H, nope|v, lora]
    # q_nope absorbed into the latent space, one [bs, nope] x [nope, lora] GEMM per head.
    q_latent = torch.bmm(q[..., :nope].transpose(0, 1), w_uk).transpose(0, 1)  # [bs, H, lora]
    q_rope = _rope(q[..., nope:].unsqueeze(2), kv_len - 1).squeeze(2)         # [bs, H, rope], query at kv_len-1
    k_rope = _rope(k_rope, 0)                                                  # [bs, kv_len, rope]

    scale = 1.0 / math.sqrt(nope + rope)
    scores = torch.baddbmm(torch.bmm(q_rope, k_rope.transpose(1, 2)), q_latent, latent.transpose(1, 2),
                           beta=scale, alpha=scale)                            # [bs, H, kv_len]
    p = scores.softmax(dim=-1)
    o_latent = torch.bmm(p, latent)                                            # [bs, H, lora]
    y = torch.bmm(o_latent.transpose(0, 1), w_uv.transpose(1, 2))              # [H, bs, v]
    out = y.transpose(0, 1).reshape(bs, heads * dv) @ config.wo_weight.T      # [bs, dim]
    return out.view(bs, 1, -1), kv_cache.data
