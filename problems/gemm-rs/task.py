"""Types of the gemm-rs problem, under the names leaderboard submissions import (``from task import input_t, output_t``).

data = (A, W, bias) on ``cuda:rank`` (or the CPU for CPU runs), with ws = world size:
  A     bf16 [m, k/ws]  row-major: this rank's slice of the reduction dimension
  W     bf16 [n, k/ws]  row-major: this rank's slice of the weight (the GEMM uses W^T)
  bias  bf16 [n] or None: the same on every rank
output: bf16 [m/ws, n]: rows [rank*m/ws, (rank+1)*m/ws) of sum over ranks of (A_r W_r^T + bias).
"""
from typing import Optional, TypedDict, TypeVar

import torch

input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]])
output_t = TypeVar("output_t", bound=torch.Tensor)


class TestSpec(TypedDict):
    world_size: int
    m: int
    n: int
    k: int
    has_bias: bool
    seed: int
