"""moe torch backend on one GPU: the per-expert loop path against the torch._grouped_mm path, in one process.

    python3 benchmarks/moe_torch.py            # from the repo root on the GPU machine; table last (< 90 s on an H100)

For each official benchmark case (problems/moe/spec.yml) it times, on the same inputs:
  loop          custom_kernel with MOE_PATH="loop" (fp16 GEMMs per expert, one host sync)
  grouped-fp16  MOE_PATH="grouped" with fp16 operands (the default GROUPED_DTYPE): weights stacked every call, then
                _grouped_mm, which for fp16 takes its fallback on torch <= 2.11 (offsets to the host, a loop of mm_out)
  grouped-bf16  MOE_PATH="grouped", GROUPED_DTYPE=bf16: the stacking copy converts to bf16, _grouped_mm's CUTLASS path
  stack         stack_expert_weights alone, to bf16 (the per-call copy of every expert weight into [E, ...] buffers)
  gemms         the two bf16 grouped GEMMs + SwiGLU alone, on weights already stacked and tokens already sorted
Timers: CUDA events around one call (median of RUNS after WARMUP), and the official single-GPU timer: host clock
(perf_counter_ns) between torch.cuda.synchronize() calls, no L2 flush (median and mean of RUNS).
Correctness: reference.check_implementation on every path for the benchmark cases, and on grouped-bf16 for the
official test cases as well (a submission must pass those too); `ratio` is max |out - ref| / (atol + rtol |ref|), the
check passes when it is <= 1. Also reports the probe per dtype, what MOE_PATH="auto" picks, and whether each grouped
variant makes a host sync (one call under torch.cuda.set_sync_debug_mode("error")).
With $OUT set, the rows are also written to $OUT/moe_torch.json.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from problems import leaderboard_imports, load_modules, load_spec, official_case  # noqa: E402

WARMUP, RUNS = 3, 10


def load_entry(mods):
    """kernels/moe/torch/entry.py as a module, importing this problem's `task` as a submission would."""
    path = ROOT / "kernels" / "moe" / "torch" / "entry.py"
    with leaderboard_imports({"task": mods.task, "utils": mods.utils}):
        spec = importlib.util.spec_from_file_location("moe_torch_entry", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def time_events(fn) -> float:
    """Median ms of CUDA events around one call."""
    for _ in range(WARMUP):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(RUNS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(RUNS)]
    torch.cuda.synchronize()
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_host(fn) -> tuple[float, float]:
    """(median, mean) ms of the official single-GPU timer: host clock between synchronize() calls."""
    fn()
    times = []
    for _ in range(RUNS):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times), statistics.mean(times)


def ratio(out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).abs() / (atol + rtol * ref.abs())).max().item()


def run_path(entry, path: str, dtype: torch.dtype):
    def call(data):
        entry.MOE_PATH, entry.GROUPED_DTYPE = path, dtype
        return entry.custom_kernel(data)
    return call


def sync_check(entry, data, dtype) -> str:
    """'none' when one grouped call runs under sync-debug mode 'error', else the error's first line."""
    entry.MOE_PATH, entry.GROUPED_DTYPE = "grouped", dtype
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        entry.custom_kernel(data)
        result = "none"
    except Exception as exc:  # noqa: BLE001 - sync-debug mode raises RuntimeError; report anything
        result = "SYNCS: " + str(exc).splitlines()[0][:100]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return result


