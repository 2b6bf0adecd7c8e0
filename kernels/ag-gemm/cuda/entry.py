"""ag-gemm CUDA backend entry: all-gather + GEMM with the peers' row shards arriving over NVLink while the GEMM runs.

data = (A [m/ws, k] bf16, W [n/ws, k] bf16, bias [n/ws] bf16 or None), this rank's shards. Output on rank r: the
all-gathered A [m, k] times W^T, plus bias: [m, n/ws] bf16. Every rank calls this together.

By default every case gathers first: one launch (push_peers) stores this rank's shard into every rank's buffer
(this one included) by SM stores and flags each; then a wait for every rank's flag and one GEMM over the gathered A.
On 2x H200 that read faster on every official case than the overlapped path (docs/distributed-notes.md), which
runs from KBENCH_AG_CHUNK_ROWS rows a shard: a side stream pushes this rank's shard into every peer's buffer and
flags it (KBENCH_AG_CHUNK_PUSH=ce, the default there: the copy engine; =sm: push_peers in KBENCH_AG_PUSH_BLOCKS
blocks, default 16, on a high-priority stream, so that it takes its SMs before the GEMM's blocks fill them), while
the GEMM of the local shard runs from A itself, then each peer's rows in the order they arrive, each GEMM waiting on
its flag (a one-thread kernel, no host wait). KBENCH_AG_PUSH=ce: the gather by the copy engine and a flag launch a
rank (the build before).
Buffers alternate by call parity; a push waits for this rank's previous call, whose flags prove the peers are done
with the buffer it overwrites (docs/distributed-notes.md). The gather-first call is one extension call
(ext.ag_forward, binding.cpp) on a plan registered once per shape (the peers' addresses): on 2x H200 its window
read 47-126 us a case under the same steps from Python (docs/distributed-notes.md), which KBENCH_AG_CPP_HOST=0
keeps. `ext` is the load_inline module the template defines above.
"""
import os

import torch
import torch.distributed as dist

import graph_replay
import symm
from task import input_t, output_t

CHUNK_ROWS = 1 << 30  # the overlapped path's rows a shard: off unless KBENCH_AG_CHUNK_ROWS asks (see above)
_calls = [0]
_streams = {}      # (device, high priority) -> the side stream the overlapped path's pushes run on
_counters = {}     # (device, stream's role) -> int32 [1]: push_peers' ticket of finished blocks (zero between launches)
_plans = {}        # (device, rows, k) -> the binding's plan number
_FAST_PATH_KNOBS = ("KBENCH_AG_CPP_HOST", "KBENCH_AG_CHUNK_ROWS")


def _counter(dev: torch.device, role: str) -> torch.Tensor:
    if (dev, role) not in _counters:
        _counters[dev, role] = torch.zeros(1, dtype=torch.int32, device=dev)
    return _counters[dev, role]


def custom_kernel(data: input_t) -> output_t:
    a, w, bias = data
    _calls[0] += 1
    cpp_host, chunk_rows = graph_replay.env_values(_FAST_PATH_KNOBS)  # (os.environ.get: ~1 us a name, timed)
    if cpp_host not in graph_replay.OFF and chunk_rows is None:
        key = (a.device, a.shape[0], a.shape[1])
        plan = _plans.get(key)
        if plan is None:  # (every rank meets a new shape in the same call: symm.plan_args may be a collective)
            nbytes = a.shape[0] * dist.get_world_size() * a.shape[1] * 2  # the gathered A
            plan = _plans[key] = ext.peer_plan(*symm.plan_args(nbytes, a.device))  # noqa: F821
        return ext.ag_forward(a, w, bias, plan, _calls[0], _counter(a.device, "main"))  # noqa: F821
    ws, rank = dist.get_world_size(), dist.get_rank()
    rows, k = a.shape
    m = rows * ws
    epoch, parity = _calls[0], _calls[0] % 2
    base, peers = symm.half(m * k * 2, parity, a.device)  # this call's half: the gathered A, ws slots of [rows, k]
    dev, wt = a.device, w.T
    a = a.contiguous()
    mine = base + rank * rows * k * 2  # this rank's slot in every rank's half
    # push_peers stores 16 bytes at a time: a shard of another size or alignment goes by the copy engine
    sm_storable = (rows * k * 2) % 16 == 0 and a.data_ptr() % 16 == 0

    def gemm(src, out):
        return torch.mm(src, wt, out=out) if bias is None else torch.addmm(bias, src, wt, out=out)

    def push(dst):
        symm.view(dev, dst, mine, (rows, k), a.dtype).copy_(a)
        ext.signal_peers([peers[dst]], rank, epoch)  # noqa: F821 (ext: template)

    out = torch.empty((m, w.shape[0]), dtype=a.dtype, device=dev)
    gathered = symm.view(dev, rank, base, (m, k), a.dtype)
    main = torch.cuda.current_stream(dev)
    flags = symm.flags_address(dev)
    if rows < int(os.environ.get("KBENCH_AG_CHUNK_ROWS", CHUNK_ROWS)):
        if os.environ.get("KBENCH_AG_PUSH") == "ce" or not sm_storable:
            for i in range(ws):
                push((rank + i) % ws)
        else:
            ext.push_peers(a, peers, mine, rank, epoch, _counter(dev, "main"), 0)  # noqa: F821
        ext.wait_flags(flags, 0, ws, epoch)  # noqa: F821
        return gemm(gathered, out)
    sm_push = os.environ.get("KBENCH_AG_CHUNK_PUSH") == "sm"
    if (dev, sm_push) not in _streams:
        _streams[dev, sm_push] = torch.cuda.Stream(dev, priority=-1 if sm_push else 0)
    side = _streams[dev, sm_push]
    side.wait_stream(main)                    # after this rank's previous call (its flags free the peers' buffers)
    with torch.cuda.stream(side):
        if sm_push and sm_storable:  # to the peers only: the local GEMM reads A itself
            others = [peers[(rank + i) % ws] for i in range(1, ws)]
            ext.push_peers(a, others, mine, rank, epoch, _counter(dev, "side"),  # noqa: F821
                           int(os.environ.get("KBENCH_AG_PUSH_BLOCKS", 16)))
        else:
            for i in range(1, ws):
                push((rank + i) % ws)
    gemm(a, out[rank * rows:(rank + 1) * rows])
    for i in range(1, ws):                    # peers in arrival order: r-1 pushes here first
        src = (rank - i) % ws
        ext.wait_flags(flags, src, 1, epoch)  # noqa: F821
        gemm(gathered[src * rows:(src + 1) * rows], out[src * rows:(src + 1) * rows])
    main.wait_stream(side)
    return out
