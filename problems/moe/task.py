"""Types of the moe problem, as leaderboard submissions import them (``from task import input_t, output_t``)."""
from typing import TypedDict, TypeVar

import torch

# (x [bs, seqlen, dhidden] fp16,
#  weights: {"router.weight": [E, dhidden],
#            "experts.{i}.0.weight" (gate) / "experts.{i}.1.weight" (up): [dhidden, dexpert],
#            "experts.{i}.2.weight" (down): [dexpert, dhidden],
#            "shared_experts.0.weight" / ".1.weight": [dhidden, dexpert*S], "shared_experts.2.weight": [dexpert*S, dhidden]},
#            all fp16 row-major,
#  config: {d_hidden, d_expert, n_routed_experts, n_shared_experts, n_experts_per_token, batch_size, seq_len})
input_t = TypeVar("input_t", bound=tuple[torch.Tensor, dict[str, torch.Tensor], dict])
# [bs, seqlen, dhidden] fp16
output_t = TypeVar("output_t", bound=torch.Tensor)


class TestSpec(TypedDict):
    dhidden: int
    dexpert: int
    nroutedexperts: int
    nsharedexperts: int
    nexpertspertoken: int
    bs: int
    seqlen: int
    seed: int
