"""mla-decode: one multi-head latent attention decode step in bf16, the amd-mla-decode leaderboard's judge.

Every op is the official reference's, in its order and in bf16: down-project x, append the new latent row to the cache,
up-project q and the whole cached latent per head, RoPE (bf16 angles), softmax(q k^T / sqrt(192)) v, output
projection. The official one does the middle part for all batch rows at once, which needs ~1 GB per batch row at
prefill 6144 (51 GB of k/v for batch 128 plus scores) and runs out of memory on an 80 GB GPU; here that part runs in
chunks of batch rows. Rows never interact and every op there is row-wise, so the numbers do not change.
"""
import dataclasses
import math

import torch
import torch.nn.functional as F

from task import Config, KVCache, input_t, output_t  # noqa: F401  (Config/KVCache: official home is reference.py)
from utils import get_device, make_match_reduced

RTOL, ATOL = 2e-2, 8e-3

# Fixed by the problem (DeepSeek-R1); tiny CPU smoke cases may override them through optional case keys.
OFFICIAL_DIMS = {"n_heads": 128, "max_seq_len": 8192, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                 "qk_rope_head_dim": 64, "v_head_dim": 128}

_WEIGHTS = ("Q_proj_down_weight", "Q_proj_up_weight", "KV_proj_down_weight", "KV_proj_up_weight", "wo_weight")


def generate_input(batchsize: int, dim: int, dq: int, prefill: int, seed: int, **dims) -> input_t:
    """Draw the official inputs: one generator on the judging device, seeded once, in the official order.

    Wqd, Wkvd, Wqu, Wkvu, Wo (each randn(bf16) / sqrt(fan_in)), x, then the prefilled cache rows.
    ``dims`` may override OFFICIAL_DIMS (smoke cases only; official cases never carry these keys).
    Returns (config, x [batchsize, 1, dim] bf16, kv_cache with `prefill` rows filled).
    """
    unknown = set(dims) - set(OFFICIAL_DIMS)
    if unknown:
        raise TypeError(f"mla-decode generate_input got unknown keys {sorted(unknown)}; "
                        f"case keys are batchsize, dim, dq, prefill, seed (+ optional {', '.join(OFFICIAL_DIMS)})")
    d = {**OFFICIAL_DIMS, **dims}
    heads, rank, nope, rope, v = (d["n_heads"], d["kv_lora_rank"], d["qk_nope_head_dim"], d["qk_rope_head_dim"],
                                  d["v_head_dim"])
    if prefill + 1 > d["max_seq_len"]:
        raise ValueError(f"prefill {prefill} leaves no room for the decoded row in max_seq_len {d['max_seq_len']}; "
                         f"use prefill < max_seq_len")
    device = get_device()
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def draw(shape, fan_in: int) -> torch.Tensor:
        return torch.randn(shape, dtype=torch.bfloat16, device=device, generator=gen) / math.sqrt(fan_in)

    q_down = draw((dq, dim), dim)
    kv_down = draw((rank + rope, dim), dim)
    q_up = draw(((nope + rope) * heads, dq), dq)
    kv_up = draw(((nope + v) * heads, rank), rank)
    wo = draw((dim, heads * v), heads * v)
    cache_shape = (batchsize, d["max_seq_len"], rank + rope)
    config = Config(batch_size=batchsize, dim=dim, n_heads=heads, q_lora_rank=dq, kv_lora_rank=rank,
                    qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v, seq_len=1,
                    max_seq_len=d["max_seq_len"], kv_cache_shape=cache_shape, Q_proj_down_weight=q_down,
                    Q_proj_up_weight=q_up, KV_proj_down_weight=kv_down, KV_proj_up_weight=kv_up, wo_weight=wo)
    x = torch.randn((batchsize, 1, dim), dtype=torch.bfloat16, device=device, generator=gen)
    kv_cache = KVCache(cache_shape, device=device)
    kv_cache(torch.randn((batchsize, prefill, rank + rope), dtype=torch.bfloat16, device=device, generator=gen))
    return config, x, kv_cache


def copy_data(data: input_t) -> input_t:
    """Independent copies of (config weights, x, kv_cache), for checking after a submission has mutated the originals.

    The official mla-decode harness hands the submission the originals and checks against such copies.
    """
    config, x, kv_cache = data
    config = dataclasses.replace(config, **{name: getattr(config, name).clone() for name in _WEIGHTS})
    cache = KVCache(tuple(kv_cache.data.shape), device=kv_cache.data.device)
    cache.data.copy_(kv_cache.data)
    cache.seq_len = kv_cache.seq_len
    return config, x.clone(), cache


