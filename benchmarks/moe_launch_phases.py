"""The host's side of one official moe call, phase by phase: how long the cuda backend's custom_kernel keeps the host
busy before its graph reaches the GPU (docs/moe-notes.md, twenty-fifth session: at 2048 tokens ~100 us of the
official window has no kernel running).

    python benchmarks/moe_launch_phases.py --runs 30      # table last; rows into benchmarks/results/moe.csv

Per benchmark case: inputs generated once, the call checked, three calls to capture its graph, then --runs calls the
official way (inputs cloned, synchronize) with custom_kernel's steps taken one at a time under the host clock, as
kernels/moe/cuda/entry.py runs them: `alloc+publish` (the output and the launch that hands its address to the graph),
`key` (the inputs' addresses and the knobs), `graph-launch` (the replay's cudaGraphLaunch), `verify` (the inputs'
shapes and strides, checked while the GPU runs), `gpu-rest` (the synchronize after them). Medians, us. Rows: metric
host-loop, backend "cuda[phases]/<phase>".
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from kbench import benchlib, problems
from kbench.evaluator import guards

guards.torch = torch  # the harness sets it when it starts; guards.clone needs it
PHASES = ("alloc+publish", "key", "graph-launch", "verify", "gpu-rest")


def phases_of_one_call(mod, data) -> list[float]:
    """custom_kernel(data)'s graph path, step by step (the same calls as entry.py), host clock per step (us)."""
    x, weights, config = data
    n_experts, k = config["n_routed_experts"], config["n_experts_per_token"]
    t = [time.perf_counter_ns()]
    out = mod.ext.moe_output(x.view(-1, x.shape[-1]), k, n_experts)
    t.append(time.perf_counter_ns())
    tensors, extra = mod._launch_inputs(x, weights, n_experts, k)
    key = mod.graph_replay.addresses(tensors) + extra  # as custom_kernel keys its replay
    held = mod._graphs._graphs[key]  # a KeyError: the graph was not captured (the knobs or the inputs moved)
    t.append(time.perf_counter_ns())
    held[0].replay()
    t.append(time.perf_counter_ns())
    if mod.graph_replay.tensor_key(*tensors) != held[2]:
        raise SystemExit("the inputs' shapes or strides changed under the graph: not an official loop")
    t.append(time.perf_counter_ns())
    torch.cuda.synchronize()
    t.append(time.perf_counter_ns())
    del out
    return [(b - a) / 1e3 for a, b in zip(t, t[1:])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    mod = benchlib.build("moe", "cuda")
    ref = problems.load_modules("moe").reference
    gpu, rows, table = torch.cuda.get_device_name(), [], []
    for case in problems.load_spec("moe").benchmarks:
        data = ref.generate_input(**problems.official_case(case))
        line = problems.format_case(case)
        ok, msg = ref.check_implementation(guards.clone(data, deep=True), mod.custom_kernel(guards.clone(data)))
        if not ok:
            raise SystemExit(f"cuda fails {line}: {msg}")
        for _ in range(3):  # eager, captured, replayed
            mod.custom_kernel(guards.clone(data))
        torch.cuda.synchronize()
        runs = []
        for _ in range(args.runs):
            given = guards.clone(data)
            torch.cuda.synchronize()
            runs.append(phases_of_one_call(mod, given))
            del given
        medians = [statistics.median(r[i] for r in runs) for i in range(len(PHASES))]
        rows += [benchlib.Row(gpu, 1, f"cuda[phases]/{p}", "host-loop", line, v) for p, v in zip(PHASES, medians)]
        table.append([line.split("; seed")[0].split("; ")[-1]] + [f"{v:.1f}" for v in medians])
        del data
    benchlib.record("moe", rows)
    benchlib.table(f"moe cuda: custom_kernel's host phases, medians of {args.runs} official-style calls (us, {gpu})",
                   ["case", *PHASES], table)


if __name__ == "__main__":
    main()
