"""gemm-rs CUDA backend entry: GEMM + reduce-scatter with the partial products written straight into their owners'
symmetric buffers.

data = (A [m, k/ws] bf16, W [n, k/ws] bf16, bias [n] bf16 or None), one shard of k per rank. Output on rank r: rows
[r*m/ws, (r+1)*m/ws) of sum over ranks of (A W^T + bias), [m/ws, n] bf16. Every rank calls this together.

Large row blocks (m/ws >= CHUNK_ROWS): rank r computes the partial of each owner's rows in turn, its own last, each
cuBLAS GEMM writing its output straight into the owner's buffer (slot r) over NVLink while the next one computes;
a flag per chunk tells the owner. The owner sums its ws slots in rank order (fp32, one rounding): deterministic.
Small ones: one GEMM of all m rows into this rank's own buffer (chunking would read W ws times), a flag to every
peer, and the owner pulls its rows from every rank's buffer while it sums. Buffers alternate by call parity, and
a rank reuses one only after the flags of the call between prove its readers are done (docs/distributed-notes.md).
KBENCH_RS_CHUNK_ROWS: the rows an owner from which the chunked path runs (default CHUNK_ROWS).
The whole call is one extension call (ext.rs_forward, binding.cpp) on a plan registered once per shape (the peers'
addresses): on 2x H200 its window read 11-96 us a case under the same steps from Python (the 3 ms case, the same GPU
work, went with the order of timing: docs/distributed-notes.md); KBENCH_RS_CPP_HOST=0 keeps the Python steps.
`ext` is the load_inline module the template defines above this code.
"""
import os

import torch
import torch.distributed as dist

import graph_replay
import symm
from task import input_t, output_t

CHUNK_ROWS = 2048  # rows per owner from which a GEMM per owner beats one GEMM + pulling (W read once per chunk;
# at m 2048 on 2x H200 one GEMM read 152.2 / 149.1 us against 163.0 / 163.4 chunked in two calls: notes)
_calls = [0]
_plans = {}  # (device, bytes a call needs) -> the binding's plan number
_HOST_KNOB = ("KBENCH_RS_CPP_HOST",)


def custom_kernel(data: input_t) -> output_t:
    a, w, bias = data
    _calls[0] += 1
    if graph_replay.env_values(_HOST_KNOB)[0] not in graph_replay.OFF:  # (os.environ.get: ~1 us of the timed call)
        nbytes = a.shape[0] * w.shape[0] * 2
        plan = _plans.get((a.device, nbytes))
        if plan is None:  # (every rank meets a new shape in the same call: symm.plan_args may be a collective)
            plan = _plans[a.device, nbytes] = ext.peer_plan(*symm.plan_args(nbytes, a.device))  # noqa: F821
        return ext.rs_forward(a, w, bias, plan, _calls[0], CHUNK_ROWS)  # noqa: F821
    return _python_host(a, w, bias)


def _python_host(a, w, bias):
    """The call's steps from Python (KBENCH_RS_CPP_HOST=0)."""
    ws, rank = dist.get_world_size(), dist.get_rank()
    m, n = a.shape[0], w.shape[0]
    rows = m // ws
    epoch, parity = _calls[0], _calls[0] % 2
    # this call's half of the buffer: ws slots of [rows, n], or one [m, n]
    base, peers = symm.half(m * n * 2, parity, a.device)
    dev, wt = a.device, w.T

    def gemm(src, out):
        return torch.mm(src, wt, out=out) if bias is None else torch.addmm(bias, src, wt, out=out)

    out = torch.empty((rows, n), dtype=a.dtype, device=dev)
    if rows >= int(os.environ.get("KBENCH_RS_CHUNK_ROWS", CHUNK_ROWS)):
        for i in range(1, ws + 1):            # owners r+1, r+2, ..., r: this rank's own block last
            dst = (rank + i) % ws
            gemm(a[dst * rows:(dst + 1) * rows], symm.view(dev, dst, base + rank * rows * n * 2, (rows, n), a.dtype))
            ext.signal_peers([peers[dst]], rank, epoch)  # noqa: F821 (ext: template)
        slots = [peers[rank] + base + s * rows * n * 2 for s in range(ws)]
    else:
        gemm(a, symm.view(dev, rank, base, (m, n), a.dtype))
        ext.signal_peers(peers, rank, epoch)  # noqa: F821
        slots = [peers[s] + base + rank * rows * n * 2 for s in range(ws)]
    ext.sum_rows(out, slots, symm.flags_address(dev), epoch)  # noqa: F821
    return out
