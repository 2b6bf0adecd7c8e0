"""all2all reference: MoE dispatch + combine across ``world_size`` ranks (official semantics: shared/PROBLEMS.md).

Expert e lives on rank owner(e) = e // (num_experts / world_size). Dispatch sends each (token, k) copy of x to its
expert's rank; the simulated expert computes y = x * (1 + owner) in fp16; combine sends y back, and the source rank
accumulates ``out[t] = fp16(fp32(out[t]) + fp32(y) * weights[t, k])``, one k at a time in ascending expert id (the
order in which the official combine receives them: by owner rank, then local expert). Output: fp16 [num_tokens, H].

- ``ref_kernel(data)``: the collective version: counts, tokens and expert outputs really move with all_to_all_single.
- ``ref_kernel_local(rank, **case)``: no collectives. A rank's output depends only on its own tokens, routing and
  weights (the expert is a fixed function of its owner), so regenerating this rank's inputs from seed + rank is
  enough. The expert products and the accumulation are the same fp16/fp32 ops in the same order as in ref_kernel
  and the official reference, so the two are bitwise equal.
"""
import torch
import torch.distributed as dist

from task import MoEConfig, RankTestData, input_t, output_t  # noqa: F401  (re-exported: official names)
from utils import check_rank_output, get_device

RTOL = 1e-2
ATOL = 5e-3


def _check_case(num_experts: int, experts_per_token: int, max_num_tokens: int, world_size: int) -> None:
    if world_size < 1 or num_experts % world_size:
        raise ValueError(f"all2all needs num_experts divisible by world_size (got {num_experts} experts, world_size "
                         f"{world_size}); pick a multiple of world_size")
    if not 1 <= experts_per_token <= num_experts:
        raise ValueError(f"all2all needs 1 <= experts_per_token <= num_experts (got {experts_per_token} of "
                         f"{num_experts}); lower experts_per_token")
    if max_num_tokens < 2:
        raise ValueError(f"all2all draws num_tokens from [1, max_num_tokens), so max_num_tokens must be >= 2 "
                         f"(got {max_num_tokens})")


def _draw_rank(cfg: MoEConfig, rank: int, seed: int, device: torch.device) -> RankTestData:
    """One rank's data, drawn in the official order from seed + rank."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + rank)
    num_tokens = int(torch.randint(1, cfg.max_num_tokens, [1], generator=gen, device=device).item())
    indices = torch.empty((num_tokens, cfg.experts_per_token), dtype=torch.int32, device=device)
    for t in range(num_tokens):
        # One permutation per token, in token order: this is the official draw sequence, so it cannot be batched.
        indices[t] = torch.randperm(cfg.num_experts, generator=gen, device=device)[:cfg.experts_per_token]
    weights = torch.rand((num_tokens, cfg.experts_per_token), dtype=torch.float32, generator=gen, device=device)
    x = torch.randn((num_tokens, cfg.hidden_dim), dtype=cfg.in_dtype, generator=gen, device=device)
    return RankTestData(num_tokens=num_tokens, indices=indices, weights=weights, x=x)


def generate_input(num_experts: int, experts_per_token: int, hidden_dim: int, max_num_tokens: int, seed: int,
                   rank: int, world_size: int) -> input_t:
    """(cfg, rank_data, rank, world_size) of one rank, tensors on utils.get_device(rank)."""
    _check_case(num_experts, experts_per_token, max_num_tokens, world_size)
    cfg = MoEConfig(num_experts=num_experts, experts_per_token=experts_per_token, hidden_dim=hidden_dim,
                    max_num_tokens=max_num_tokens, in_dtype=torch.float16, out_dtype=torch.float16)
    return cfg, _draw_rank(cfg, rank, seed, get_device(rank)), rank, world_size


def _combine(y: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Weighted sum of the expert outputs of each token, rounded to fp16 after every add.

    y fp16 [T, K, H] (expert output of each (token, k)), weights fp32 [T, K], indices int [T, K] -> fp16 [T, H].
    """
    num_tokens, experts_per_token, hidden = y.shape
    order = torch.argsort(indices.long(), dim=1)
    rows = torch.arange(num_tokens, device=y.device)
    out = torch.zeros((num_tokens, hidden), dtype=y.dtype, device=y.device)
    for j in range(experts_per_token):
        k = order[:, j]
        out = (out.float() + y[rows, k].float() * weights[rows, k].unsqueeze(1)).to(y.dtype)
    return out


def ref_kernel(data: input_t) -> output_t:
    """Collective reference: every rank of the process group calls it together."""
    cfg, rank_data, rank, world_size = data
    num_tokens, experts_per_token = rank_data.indices.shape
    device = rank_data.x.device
    per_rank = cfg.num_experts // world_size

    # dispatch: (token, k) copies grouped by destination rank, in (token, k) order within each group
    dest = rank_data.indices.reshape(-1).long() // per_rank
    order = torch.argsort(dest, stable=True)
    send_counts = torch.bincount(dest, minlength=world_size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    received = torch.empty((sum(recv_splits), cfg.hidden_dim), dtype=cfg.in_dtype, device=device)
    dist.all_to_all_single(received, rank_data.x[order // experts_per_token].contiguous(), recv_splits, send_splits)

    # every expert on this rank is the same simulated function of its owner rank
    expert_y = received.to(cfg.out_dtype) * (1 + rank)

    # combine: each copy comes back to its source in the order it was sent
    back = torch.empty((num_tokens * experts_per_token, cfg.hidden_dim), dtype=cfg.out_dtype, device=device)
    dist.all_to_all_single(back, expert_y, send_splits, recv_splits)
    y = torch.empty_like(back)
    y[order] = back
    return _combine(y.view(num_tokens, experts_per_token, cfg.hidden_dim), rank_data.weights, rank_data.indices)


def ref_kernel_local(rank: int, num_experts: int, experts_per_token: int, hidden_dim: int, max_num_tokens: int,
                     seed: int, world_size: int) -> output_t:
    """This rank's expected output, fp16 [num_tokens, hidden_dim] on get_device(rank), with no collectives."""
    cfg, rank_data, _, _ = generate_input(num_experts, experts_per_token, hidden_dim, max_num_tokens, seed,
                                          rank=rank, world_size=world_size)
    owner = rank_data.indices.long() // (num_experts // world_size)
    scale = (1 + owner).to(cfg.out_dtype).unsqueeze(2)                                 # [T, K, 1], exact in fp16
    y = rank_data.x.to(cfg.out_dtype).unsqueeze(1) * scale                             # [T, K, H] fp16
    return _combine(y, rank_data.weights, rank_data.indices)


def compare(output: output_t, expected: output_t) -> tuple[bool, str]:
    """Official tolerance check of one rank's output (type, dtype and device first, then values)."""
    return check_rank_output(output, expected, RTOL, ATOL)


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    """The official check: compare with the collective reference (every rank must call it together)."""
    return compare(output, ref_kernel(data))