def main() -> None:
    t_start = time.perf_counter()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    os.environ.setdefault("KBENCH_DEVICE", "cuda")
    mods = load_modules("moe")
    reference = mods.reference
    entry = load_entry(mods)
    spec = load_spec("moe")
    rtol, atol = reference.RTOL, reference.ATOL
    device = torch.device("cuda", torch.cuda.current_device())
    sm = "".join(map(str, torch.cuda.get_device_capability(device)))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}, sm{sm}", flush=True)
    probe = {str(dt): entry._probe_grouped_mm(device, dt) for dt in (torch.float16, torch.bfloat16)}
    entry.MOE_PATH, entry.GROUPED_DTYPE = "auto", None
    auto_pick = "grouped" if entry._use_grouped(device, torch.float16) else "loop"
    print(f"probe (_grouped_mm sync-free and correct): {probe}; MOE_PATH='auto' picks: {auto_pick}", flush=True)

    rows, notes = [], []

    # correctness of grouped-bf16 on the official test cases (grouped-fp16 has the loop path's numerics)
    for raw in spec.tests:
        case = official_case(raw, intended_bools=True)
        data = reference.generate_input(**case)
        ref = reference.ref_kernel(data)
        out = run_path(entry, "grouped", torch.bfloat16)(copy.deepcopy(data))
        ok, message = reference.check_implementation(data, out)
        label = f"test E={case['nroutedexperts']} k={case['nexpertspertoken']} seqlen={case['seqlen']}"
        notes.append(f"{label}: grouped(bf16) {'pass' if ok else 'FAIL'}, ratio {ratio(out, ref, rtol, atol):.3f}"
                     + ("" if ok else f" ({message.splitlines()[0]})"))
        print(notes[-1], flush=True)
        del data, ref, out
        torch.cuda.empty_cache()

    for raw in spec.benchmarks:
        case = official_case(raw, intended_bools=True)
        label = f"E={case['nroutedexperts']} seqlen={case['seqlen']}"
        data = reference.generate_input(**case)
        ref = reference.ref_kernel(data)
        n_experts, k = case["nroutedexperts"], case["nexpertspertoken"]
        x, weights, _ = data
        for dt in (None, torch.bfloat16):
            notes.append(f"{label}: grouped-{'bf16' if dt else 'fp16'} host syncs: {sync_check(entry, data, dt)}")
            print(notes[-1], flush=True)

        for name, path, dtype in (("loop", "loop", None), ("grouped-fp16", "grouped", None),
                                  ("grouped-bf16", "grouped", torch.bfloat16)):
            fn = run_path(entry, path, dtype)
            out = fn(data)
            ok, message = reference.check_implementation(data, out)
            r = ratio(out, ref, rtol, atol)
            del out
            ev = time_events(lambda: fn(data))
            host_med, host_mean = time_host(lambda: fn(data))
            rows.append({"case": label, "what": name, "ok": ok, "ratio": r, "events_ms": ev, "host_ms": host_med,
                         "host_mean_ms": host_mean})
            if not ok:
                notes.append(f"{label} {name}: {message.splitlines()[0]}")
            print(rows[-1], flush=True)

        # the pieces of the grouped path
        stack = lambda: entry.stack_expert_weights(weights, n_experts, torch.bfloat16)  # noqa: E731
        ev = time_events(stack)
        host_med, host_mean = time_host(stack)
        stack_bytes = sum(weights[f"experts.{e}.{j}.weight"].numel() for e in range(n_experts) for j in range(3)) * 4
        rows.append({"case": label, "what": f"stack ({stack_bytes / 1e9:.2f} GB moved)", "ok": None, "ratio": None,
                     "events_ms": ev, "host_ms": host_med, "host_mean_ms": host_mean})
        print(rows[-1], flush=True)

        w_gate_up, w_down = stack()
        _, experts = entry._route(x, weights["router.weight"], k)
        order, offs = entry.sort_by_expert(experts, n_experts)
        x_sorted = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).index_select(0, order // k)
        dexp = w_down.shape[1]

        def gemms():
            h = torch._grouped_mm(x_sorted, w_gate_up, offs=offs)
            h = torch.nn.functional.silu(h[:, :dexp]) * h[:, dexp:]
            return torch._grouped_mm(h, w_down, offs=offs)
        ev = time_events(gemms)
        host_med, host_mean = time_host(gemms)
        rows.append({"case": label, "what": "gemms (bf16, 2 grouped + SwiGLU)", "ok": None, "ratio": None,
                     "events_ms": ev, "host_ms": host_med, "host_mean_ms": host_mean})
        print(rows[-1], flush=True)
        del data, x, weights, ref, w_gate_up, w_down, x_sorted, experts, order, offs
        torch.cuda.empty_cache()

    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "moe_torch.json").write_text(json.dumps({"probe": probe, "auto": auto_pick, "notes": notes,
                                                              "rows": rows}, indent=1))

    print(f"\n(total {time.perf_counter() - t_start:.0f} s)")
    print(f"probe: {probe}; auto picks: {auto_pick}")
    for note in notes:
        print(note)
    print("\n| case | what | check (ratio) | CUDA events median ms | host median ms | host mean ms |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        check = "" if row["ok"] is None else f"{'pass' if row['ok'] else 'FAIL'} ({row['ratio']:.3f})"
        print(f"| {row['case']} | {row['what']} | {check} | {row['events_ms']:.3f} | {row['host_ms']:.3f} | "
              f"{row['host_mean_ms']:.3f} |")


if __name__ == "__main__":
    main()
