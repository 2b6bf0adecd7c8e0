"""ag-gemm reference: all-gather + GEMM across ``world_size`` ranks (official semantics: shared/PROBLEMS.md).

Rank r holds A_r bf16 [m/ws, k], W_r bf16 [n/ws, k] and its own bias_r bf16 [n/ws] (or None); its output is
all_gather(A) in rank order ([m, k]) @ W_r^T + bias_r, bf16 [m, n/ws].

- ``ref_kernel(data)``: the official collective computation (all-gather, then one bf16 GEMM and the bias add).
- ``ref_kernel_local(rank, **case)``: the same ops on the same numbers with no collectives: it regenerates every
  rank's A (the first draw of each rank's generator) on this rank's device. The gathered matrix is identical, so on
  one device the result is bitwise equal to the collective one (same GEMM shape, same inputs).
"""
import torch
import torch.distributed as dist

from task import input_t, output_t
from utils import check_rank_output, get_device

RTOL = 1e-2
ATOL = 1e-2


def _check_case(world_size: int, m: int, n: int) -> None:
    if world_size < 1 or m % world_size or n % world_size:
        raise ValueError(f"ag-gemm needs m and n divisible by world_size (got m={m}, n={n}, world_size={world_size}); "
                         f"pick m and n that are multiples of world_size")


def _uniform(shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """bf16 uniform in [-0.01, 0.01), with the official op sequence (rand, *2, -1, *0.01 all in bf16)."""
    return (torch.rand(shape, dtype=torch.bfloat16, device=device, generator=gen) * 2 - 1) * 0.01


def _rank_generator(rank: int, seed: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + rank)
    return gen


def generate_input(rank: int, world_size: int, m: int, n: int, k: int, has_bias, seed: int) -> input_t:
    """(A bf16 [m/ws, k], W bf16 [n/ws, k], bias bf16 [n/ws] or None) of one rank, on utils.get_device(rank).

    Drawn in the official order from seed + rank (no re-seed for the bias: each rank has its own). ``has_bias`` is
    tested for plain truthiness like the official, so the text round trip's string "False" still gives a bias.
    """
    _check_case(world_size, m, n)
    device = get_device(rank)
    gen = _rank_generator(rank, seed, device)
    a = _uniform((m // world_size, k), gen, device)
    w = _uniform((n // world_size, k), gen, device)
    bias = _uniform((n // world_size,), gen, device) if has_bias else None
    return a, w, bias


def _all_gather(full: torch.Tensor, part: torch.Tensor) -> None:
    """Gather every rank's ``part`` [m/ws, k] into ``full`` [m, k] in rank order."""
    if dist.get_backend() == "gloo":
        # older gloo builds lack the single-tensor all-gather; the list form moves the same bytes
        dist.all_gather(list(full.chunk(dist.get_world_size())), part)
        return
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(full, part)


def ref_kernel(data: input_t) -> output_t:
    """The official collective reference; every rank of the process group calls it together."""
    a, w, bias = data
    world_size = dist.get_world_size()
    full = torch.empty((a.shape[0] * world_size, a.shape[1]), dtype=a.dtype, device=a.device)
    _all_gather(full, a.contiguous())
    out = torch.matmul(full, w.T)
    if bias is not None:
        out = out + bias
    return out


def ref_kernel_local(rank: int, world_size: int, m: int, n: int, k: int, has_bias, seed: int) -> output_t:
    """This rank's expected output, bf16 [m, n/ws] on get_device(rank), computed with no collectives.

    Other ranks' A is their generator's first draw, so neither their W nor their bias is drawn.
    """
    _check_case(world_size, m, n)
    device = get_device(rank)
    shards = [_uniform((m // world_size, k), _rank_generator(r, seed, device), device) for r in range(world_size)]
    full = torch.cat(shards)
    del shards
    _, w, bias = generate_input(rank, world_size, m, n, k, has_bias, seed)
    out = torch.matmul(full, w.T)
    if bias is not None:
        out = out + bias
    return out


def compare(output: output_t, expected: output_t) -> tuple[bool, str]:
    """Official tolerance check of one rank's output (type, dtype and device first, then values)."""
    return check_rank_output(output, expected, RTOL, ATOL)


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    """The official check: compare with the collective reference (every rank must call it together)."""
    return compare(output, ref_kernel(data))
