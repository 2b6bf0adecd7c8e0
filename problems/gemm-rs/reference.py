"""gemm-rs reference: GEMM + reduce-scatter across ``world_size`` ranks (official semantics: shared/PROBLEMS.md).

Rank r holds A_r bf16 [m, k/ws], W_r bf16 [n, k/ws] and the shared bias bf16 [n] (or None); its output is
rows [r*m/ws, (r+1)*m/ws) of sum over ranks of bf16(A_r W_r^T + bias), bf16 [m/ws, n].

- ``ref_kernel(data)``: the official collective computation (one bf16 GEMM per rank, then a bf16 sum-reduce-scatter).
- ``ref_kernel_local(rank, **case)``: the same result with no collectives, regenerating every rank's inputs from their
  seeds on this rank's device. Each rank's partial is the same bf16 GEMM + bias as the collective one (restricted to
  the rows this rank owns), but the cross-rank sum runs in fp32 in rank order and is rounded to bf16 once, while the
  collective sums in bf16 in the backend's order (NCCL ring / gloo). So the two agree within the tolerance, not
  bitwise; the local sum is the more exact of the two.
"""
import torch
import torch.distributed as dist

from task import input_t, output_t
from utils import check_rank_output, get_device

RTOL = 1e-2
ATOL = 1e-2


def _check_case(world_size: int, m: int, k: int) -> None:
    if world_size < 1 or m % world_size or k % world_size:
        raise ValueError(f"gemm-rs needs m and k divisible by world_size (got m={m}, k={k}, world_size={world_size}); "
                         f"pick m and k that are multiples of world_size")


def _generator(device: torch.device, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _uniform(shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """bf16 uniform in [-0.01, 0.01), with the official op sequence (rand, *2, -1, *0.01 all in bf16)."""
    return (torch.rand(shape, dtype=torch.bfloat16, device=device, generator=gen) * 2 - 1) * 0.01


def _draw_rank(rank: int, world_size: int, m: int, n: int, k: int, seed: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s A [m, k/ws] and W [n, k/ws], drawn in the official order from seed + rank."""
    gen = _generator(device, seed + rank)
    a = _uniform((m, k // world_size), gen, device)
    w = _uniform((n, k // world_size), gen, device)
    return a, w


def _draw_bias(n: int, seed: int, device: torch.device) -> torch.Tensor:
    """The official re-seeds with the case seed itself, so every rank draws the same bias."""
    return _uniform((n,), _generator(device, seed), device)


def generate_input(rank: int, world_size: int, m: int, n: int, k: int, has_bias, seed: int) -> input_t:
    """(A bf16 [m, k/ws], W bf16 [n, k/ws], bias bf16 [n] or None) of one rank, on utils.get_device(rank).

    ``has_bias`` is tested for plain truthiness like the official, so the official text round trip's string "False"
    still gives a bias.
    """
    _check_case(world_size, m, k)
    device = get_device(rank)
    a, w = _draw_rank(rank, world_size, m, n, k, seed, device)
    bias = _draw_bias(n, seed, device) if has_bias else None
    return a, w, bias


def _reduce_scatter(out: torch.Tensor, full: torch.Tensor) -> None:
    """Sum ``full`` [m, n] over ranks and keep this rank's [m/ws, n] row block in ``out``."""
    if dist.get_backend() == "gloo":
        # gloo lacks reduce-scatter in some torch versions: all-reduce (the same bf16 sum) and keep our rows.
        dist.all_reduce(full)
        rows = out.shape[0]
        out.copy_(full[dist.get_rank() * rows:(dist.get_rank() + 1) * rows])
        return
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    reduce_scatter(out, full)


def ref_kernel(data: input_t) -> output_t:
    """The official collective reference; every rank of the process group calls it together."""
    a, w, bias = data
    world_size = dist.get_world_size()
    partial = torch.matmul(a, w.T)
    if bias is not None:
        partial = partial + bias
    out = torch.empty((a.shape[0] // world_size, w.shape[0]), dtype=partial.dtype, device=a.device)
    _reduce_scatter(out, partial.contiguous())
    return out


def ref_kernel_local(rank: int, world_size: int, m: int, n: int, k: int, has_bias, seed: int) -> output_t:
    """This rank's expected output, bf16 [m/ws, n] on get_device(rank), computed with no collectives.

    Only this rank's rows of each A_r enter a GEMM, and the fp32 accumulator is the only buffer kept across ranks,
    so the largest official case needs ~130 MB of transient inputs per rank, one rank at a time.
    """
    _check_case(world_size, m, k)
    device = get_device(rank)
    rows = slice(rank * (m // world_size), (rank + 1) * (m // world_size))
    bias = _draw_bias(n, seed, device) if has_bias else None
    acc = torch.zeros((m // world_size, n), dtype=torch.float32, device=device)
    for r in range(world_size):
        a, w = _draw_rank(r, world_size, m, n, k, seed, device)
        partial = torch.matmul(a[rows], w.T)
        if bias is not None:
            partial = partial + bias
        acc += partial.float()
        del a, w, partial
    return acc.to(torch.bfloat16)


def compare(output: output_t, expected: output_t) -> tuple[bool, str]:
    """Official tolerance check of one rank's output (type, dtype and device first, then values)."""
    return check_rank_output(output, expected, RTOL, ATOL)


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    """The official check: compare with the collective reference (every rank must call it together)."""
    return compare(output, ref_kernel(data))