def _rope(x: torch.Tensor, start: int) -> torch.Tensor:
    """Rotary embedding of x [..., s, d] bf16 at positions start..start+s-1, bf16 throughout as officially.

    theta is computed on the CPU in bf16 (the official module builds it there and then moves it); angles come from
    the same einsum of int64 positions with bf16 theta, so they are rounded to bf16 (the problem's definition).
    """
    seq, width = x.size(-2), x.size(-1)
    half = width // 2
    theta = (10000 ** (-torch.arange(0, half, dtype=torch.bfloat16) / half)).to(x.device)
    positions = torch.arange(start, start + seq, device=x.device)
    angles = torch.einsum("s,d->sd", positions, theta)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def _rows_per_chunk(config: Config, kv_len: int, device: torch.device) -> int:
    """How many batch rows of the per-head attention fit a memory budget (bytes of bf16 intermediates per row)."""
    heads = config.n_heads
    per_row = 2 * kv_len * (heads * (config.qk_nope_head_dim + config.v_head_dim)     # up-projected latent
                            + heads * (config.qk_nope_head_dim + config.qk_rope_head_dim)  # k
                            + heads * config.v_head_dim                                     # v made contiguous
                            + config.kv_lora_rank + 4 * config.qk_rope_head_dim)          # latent copy, rope
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = min(8 << 30, free // 2)
    else:
        budget = 2 << 30
    return max(1, min(config.batch_size, budget // per_row))


def _attention(q: torch.Tensor, latent_rope: torch.Tensor, config: Config) -> torch.Tensor:
    """Per-head attention of the decoded query over the whole cache, official op order.

    q [rows, heads, 1, nope+rope] bf16 (RoPE applied); latent_rope [rows, kv_len, kv_lora_rank + rope] bf16 (a view of
    the cache). Returns [rows, heads, 1, v_head_dim] bf16.
    """
    rows, kv_len = latent_rope.shape[:2]
    heads, nope, rope, v_dim = config.n_heads, config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    latent, k_rope = torch.split(latent_rope, [config.kv_lora_rank, rope], dim=-1)
    kv = F.linear(latent, config.KV_proj_up_weight).view(rows, kv_len, heads, nope + v_dim)
    k_nope, v = torch.split(kv, [nope, v_dim], dim=-1)
    k_rope = _rope(k_rope[:, None, :, :], 0).expand(-1, heads, -1, -1)
    k = torch.concat([k_nope.permute(0, 2, 1, 3), k_rope], dim=-1)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(nope + rope)
    attn = F.softmax(scores, dim=-1).to(torch.bfloat16)
    return torch.matmul(attn, v.permute(0, 2, 1, 3))


def mla_decode(config: Config, x: torch.Tensor, kv_cache: KVCache, rows_per_chunk: int | None = None) -> output_t:
    """The official forward; appends x's latent row to kv_cache (as the official one does) and returns
    (out [batch, 1, dim] bf16, kv_cache.data). rows_per_chunk=None sizes chunks from free memory."""
    batch, seq, _ = x.shape
    heads, nope, rope = config.n_heads, config.qk_nope_head_dim, config.qk_rope_head_dim
    q_lora = F.linear(x, config.Q_proj_down_weight)
    kv_lora = F.linear(x, config.KV_proj_down_weight)
    cached, kv_len = kv_cache(kv_lora)
    q = F.linear(q_lora, config.Q_proj_up_weight).view(batch, seq, heads, nope + rope)
    q_nope, q_rope = torch.split(q, [nope, rope], dim=-1)
    q_rope = _rope(q_rope.permute(0, 2, 1, 3), kv_len - 1)
    q = torch.concat([q_nope.permute(0, 2, 1, 3), q_rope], dim=-1)

    step = rows_per_chunk or _rows_per_chunk(config, kv_len, x.device)
    y = torch.empty((batch, heads, seq, config.v_head_dim), dtype=torch.bfloat16, device=x.device)
    for start in range(0, batch, step):
        stop = min(start + step, batch)
        y[start:stop] = _attention(q[start:stop], cached[start:stop], config)
    out = F.linear(y.view(batch, 1, -1), config.wo_weight)
    return out, kv_cache.get_data()


def ref_kernel(data: input_t) -> output_t:
    """(out [batch, 1, dim] bf16, full cache [batch, max_seq_len, 576] bf16 incl. the new row); mutates data's cache."""
    config, x, kv_cache = data
    return mla_decode(config, x, kv_cache)


check_implementation = make_match_reduced(ref_kernel, rtol=RTOL, atol=ATOL)
