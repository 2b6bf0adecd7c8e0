"""The distributed problems on several GPUs of one host: the CUDA backend against the torch backend (NCCL + cuBLAS)
and PyTorch's symmetric-memory fused op, and the parts alone, in one process group on the same inputs.

    torchrun --nproc-per-node 2 benchmarks/distributed.py gemm-rs     # or ag-gemm, all2all; table on rank 0

Every official benchmark case (world_size replaced by the number of ranks) is checked first on every rank against
the reference's collective-free ref_kernel_local, then timed at kernel level: on every rank the L2 is flushed, the
ranks meet at a barrier, CUDA events bracket the call; a run's time is the slowest rank's, the median over runs.
Columns (us): ours (cuda), torch (the NCCL + cuBLAS backend), fused (torch symmetric memory's
fused_matmul_reduce_scatter / fused_all_gather_matmul; all2all: NCCL all_to_all_single of the same rows), gemm (the
local GEMM alone), comm (the collective alone); overlap = max(gemm, comm) / ours. all2all's floor: the bytes one
rank sends over NVLink (its dispatch and its combine) at 450 GB/s. Rows go to benchmarks/results/<problem>.csv.
--candidates NAME,... also checks and times the CUDA backend under each named candidate's knobs (CANDIDATES; the
entries read them every call), as "cuda+NAME", every rank under the same knobs. --window adds the official
multi-rank window (host clock, barriers; without the harness's input clone) for each, torch and `null` (an empty
output only: the window's own cost), as "window/NAME" (median) and "window-mean/NAME" rows of metric host-loop;
--trace (all2all) the one-launch kernel's phases and the host's issue time, as "cuda[trace]/PHASE" rows.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from kbench import benchlib, problems  # noqa: E402

NVLINK_BPS = 450e9
# candidate name -> knobs (read by kernels/<problem>/cuda/entry.py on every call); notes in docs/distributed-notes.md
CANDIDATES = {
    "ag-gemm": {
        # the overlapped path from 1024 rows a shard, its pushes by the copy engine (the small shards' gather by SM
        # stores, as shipped); and the build before this session (both by the copy engine)
        "chunk-ce": {"KBENCH_AG_CHUNK_ROWS": "1024"},
        "previous": {"KBENCH_AG_CHUNK_ROWS": "1024", "KBENCH_AG_PUSH": "ce"},
        # the overlapped path with its pushes by SM stores in 16 / 32 blocks on a high-priority stream
        "chunk-sm16": {"KBENCH_AG_CHUNK_ROWS": "1024", "KBENCH_AG_CHUNK_PUSH": "sm", "KBENCH_AG_PUSH_BLOCKS": "16"},
        "chunk-sm32": {"KBENCH_AG_CHUNK_ROWS": "1024", "KBENCH_AG_CHUNK_PUSH": "sm", "KBENCH_AG_PUSH_BLOCKS": "32"},
        "ce-push": {"KBENCH_AG_PUSH": "ce"},  # the gather by the copy engine and a flag launch a rank
        "python-host": {"KBENCH_AG_CPP_HOST": "0"},  # the gather-first call's host steps from Python (the build before)
    },
    "gemm-rs": {
        "one-gemm": {"KBENCH_RS_CHUNK_ROWS": "1000000000"},  # every case: one GEMM of all rows, owners pull
        "chunk-1024": {"KBENCH_RS_CHUNK_ROWS": "1024"},  # the build before this session
        "python-host": {"KBENCH_RS_CPP_HOST": "0"},  # the call's host steps from Python (the build before)
    },
    "all2all": {
        # the one-launch grid capped (default: a block per token or received row, up to two a SM): fewer blocks
        # ticket sooner but copy more rows each
        "blocks32": {"KBENCH_A2A_BLOCKS": "32"},
        "blocks64": {"KBENCH_A2A_BLOCKS": "64"},
        "blocks128": {"KBENCH_A2A_BLOCKS": "128"},
    },
}


def peers_ops(problem: str, rank: int, ws: int, data, case: dict) -> dict:
    """The comparison callables of one case on this rank: name -> zero-argument function."""
    group = dist.group.WORLD.group_name
    ops = {}
    if problem == "gemm-rs":
        a, w, bias = data
        full = torch.empty((a.shape[0], w.shape[0]), dtype=a.dtype, device=a.device)
        out = torch.empty((a.shape[0] // ws, w.shape[0]), dtype=a.dtype, device=a.device)
        ops["gemm"] = lambda: torch.mm(a, w.T, out=full)
        ops["comm"] = lambda: dist.reduce_scatter_tensor(out, full)
        ops["fused"] = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, w.T, "sum", 0, group)
    elif problem == "ag-gemm":
        a, w, bias = data
        gathered = torch.empty((a.shape[0] * ws, a.shape[1]), dtype=a.dtype, device=a.device)
        ops["gemm"] = lambda: torch.mm(gathered, w.T)
        ops["comm"] = lambda: dist.all_gather_into_tensor(gathered, a)
        ops["fused"] = lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [w.T], 0, group)
    else:
        cfg, rank_data, _, _ = data
        k = cfg.experts_per_token
        dest = rank_data.indices.reshape(-1).long() // (cfg.num_experts // ws)
        order = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=ws)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        sc, rc = send.tolist(), recv.tolist()
        rows = rank_data.x[order // k].contiguous()
        got = rows.new_empty((sum(rc), rows.shape[1]))
        ops["fused"] = lambda: (dist.all_to_all_single(got, rows, rc, sc), dist.all_to_all_single(rows, got, sc, rc))
    return ops


def probe(rank: int, ws: int, runs: int) -> None:
    """ag-gemm's overlapped path in pieces, on the largest official shards (rank r's shard [m/ws, k] pushed to rank
    r + 1, which waits for it): the push alone by SM stores in B blocks or by the copy engine, the local half GEMM
    alone, and the two together (the push on a high-priority side stream); `ping`, 16 bytes pushed and waited for,
    is the timer's floor for anything that waits on a peer (its launches, the ranks' skew after the barrier).
    Kernel-level times (us), rows `probe/<piece>`; flags at words 64.. of the symmetric buffer and epochs of their
    own, so the backend's are not touched."""
    mod = benchlib.build("ag-gemm", "cuda")
    symm = mod.symm  # (the entry's own: one buffer a process)
    ref = problems.load_modules("ag-gemm").reference
    gpu = torch.cuda.get_device_name()
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream(priority=-1)
    epoch = [1 << 20]
    rows_out = []
    for case in problems.load_spec("ag-gemm").benchmarks[-3:]:
        case = problems.official_case(dict(case, world_size=ws))
        a, w, _ = ref.generate_input(**case, rank=rank)
        rows, k = a.shape
        base, peers = symm.half(rows * k * 2 * ws, 0, a.device)
        flags = symm.flags_address(a.device)
        dst, src = (rank + 1) % ws, (rank - 1) % ws
        out = torch.empty((rows, w.shape[0]), dtype=a.dtype, device=a.device)

        def _next():
            epoch[0] += 1
            return epoch[0]

        def push(blocks=0, ce=False):
            if ce:
                symm.view(a.device, dst, base + rank * rows * k * 2, (rows, k), a.dtype).copy_(a)
                mod.ext.signal_peers([peers[dst]], 64 + rank, _next())
            else:
                mod.ext.push_peers(a, [peers[dst]], base + rank * rows * k * 2, 64 + rank, _next(), counter, blocks)

        def landed():
            mod.ext.wait_flags(flags, 64 + src, 1, epoch[0])

        def both(blocks=0, ce=False):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                push(blocks, ce)
            torch.mm(a, w.T, out=out)
            landed()
            torch.cuda.current_stream().wait_stream(side)

        one = a.view(-1)[:8]  # 16 bytes: the timer's floor for one flagged store to the peer and its wait
        ping = lambda: (mod.ext.push_peers(one, [peers[dst]], base + rank * 16, 64 + rank, _next(), counter, 1),
                        landed())  # noqa: E731
        pieces = {"ping": ping, "gemm-half": lambda: torch.mm(a, w.T, out=out)}
        for b in (8, 16, 32, 0):
            pieces[f"push-sm{b}" if b else "push-sm-all"] = lambda b=b: (push(b), landed())
        pieces["push-ce"] = lambda: (push(ce=True), landed())
        for b in (16, 32):
            pieces[f"gemm-half+push-sm{b}"] = lambda b=b: both(b)
        pieces["gemm-half+push-ce"] = lambda: both(ce=True)
        got = {name: benchlib.rank_time_us(fn, runs) for name, fn in pieces.items()}
        mb = rows * k * 2 / 1e6
        if rank == 0:
            print(f"{problems.format_case(case)}: shard {mb:.1f} MB; " +
                  ", ".join(f"{n} {t:.1f}" + (f" ({mb * 1e3 / t:.0f} GB/s)" if n.startswith("push") else "")
                            for n, t in got.items()), flush=True)
        rows_out += [benchlib.Row(gpu, ws, f"probe/{n}", "kernel", problems.format_case(case), t)
                     for n, t in got.items()]
    if rank == 0:
        benchlib.record("ag-gemm", rows_out)


