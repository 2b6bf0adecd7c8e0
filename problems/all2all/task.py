"""Types of the all2all problem, under the names leaderboard submissions use.

data = (cfg, rank_data, rank, world_size):
  cfg        MoEConfig (the same on every rank)
  rank_data  RankTestData, tensors on ``cuda:rank`` (or the CPU for CPU runs), T = rank_data.num_tokens:
               indices  int32 [T, experts_per_token]  distinct global expert ids per token
               weights  fp32  [T, experts_per_token]  routing weight of each chosen expert
               x        fp16  [T, hidden_dim]         the tokens to dispatch
output: fp16 [T, hidden_dim], out[t] = sum over k of fp32(x[t] * (1 + owner(indices[t, k]))) * weights[t, k],
accumulated into fp16 (owner(e) = e // (num_experts / world_size)).
The official reference defines MoEConfig and RankTestData in reference.py; reference.py re-exports these, so a
submission importing them from either module runs unchanged.
"""
import dataclasses
from typing import TypedDict, TypeVar

import torch


@dataclasses.dataclass
class MoEConfig:
    num_experts: int
    experts_per_token: int
    hidden_dim: int
    max_num_tokens: int
    in_dtype: torch.dtype = torch.float16
    out_dtype: torch.dtype = torch.float16


@dataclasses.dataclass
class RankTestData:
    """One rank's tokens and routing (field names as in the official reference)."""
    num_tokens: int
    indices: torch.Tensor
    weights: torch.Tensor
    x: torch.Tensor


input_t = TypeVar("input_t", bound=tuple[MoEConfig, RankTestData, int, int])
output_t = TypeVar("output_t", bound=torch.Tensor)


class TestSpec(TypedDict):
    num_experts: int
    experts_per_token: int
    hidden_dim: int
    max_num_tokens: int
    seed: int
    world_size: int
