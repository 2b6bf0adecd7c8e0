"""Types of the mla-decode problem and the two classes its inputs are made of.

Leaderboard submissions read ``config.Q_proj_down_weight``, call ``kv_cache(c_kv)`` and so on, so ``Config`` and
``KVCache`` keep the official names and behaviour. Officially they live in reference.py; reference.py re-exports
them, so both ``from task import KVCache`` and ``from reference import KVCache`` work.
"""
from dataclasses import dataclass
from typing import TypedDict, TypeVar

import torch
from torch import nn


@dataclass
class Config:
    """Model dimensions and the five bf16 projection weights (nn.Linear layout: [out_features, in_features])."""
    batch_size: int
    dim: int
    n_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    seq_len: int
    max_seq_len: int
    kv_cache_shape: tuple
    Q_proj_down_weight: torch.Tensor   # [q_lora_rank, dim]
    Q_proj_up_weight: torch.Tensor     # [(qk_nope_head_dim + qk_rope_head_dim) * n_heads, q_lora_rank]
    KV_proj_down_weight: torch.Tensor  # [kv_lora_rank + qk_rope_head_dim, dim]
    KV_proj_up_weight: torch.Tensor    # [(qk_nope_head_dim + v_head_dim) * n_heads, kv_lora_rank]
    wo_weight: torch.Tensor            # [dim, v_head_dim * n_heads]


class KVCache(nn.Module):
    """The latent cache: ``data`` [batch, max_seq_len, kv_lora_rank + qk_rope_head_dim] bf16, filled up to ``seq_len``.

    ``device`` is a kbench addition (the official one is built on the CPU and moved); ``KVCache(shape)`` still works.
    """

    def __init__(self, kv_cache_shape: tuple, device=None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.register_buffer("data", torch.zeros(kv_cache_shape, dtype=torch.bfloat16, device=device))
        self.seq_len = 0

    def zero(self) -> None:
        self.data.zero_()

    def get_data(self) -> torch.Tensor:
        return self.data

    def forward(self, c_kv: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Append c_kv [batch, new, width] at position seq_len; return (data[:, :seq_len], seq_len) after the append."""
        new = c_kv.size(1)
        if self.seq_len + new > self.data.size(1):
            raise ValueError(f"KV cache exceeded: {self.seq_len} + {new} rows > max_seq_len {self.data.size(1)}; "
                             f"build the cache with a larger max_seq_len")
        self.data = self.data.to(c_kv.dtype)
        self.data[:, self.seq_len:self.seq_len + new, :] = c_kv
        self.seq_len += new
        return self.data[:, :self.seq_len], self.seq_len


# (config, x [batch, 1, dim] bf16, kv_cache holding `prefill` rows)
input_t = TypeVar("input_t", bound=tuple[Config, torch.Tensor, KVCache])
# (out [batch, 1, dim] bf16, kv_cache.data [batch, max_seq_len, kv_lora_rank + qk_rope_head_dim] bf16 with the new row)
output_t = TypeVar("output_t", bound=tuple[torch.Tensor, torch.Tensor])


class TestSpec(TypedDict):
    batchsize: int
    dim: int
    dq: int
    prefill: int
    seed: int