def windows(ours, theirs, data, candidates: dict, runs: int) -> dict:
    """window/<name> (median) and window-mean/<name> -> the official window (us) for our backend, each candidate,
    torch's, and `null`, a call that only makes an empty output like ours: what the window costs whatever the
    kernel. The official score is a mean, so the means (and their slow windows) are kept too."""
    out = data[1].x if hasattr(data[1], "x") else data[0]
    fns = {"null": (lambda: torch.empty_like(out), {}), "cuda": (lambda: ours.custom_kernel(data), {})}
    fns.update({f"cuda+{n}": (lambda: ours.custom_kernel(data), k) for n, k in candidates.items()})
    fns["torch"] = (lambda: theirs.custom_kernel(data), {})
    got = {}
    for name, (fn, settings) in fns.items():
        with benchlib.knobs(settings):
            got[f"window/{name}"], got[f"window-mean/{name}"] = benchlib.rank_window_us(fn, runs)
    return got


# (name, first stamp, last stamp) of a2a_api.h's kA2aTraceWords: 0 block 0's start, 1 its dispatch rows stored, 2 the
# dispatch flags out (the last block), 3 block 0 past the peers' dispatch flags, 4 the return flags out (the last
# block), 5 block 0 past the peers' return flags, 6 block 0's end. Each pair is in one order in every run (a stamp of
# the last block follows block 0's before it; block 0's own come in order), so every phase is a time >= 0.
TRACE_PHASES = (("dispatch rows", 0, 1), ("dispatch flag", 1, 2), ("to peers' dispatch", 1, 3),
                ("expert + flag", 3, 4), ("to peers' returns", 3, 5), ("combine", 5, 6))


