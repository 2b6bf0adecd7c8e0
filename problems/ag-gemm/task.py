"""Types of the ag-gemm problem, under the names leaderboard submissions import (``from task import input_t, output_t``).

data = (A, W, bias) on ``cuda:rank`` (or the CPU for CPU runs), with ws = world size:
  A     bf16 [m/ws, k]  row-major: this rank's rows of the activation
  W     bf16 [n/ws, k]  row-major: this rank's rows of the weight (the GEMM uses W^T)
  bias  bf16 [n/ws] or None: this rank's own
output: bf16 [m, n/ws]: all_gather(A) (rank order) @ W^T + bias.
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
