"""all2all CUDA backend entry: dispatch and combine straight over NVLink through a symmetric buffer.

data = (cfg, rank_data, rank, world_size); rank_data: num_tokens T, indices [T, K] int32, weights [T, K] fp32,
x [T, H] fp16. Output [T, H] fp16. Every rank calls this together (the official harness does). The buffer is
allocated and mapped once per process (symm.py, a collective on first use); each call is one epoch: four kernels
(ext.a2a_forward, kernels/all2all/cuda/all2all.cuh), no host synchronisation, no NCCL call, after the first.
`ext` is the load_inline module the template defines above this code.
"""
import torch

import layout
import symm
from task import input_t, output_t

_calls = [0]       # this process's call count: the epoch, the same on every rank
_scratch = {}      # (device, P) -> int32 [P + 2]: pair slots, then two counters that are zero between calls


def custom_kernel(data: input_t) -> output_t:
    cfg, rank_data, rank, world_size = data
    x = rank_data.x.contiguous()
    lay = layout.layout(world_size, cfg.max_num_tokens, cfg.experts_per_token, cfg.hidden_dim)
    _, peers = symm.buffer(lay.nbytes, x.device)
    key = (x.device, lay.P)
    if key not in _scratch:
        _scratch[key] = torch.zeros(lay.P + 2, dtype=torch.int32, device=x.device)
    _calls[0] += 1
    return ext.a2a_forward(x, rank_data.indices.to(torch.int32).contiguous(),  # noqa: F821 (ext: template)
                           rank_data.weights.to(torch.float32).contiguous(), peers, rank,
                           cfg.num_experts // world_size, lay.offsets(), _scratch[key], _calls[0])