def trace(ours, data, runs: int) -> dict:
    """all2all's one-launch path with KBENCH_A2A_TRACE=1, each run after a synchronize and a barrier as the window
    starts. The host: `issue` (its whole time in custom_kernel, no synchronize inside), `python` (before the binding
    started), the binding's steps (ext.a2a_steps: checks, output, launch). The GPU: the TRACE_PHASES of this rank's
    kernel. cuda[trace]/<name> -> its median over runs, us, rank 0's, broadcast."""
    cols: dict[str, list] = {}
    with benchlib.knobs({"KBENCH_A2A_TRACE": "1"}):
        for i in range(runs + 3):
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter_ns()
            ours.custom_kernel(data)
            t1 = time.perf_counter_ns()
            steps, entered = ours.ext.a2a_steps()
            stamps = ours.ext.a2a_trace().tolist()
            if i < 3:
                continue
            got = {"issue": (t1 - t0) / 1e3, "python": (entered - t0) / 1e3, **dict(steps)}
            got.update({n: (stamps[b] - stamps[a]) / 1e3 for n, a, b in TRACE_PHASES})
            for n, v in got.items():
                cols.setdefault(n, []).append(v)
    names = list(cols)
    vals = torch.tensor([benchlib.median(cols[n]) for n in names], device="cuda")
    dist.broadcast(vals, 0)
    return {f"cuda[trace]/{n}": v for n, v in zip(names, vals.tolist())}


