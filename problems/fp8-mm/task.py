"""Types of the fp8-mm problem, as leaderboard submissions import them (``from task import input_t, output_t``)."""
from typing import TypedDict, TypeVar

import torch

# (a [m,k] fp8 e4m3fnuz, b [n,k] fp8 e4m3fnuz, a_scale [m,k/128] fp32, b_scale [n/128,k/128] fp32, c [m,n] bf16);
# a, b and both scales are column-major views (stride 1 along dim 0); c is row-major.
input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor])
# c [m,n] bf16
output_t = TypeVar("output_t", bound=torch.Tensor)


class TestSpec(TypedDict):
    m: int
    n: int
    k: int
    seed: int
