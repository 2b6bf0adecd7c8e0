"""all2all in plain PyTorch: MoE dispatch + combine over torch.distributed.all_to_all_single, no per-token loops.

data = (cfg, rank_data, rank, world_size):
  cfg: num_experts, experts_per_token (k), hidden_dim (d), max_num_tokens, in_dtype = out_dtype = fp16.
  rank_data: num_tokens (T), indices [T, k] int32 expert ids, weights [T, k] fp32, x [T, d] fp16.
Expert e lives on rank e // (num_experts / world_size) and computes y = x * (1 + that rank) in fp16.
Output: [T, d] fp16, out[t] = sum_j fp32(y[t, j]) * weights[t, j] (summed in fp32, rounded once).

Works with NCCL on GPUs and gloo on CPUs (both implement all_to_all_single with uneven splits).
"""
import torch
import torch.distributed as dist

from task import input_t, output_t


def _exchange(rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
    """Rows [sum(send_counts), d], grouped by destination rank -> rows [sum(recv_counts), d] grouped by source."""
    out = rows.new_empty((sum(recv_counts), rows.shape[1]))
    dist.all_to_all_single(out, rows, output_split_sizes=recv_counts, input_split_sizes=send_counts)
    return out


def custom_kernel(data: input_t) -> output_t:
    cfg, rank_data, rank, world_size = data
    x, indices, weights = rank_data.x, rank_data.indices, rank_data.weights
    n_tokens, k = indices.shape
    experts_per_rank = cfg.num_experts // world_size

    # Dispatch: every (token, slot) copy of x, grouped by the rank that owns its expert.
    dest = (indices.reshape(-1).long() // experts_per_rank)
    order = torch.argsort(dest, stable=True)
    send = torch.bincount(dest, minlength=world_size)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_counts, recv_counts = send.tolist(), recv.tolist()  # host sync: split sizes must be Python ints
    token = order // k
    received = _exchange(x.index_select(0, token), send_counts, recv_counts)

    # The simulated expert: everything this rank received is for one of its own experts.
    y = received * (1 + rank)

    # Combine: results come back in the order they were sent; weight in fp32 and sum per token.
    back = _exchange(y, recv_counts, send_counts)
    out = torch.zeros((n_tokens, x.shape[1]), dtype=torch.float32, device=x.device)
    out.index_add_(0, token, back.float() * weights.reshape(-1)[order].unsqueeze(1))
    return out.to(cfg.out_dtype)