def floor_us(problem: str, data, ws: int) -> float | None:
    if problem != "all2all":
        return None
    cfg, rank_data, rank, _ = data
    remote = (rank_data.indices.long() // (cfg.num_experts // ws) != rank).sum().item()
    return 1e6 * 2 * remote * cfg.hidden_dim * 2 / NVLINK_BPS


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", choices=("all2all", "gemm-rs", "ag-gemm"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--candidates", default="", help="comma-separated names of CANDIDATES[problem]")
    ap.add_argument("--probe", action="store_true", help="ag-gemm: time the overlapped path's pieces instead")
    ap.add_argument("--window", action="store_true",
                    help="also time cuda (and each candidate), torch and `null` (an empty output: the window's own "
                         "cost) in the official multi-rank window, as 'window/<name>' and 'window-mean/<name>' rows "
                         "(metric host-loop)")
    ap.add_argument("--trace", action="store_true",
                    help="all2all: the one-launch kernel's phases (KBENCH_A2A_TRACE) and the host's issue time, as "
                         "'cuda[trace]/<phase>' rows (metric host-loop)")
    args = ap.parse_args()
    candidates = benchlib.selected(CANDIDATES[args.problem], args.candidates)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    os.environ["KBENCH_DEVICE"] = "cuda"
    if args.probe:
        probe(rank, ws, args.runs)
        dist.barrier()
        dist.destroy_process_group()
        return
    ref = problems.load_modules(args.problem).reference
    ours, theirs = benchlib.build(args.problem, "cuda"), benchlib.build(args.problem, "torch")
    gpu = torch.cuda.get_device_name()
    rows, failures = [], []
    for case in problems.load_spec(args.problem).benchmarks:
        case = problems.official_case(dict(case, world_size=ws))
        data = ref.generate_input(**case, rank=rank)
        expected = ref.ref_kernel_local(rank, **case)
        for name, mod in (("cuda", ours), ("torch", theirs)):
            ok, msg = ref.compare(mod.custom_kernel(data), expected)
            if not ok:
                failures.append(f"rank {rank} {name} {problems.format_case(case)}: {msg[:200]}")
        row = {"case": problems.format_case(case), "floor": floor_us(args.problem, data, ws),
               "cuda": benchlib.rank_time_us(lambda: ours.custom_kernel(data), args.runs),
               "torch": benchlib.rank_time_us(lambda: theirs.custom_kernel(data), args.runs)}
        for name, settings in candidates.items():
            with benchlib.knobs(settings):
                ok, msg = ref.compare(ours.custom_kernel(data), expected)
                if not ok:
                    failures.append(f"rank {rank} cuda+{name} {problems.format_case(case)}: {msg[:200]}")
                bad = torch.tensor([0 if ok else 1], device="cuda")
                dist.all_reduce(bad)  # every rank times a candidate, or none does (the timer is collective)
                if not bad.item():
                    row[f"cuda+{name}"] = benchlib.rank_time_us(lambda: ours.custom_kernel(data), args.runs)
        row["host-loop"] = {}  # backend name -> us: the rows of metric host-loop
        if args.window:
            row["host-loop"].update(windows(ours, theirs, data, candidates, args.runs))
        if args.trace:
            row["host-loop"].update(trace(ours, data, args.runs))
        for name, fn in peers_ops(args.problem, rank, ws, data, case).items():
            try:
                row[name] = benchlib.rank_time_us(fn, args.runs)
            except Exception as exc:  # noqa: BLE001 - a peer this torch lacks: no column
                if rank == 0:
                    print(f"{name}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                row[name] = None
        if row.get("gemm") and row.get("comm"):
            row["overlap"] = max(row["gemm"], row["comm"]) / row["cuda"]
        rows.append(row)
        del data, expected
    gathered = [None] * ws
    dist.all_gather_object(gathered, failures)
    if rank == 0:
        failures = [f for fs in gathered for f in fs]
        names = ["cuda", "torch", "fused", "gemm", "comm"] + [f"cuda+{n}" for n in candidates]
        results = [benchlib.Row(gpu, ws, n, "kernel", r["case"], r[n]) for r in rows for n in names if r.get(n)]
        results += [benchlib.Row(gpu, ws, n, "kernel", "geomean", benchlib.geomean(r.get(n) for r in rows))
                    for n in names if benchlib.geomean(r.get(n) for r in rows)]
        loops = list(rows[0]["host-loop"]) if rows else []
        results += [benchlib.Row(gpu, ws, n, "host-loop", r["case"], r["host-loop"][n]) for n in loops for r in rows]
        results += [benchlib.Row(gpu, ws, n, "host-loop", "geomean", benchlib.geomean(r["host-loop"][n] for r in rows))
                    for n in loops if n.startswith("window")]
        wnames = [n.split("/", 1)[1] for n in loops if n.startswith("window/")]
        tnames = [n.split("/", 1)[1] for n in loops if n.startswith("cuda[trace]/")]
        benchlib.record(args.problem, results)
        cols = ["floor", "cuda", "torch", "fused", "gemm", "comm"] + [f"cuda+{n}" for n in candidates]
        ratio = lambda x: None if x is None else f"{x:.2f}"  # noqa: E731
        benchlib.table(f"{args.problem} on {ws}x {gpu} (us, kernel level: events on every rank, slowest rank, "
                       f"median); failures: {len(failures)}", ["case"] + cols + ["overlap"],
                       [[r["case"]] + [r.get(c) for c in cols] + [ratio(r.get("overlap"))] for r in rows] +
                       [["geomean"] + [benchlib.geomean(r.get(c) for r in rows) for c in cols] + [None]])
        if wnames:
            benchlib.table("the official window (rank 0's host clock, barriers, no input clone; us, median / mean; "
                           "#i: the table's cases in order)",
                           ["case"] + wnames,
                           [[f"#{i}"] + [f"{r['host-loop']['window/' + n]:.1f} / "
                                         f"{r['host-loop']['window-mean/' + n]:.1f}" for n in wnames]
                            for i, r in enumerate(rows)])
        if tnames:
            benchlib.table("the one-launch kernel's phases (rank 0, us, median; issue: the host's time in the call)",
                           ["case"] + tnames,
                           [[f"#{i}"] + [r["host-loop"]["cuda[trace]/" + n] for n in tnames]
                            for i, r in enumerate(rows)])
        for f in failures[:10]:
            print("  FAIL " + f)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
