"""moe on one Hopper GPU: the CUDA backend against the torch backend and torch's grouped GEMM, in one process on the
same inputs; correctness first (official tests and benchmarks), then time.

    python benchmarks/moe.py             # check + time; table last; rows into benchmarks/results/moe.csv

Synthetic routings (empty experts, skew, E = 4/8, K = 1) are checked in tests/test_moe_cuda_gpu.py.

Times (us): "kernel" = kbench's CUDA-event timer around one call, L2 flushed, median; the CUDA backend's five
stages come from events between its launches (a dev entry point). CANDIDATES are configurations of the same build
turned on by knobs (kernels/moe/cuda/moe_api.h: MoeConfig): each is checked on every official case, then timed
beside the default under its own backend name ("cuda+<name>"). --rev REV also checks and times the cuda backend as
it was at git revision REV ("cuda@REV", its stages "cuda@REV/<stage>"), in the same process on the same inputs.
The official protocol's figure (host clock around the call) is `kbench perf moe --backend cuda`. Floor = max(FLOPs /
790 TF/s fp16, bytes / 3.0 TB/s). --paths: instead, each kernel's time through each entry point (kernel_paths).

Peer: FlashInfer's CUTLASS fused MoE (TensorRT-LLM's kernels), timed as "flashinfer" with the router included, the
shared expert as one more expert every token picks with weight 1, when `import flashinfer` works (not on the GPU
image: carry its wheel, device README). Its weights are stacked once per case, outside the timing (the leaderboard
would make it stack them every call), and its autotuner picks its GEMM tactics once per case before the timing.
Its sm90 module is built on a CPU machine with only the fp16 kernels (benchmarks/flashinfer_moe_build.py: 25
translation units instead of 171, too many for one device call) and carried with the wheels (gpu_session.sh part
moe-peer).
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys

import torch
import torch.nn.functional as F

from kbench import benchlib, problems
from kbench.evaluator import guards

guards.torch = torch  # the harness sets it when it starts; guards.clone needs it

F16_FLOPS, HBM_BPS = 790e12, 3.0e12
STAGES = ("route", "gather", "gemm1", "gemm2", "combine")
# candidate name -> knobs; predictions in docs/moe-notes.md
CANDIDATES = {
    "eager": {"KBENCH_MOE_GRAPH": "0"},
    "skip-halves": {"KBENCH_MOE_SKIP_EMPTY_HALVES": "1"},  # at every size
    "keep-ws": {"KBENCH_MOE_KEEP_WORKSPACES": "1"},
    "stages3": {"KBENCH_MOE_STAGES": "3"},
    "all": {"KBENCH_MOE_SKIP_EMPTY_HALVES": "1", "KBENCH_MOE_KEEP_WORKSPACES": "1"},
    # the build before red-combine and split-route became the default (rows "cuda+red+split" etc. measured them)
    "combine-pass": {"KBENCH_MOE_RED_COMBINE": "0"},
    "one-block-route": {"KBENCH_MOE_SPLIT_ROUTE": "0"},
    "previous": {"KBENCH_MOE_RED_COMBINE": "0", "KBENCH_MOE_SPLIT_ROUTE": "0"},
    # the consumers' own epilogue (4 stages) as before 2026-11-25: in both GEMMs, in GEMM 2 only, in GEMM 1 only
    "sync-epi": {"KBENCH_MOE_ASYNC_EPILOGUE": "0"},
    "sync-epi2": {"KBENCH_MOE_ASYNC_EPILOGUE": "1"},
    "sync-epi1": {"KBENCH_MOE_ASYNC_EPILOGUE": "2"},
    "shared-last": {"KBENCH_MOE_SHARED_FIRST": "0"},
    # the gather pass (and the shared expert's GEMM 1 before the router), as before the twenty-second session
    "gather-pass": {"KBENCH_MOE_SHARED_GATHER": "0"},
    # the builds before the twenty-fourth session: the shared launch's gather by bulk copies through the TMA unit
    # (not the load/store units), a group's units n-tile by n-tile over all its m-tiles (not in bands of 16), both
    "tma-gather": {"KBENCH_MOE_GATHER_LSU": "0"},
    "no-band": {"KBENCH_MOE_BAND": "0"},
    "tma-gather-no-band": {"KBENCH_MOE_GATHER_LSU": "0", "KBENCH_MOE_BAND": "0"},
    # ring stages of k 32 (6 x 24 KB instead of 3 x 48 KB; the default since the twenty-fifth session in the shared
    # expert's GEMM 1 and GEMM 2, measured as "bk32-shared-gemm2"): in every GEMM launch, in none (the build before),
    # in GEMM 2 only
    "bk32": {"KBENCH_MOE_BK32": "7"},
    "bk64": {"KBENCH_MOE_BK32": "0"},
    "bk32-gemm2": {"KBENCH_MOE_BK32": "4"},
    # the empty halves' MMAs issued at every size (skip-halves, on by default where experts average <= 512 rows since
    # the twenty-sixth session, off: the build before)
    "no-skip": {"KBENCH_MOE_SKIP_EMPTY_HALVES": "0"},
    # each unit decoded at its start with the group scan from group 0 (the build before the twenty-seventh session;
    # decode-ahead: the next unit decoded under this one's last MMAs, the scan from the previous unit's group)
    "decode-scan": {"KBENCH_MOE_DECODE_AHEAD": "0"},
    # the graph's launch key read through Python's data_ptr() after a separate moe_output call (the build before the
    # twenty-ninth session; moe_prepare: both in one extension call)
    "py-key": {"KBENCH_MOE_PY_KEY": "1"},
    # the graph found and launched by entry.py's Python path (the build before the thirtieth session; moe_replay:
    # the inputs checked, the output made and the graph launched in one extension call)
    "py-replay": {"KBENCH_MOE_FAST_REPLAY": "0"},
    # the output's address written to the device slot by a one-thread kernel (the build before the thirtieth
    # session; now the stream's own 64-bit write, cuStreamWriteValue64)
    "publish-kernel": {"KBENCH_MOE_PUBLISH_KERNEL": "1", "KBENCH_MOE_LATE_OUTPUT": "0"},
    # the fast path's output made, and its address written by the stream, before the graph's launch (the build before
    # the thirty-fifth session; late-output: the graph launched first, the output made behind it, its address taken
    # by the graph's routing from mapped host memory, _common/late_address.h)
    "early-output": {"KBENCH_MOE_LATE_OUTPUT": "0"},
    # a distrusted key captured only when it comes twice in a row (the build before the thirty-seventh session; now
    # when it comes back within two calls: leaderboard mode's inputs alternate between two address sets)
    "twice-in-a-row": {"KBENCH_GRAPH_RECUR": "1"},
    # the router's softmax and top-k by ATen's ops, then route_count_kernel (the build before the forty-seventh
    # session; fused_topk: one launch with their numerics that also counts the routing's pairs, router.cuh)
    "aten-topk": {"KBENCH_MOE_FUSED_TOPK": "0"},
    # moe_replay reading its ~20 knobs through getenv every call (the build before the forty-seventh session's
    # kb::KnobsMemo, which reads them again only when a KBENCH_MOE_ variable changed)
    "knob-reads": {"KBENCH_MOE_KNOB_MEMO": "0"},
    # moe_replay describing and comparing all 101 inputs before it launches the held graph (the build before the
    # forty-eighth session's speculation: the graph whose router inputs match launched first, called off if the rest
    # differs)
    "no-speculate": {"KBENCH_MOE_SPECULATE": "0"},
    # the shipped build under another name (no knob set): the method's own bias between two variants in one process
    "same": {},
}


def official_checks(mod, ref) -> list[str]:
    spec = problems.load_spec("moe")
    failures = []
    for case in list(spec.tests) + list(spec.benchmarks):
        data = ref.generate_input(**problems.official_case(case))
        benchlib.poison_allocator()
        ok, msg = ref.check_implementation(data, mod.custom_kernel(data))
        line = f"official {problems.format_case(case)}: {'ok' if ok else msg}"
        print(line, flush=True)
        if not ok:
            failures.append(line)
        del data
    return failures


def floor_us(case) -> float:
    roofline = problems.load_spec("moe").roofline
    return 1e6 * max(roofline.flops(case) / F16_FLOPS, roofline.bytes(case) / HBM_BPS)


def flashinfer_moe(data, ref):
    """FlashInfer's cutlass_fused_moe on the official inputs: (function computing out [bs, seqlen, d] fp16, its
    tolerance ratio against the reference), or None without flashinfer. fc1 rows hold one half of SwiGLU, then the
    other; which half is the gate in its convention is found by trying both against the reference."""
    if importlib.util.find_spec("flashinfer") is None:
        return None
    from flashinfer.fused_moe import cutlass_fused_moe

    x, weights, config = data
    n_experts, k, d = config["n_routed_experts"], config["n_experts_per_token"], x.shape[-1]
    names = [f"experts.{e}" for e in range(n_experts)] + ["shared_experts"]
    fc2 = torch.stack([weights[f"{n}.2.weight"].t() for n in names]).contiguous()  # [E+1, d, dexp]
    expected = ref.ref_kernel(data)

    def layer(fc1):
        def run():
            scores, experts = torch.topk(F.linear(x, weights["router.weight"]).softmax(-1), k=k, dim=-1, sorted=False)
            t = experts.numel() // k
            shared = torch.full((t, 1), n_experts, dtype=torch.int32, device=x.device)
            out = cutlass_fused_moe(x.view(t, d), torch.cat([experts.view(t, k).int(), shared], 1),
                                    torch.cat([scores.view(t, k).float(), torch.ones_like(shared, dtype=torch.float)], 1),
                                    fc1, fc2, torch.float16, quant_scales=[])
            return (out[0] if isinstance(out, (list, tuple)) else out).view(x.shape)
        return run

    best = None
    for first, second in ((1, 0), (0, 1)):  # (up, gate) or (gate, up) as fc1's first half
        fc1 = torch.stack([torch.cat([weights[f"{n}.{first}.weight"].t(), weights[f"{n}.{second}.weight"].t()])
                           for n in names]).contiguous()  # [E+1, 2 dexp, d]
        run = layer(fc1)
        ratio = benchlib.tolerance_ratio(run(), expected, 1e-2, 1e-2)
        if best is None or ratio < best[1]:
            best = (run, ratio)
        del fc1
    # its autotuner profiles the GEMM tactics for this token count once (without it a default tactic runs)
    from flashinfer.autotuner import autotune
    with autotune(True):
        best[0]()
    return best


def extension_args(data) -> tuple:
    """The extension's arguments for one official input, routed as custom_kernel routes it: (x [T, d], experts
    [T, K] int64, scores [T, K] fp16, gate, up and down weight lists: the routed experts', then the shared one's)."""
    x, weights, config = data
    k = config["n_experts_per_token"]
    scores, experts = torch.topk(F.linear(x, weights["router.weight"]).softmax(-1), k=k, dim=-1, sorted=False)
    names = [f"experts.{e}" for e in range(config["n_routed_experts"])] + ["shared_experts"]
    ws = [[weights[f"{n}.{i}.weight"] for n in names] for i in range(3)]
    return (x.view(-1, x.shape[-1]), experts.view(-1, k), scores.view(-1, k), *ws)


def time_case(case, cuda_mod, torch_mod, runs, candidates, revisions) -> dict:
    ref = problems.load_modules("moe").reference
    data = ref.generate_input(**problems.official_case(case))
    timer = benchlib.Timer()
    row = {"case": problems.format_case(case), "floor": floor_us(case)}
    # the shipped build, its candidates and the revisions in alternating rounds (benchlib.interleaved)
    variants = {"cuda": (lambda: cuda_mod.custom_kernel(data), {})}
    variants |= {f"cuda+{n}": (lambda: cuda_mod.custom_kernel(data), CANDIDATES[n]) for n in candidates}
    variants |= {name: (lambda mod=mod: mod.custom_kernel(data), {}) for name, mod in revisions.items()}
    row |= benchlib.interleaved(timer, variants, runs)
    # the official timer's window (host clock, no flush) of the same variants, alternating as well: a change of a few
    # us shows here, where kbench perf's runs on one machine spread by ~1% (docs/moe-notes.md, forty-seventh session)
    windows = benchlib.interleaved_samples(benchlib.host_samples, variants, runs)
    row |= {f"{name}[window]": benchlib.median(got) for name, got in windows.items()}
    peer = flashinfer_moe(data, ref)
    if peer is not None:
        print(f"{row['case']}: flashinfer's layer within {peer[1]:.2f}x of the tolerance", flush=True)
        row["flashinfer"] = timer(peer[0], runs)
        del peer
    torch_mod.MOE_PATH = "loop"
    row["torch"] = timer(lambda: torch_mod.custom_kernel(data), max(3, runs // 5))
    if hasattr(torch, "_grouped_mm"):
        torch_mod.MOE_PATH, torch_mod.GROUPED_DTYPE = "grouped", torch.bfloat16
        try:
            row["torch_grouped_bf16"] = timer(lambda: torch_mod.custom_kernel(data), max(3, runs // 5))
        except Exception as exc:  # noqa: BLE001 - a torch without the bf16 fast path: no column
            print(f"torch grouped bf16: {type(exc).__name__}: {exc}", flush=True)
        torch_mod.MOE_PATH, torch_mod.GROUPED_DTYPE = "auto", None
    # the five stages, from events between the launches (median per stage), for revisions too (their dev builds)
    args = extension_args(data)
    staged = {"": (lambda: cuda_mod.ext.moe_forward_staged(*args)[1], {})}
    staged |= {f"cuda+{n}/": (lambda: cuda_mod.ext.moe_forward_staged(*args)[1], CANDIDATES[n]) for n in candidates}
    staged |= {f"{n}/": (lambda mod=mod: mod.ext.moe_forward_staged(*args)[1], {}) for n, mod in revisions.items()
               if hasattr(mod.ext, "moe_forward_staged")}
    # in alternating rounds (benchlib.interleaved), each stage's times as the call returns them (after a knob's
    # first call)
    stage_runs = benchlib.interleaved_samples(lambda fn, n, warmup: [fn() for _ in range(warmup + n)][warmup:],
                                              staged, runs, warmup=1)
    for prefix, got in stage_runs.items():
        for i, name in enumerate(STAGES):
            row[prefix + name] = benchlib.median([r[i] * 1e3 for r in got])
    return row


def uniform_stages(cuda_mod, runs: int, candidates: list, tokens=(2048, 8192), E=32, K=4) -> list:
    """The GEMMs' efficiency apart from the routing: every routed expert gets exactly T*K/E rows (token t's slot k
    goes to expert (t K + k) mod E), so at the official token counts no group ends in a partial m-tile and every unit
    lasts as long as its neighbours (against the official cases: what the padding costs, docs/moe-notes.md); the
    official weights' shapes, random values. Rows: backend "<build>[uniform]/<stage>", metric kernel,
    case the official case's keys but the seed."""
    gpu, rows = torch.cuda.get_device_name(), []
    d, dexp = 7168, 2048
    gen = torch.Generator(device="cuda").manual_seed(7)
    ws = [[(torch.randn(r, c, generator=gen, device="cuda") / c ** 0.5).half() for _ in range(E + 1)]
          for r, c in ((d, dexp), (d, dexp), (dexp, d))]
    for T in tokens:
        x = torch.randn(T, d, generator=gen, device="cuda").half()
        experts = ((torch.arange(T, device="cuda")[:, None] * K + torch.arange(K, device="cuda")) % E).long()
        scores = torch.rand(T, K, generator=gen, device="cuda").half()
        # the official case's keys without a seed (the routing is not drawn); the backend name says "[uniform]"
        case = (f"dhidden: {d}; dexpert: {dexp}; nroutedexperts: {E}; nsharedexperts: 1; nexpertspertoken: {K}; "
                f"bs: 1; seqlen: {T}")
        for name, settings in [("cuda", {})] + [(f"cuda+{n}", CANDIDATES[n]) for n in candidates]:
            with benchlib.knobs(settings):
                stage_runs = [cuda_mod.ext.moe_forward_staged(x, experts, scores, *ws)[1] for _ in range(runs)]
            stage_us = {s: benchlib.median([r[i] * 1e3 for r in stage_runs]) for i, s in enumerate(STAGES)}
            rows += [benchlib.Row(gpu, 1, f"{name}[uniform]/{s}", "kernel", case, us) for s, us in stage_us.items()]
            print(f"{case} {name}: " + ", ".join(f"{s} {us:.1f}" for s, us in stage_us.items()), flush=True)
    del ws
    return rows


# --trace: the dev build's per-unit stamps (grouped_gemm.cuh, kTraceFields) of each GEMM launch of one call
TRACE_LAUNCHES = ("shared-gemm1", "gemm1", "gemm2", "shared-gemm1-first")  # moe.cu's launch index
TRACE_UNITS, TRACE_FIELDS = 16384, 8
MMA_CYCLES_PER_KB = 1024  # 8 wgmma m64n256k16 a k-block (two consumer warpgroups, 4 k16 steps), 128 cycles each


def unit_stats(stamps: torch.Tensor, num_kb: int) -> dict | None:
    """One GEMM launch's units from its stamps (int64 or float64 [units, TRACE_FIELDS]; rows never written are zero).
    Times in us, `mhz` the SM clock over the units (clock64 against the global timer); per unit means: `unit` (loop
    start to last MMA done), `peak` (its MMAs at the tensor cores' peak at that clock), `wait` (on full barriers),
    `first` (loop start to its first stage landed), `handover` (last MMA done to the staging written); `span` (first
    unit's start to the last unit's end), `tail` (the last SM's end after the median SM's), `mma_share` = peak
    work / (SMs x span), `skew` (the median SM's first unit start after the earliest: the launch filling SMs as the
    previous kernel leaves them), `gap` (per unit, from an SM's previous hand-over to its next unit's start), and the
    same unit means over `tail_units` (a group's last m-tile with <= 64 rows) and `full_units` (128 rows). None
    without stamps."""
    written = stamps[stamps[:, 1] > 0]
    if len(written) == 0:
        return None
    t, word = written.double(), written[:, 0]
    sm, rows = (word & 255), (word >> 24) & 255
    ns, clk = t[:, 3] - t[:, 1], t[:, 5] - t[:, 4]
    mhz = clk.sum().item() / (t[:, 3] - t[:, 2]).sum().item() * 1e3
    peak_us = num_kb * MMA_CYCLES_PER_KB / mhz

    def means(sel) -> dict:
        if not bool(sel.any()):
            return {"n": 0}
        return {"n": int(sel.sum()), "unit": ns[sel].mean().item() / 1e3,
                "wait": (t[sel, 6].mean() / mhz).item(), "first": (t[sel, 2] - t[sel, 1]).mean().item() / 1e3,
                "handover": (t[sel, 7] - t[sel, 3]).mean().item() / 1e3}

    start, end = t[:, 1].min(), t[:, 7].max()
    per_sm = [t[sm == s] for s in sm.unique()]
    last_end = torch.stack([u[:, 7].max() for u in per_sm])
    first_start = torch.stack([u[:, 1].min() for u in per_sm])
    gaps = []  # an SM's units in start order: each start after the previous unit's hand-over
    for u in per_sm:
        u = u[u[:, 1].argsort()]
        gaps.append(u[1:, 1] - u[:-1, 7])
    gaps = torch.cat(gaps)
    sms = len(last_end)
    out = {"units": len(t), "sms": sms, "mhz": mhz, "peak": peak_us, "span": (end - start).item() / 1e3,
           "tail": (end - last_end.median()).item() / 1e3, "skew": (first_start.median() - start).item() / 1e3,
           "gap": gaps.mean().item() / 1e3 if len(gaps) else 0.0, **means(torch.ones_like(ns, dtype=torch.bool))}
    out["mma_share"] = len(t) * peak_us / (sms * out["span"])
    out["tail_units"] = means(rows <= 64)
    out["full_units"] = means(rows == 128)
    return out


def unit_trace(cuda_mod, runs: int, candidates: dict) -> list:
    """--trace: every GEMM unit's stamps (a dev build, KBENCH_MOE_DEV_TRACE) on the benchmark cases, the layer
    called eagerly (KBENCH_MOE_GRAPH=0: the same kernels the graph replays) in two regimes: `official` (each call
    after the harness's clone of the inputs and a synchronize, as the official loop runs it) and `back-to-back`
    (runs calls in a row, the last one's stamps: the GEMMs at the board's power cap). Per launch the medians over
    the runs of unit_stats. The shipped configuration, then each of `candidates` (name -> knobs). Rows: backend
    cuda[dev,<regime>]/trace:<launch>:<quantity> (a candidate's: cuda+<name>[dev,<regime>]/...), metric trace
    (us)."""
    gpu, rows, table = torch.cuda.get_device_name(), [], []
    ref = problems.load_modules("moe").reference
    stamps = torch.zeros(len(TRACE_LAUNCHES) * TRACE_UNITS * TRACE_FIELDS, dtype=torch.int64, device="cuda")
    for case in problems.load_spec("moe").benchmarks:
        data = ref.generate_input(**problems.official_case(case))
        x, weights, config = data
        k_gemm2 = weights["experts.0.2.weight"].shape[0]  # d_expert: GEMM 2's reduction; GEMM 1's is d_hidden
        num_kb = {n: (k_gemm2 if n == "gemm2" else x.shape[-1]) // 64 for n in TRACE_LAUNCHES}
        label = problems.format_case(case)
        for (build, settings), regime in itertools.product([("cuda", {})] + [(f"cuda+{n}", k) for n, k in
                                                             candidates.items()], ("official", "back-to-back")):
            per_run = []
            with benchlib.knobs({**settings, "KBENCH_MOE_DEV_TRACE": str(stamps.data_ptr()),
                                 "KBENCH_MOE_GRAPH": "0"}):
                # official: `runs` calls measured, each alone; back-to-back: the last of `runs` calls in a row
                for _ in range(runs if regime == "official" else 1):
                    stamps.zero_()
                    if regime == "official":
                        given = guards.clone(data)  # the harness's clone
                        torch.cuda.synchronize()
                        cuda_mod.custom_kernel(given)
                        del given
                    else:
                        for _ in range(runs):
                            cuda_mod.custom_kernel(data)
                    torch.cuda.synchronize()
                    s = stamps.view(len(TRACE_LAUNCHES), TRACE_UNITS, TRACE_FIELDS).cpu()
                    per_run.append({n: unit_stats(s[i], num_kb[n]) for i, n in enumerate(TRACE_LAUNCHES)})
            for name in TRACE_LAUNCHES:
                found = [r[name] for r in per_run if r[name]]
                if not found:
                    continue
                med = {k: benchlib.median([f[k] for f in found]) for k in
                       ("units", "mhz", "span", "unit", "peak", "wait", "first", "handover", "tail", "skew", "gap",
                        "mma_share")}
                tails = [f["tail_units"]["unit"] for f in found if f["tail_units"]["n"]]
                fulls = [f["full_units"]["unit"] for f in found if f["full_units"]["n"]]
                med["tail_unit"] = benchlib.median(tails) if tails else None
                med["full_unit"] = benchlib.median(fulls) if fulls else None
                backend = f"{build}[dev,{regime}]/trace:{name}"
                rows += [benchlib.Row(gpu, 1, f"{backend}:{q}", "trace", label, med[q])
                         for q in ("span", "unit", "peak", "wait", "first", "handover", "tail", "skew", "gap",
                                   "tail_unit", "full_unit") if med[q] is not None and med[q] > 0]
                table.append([label.split("; seed")[0].split("; ")[-1], build, regime, name, f"{med['units']:.0f}",
                              f"{med['mhz']:.0f}", med["span"], med["unit"], med["peak"], med["wait"], med["first"],
                              med["handover"], med["tail"], med["skew"], med["gap"], f"{med['mma_share']:.2f}",
                              med["tail_unit"], med["full_unit"]])
        del data, x, weights
    benchlib.table(f"moe GEMM units (dev build, eager calls; us but MHz; medians over runs) on {gpu}",
                   ["case", "build", "regime", "launch", "units", "MHz", "span", "unit", "at peak", "wait", "first",
                    "handover", "tail", "skew", "gap", "MMA share", "tail unit", "full unit"], table)
    return rows


def stage_of(kernel: str) -> str:
    """The STAGES name of one of the backend's kernels, from its profiler name ("void moe::route_kernel(...)")."""
    name = kernel.split("(")[0].replace("void ", "").replace("moe::", "")
    return {"grouped_gemm_kernel<true": "gemm1", "grouped_gemm_kernel<false": "gemm2"}.get(
        name.split(",")[0], name.replace("_kernel", ""))


def kernel_paths(cuda_mod, revisions: dict, runs: int, rounds: int = 2) -> None:
    """Per kernel, the median device time (torch profiler) of the same layer called through each entry point on the
    benchmark cases: the extension's one call (combine inside), its staged variant (events between the launches;
    also each revision's), moe_experts then moe_combine from Python (the combine-pass path), custom_kernel eager (KBENCH_MOE_GRAPH=0) and
    custom_kernel replaying its graph. Every path runs once a round, the rounds one after the other (a cell: round
    1 / round 2 ...), so drift over the process shows. A kernel whose time depends on the path shows what the path
    changes. Rows: metric "profiler", backend "cuda[<path>]/<kernel>" (a revision's: "<rev>[staged]/<kernel>"), one
    a round."""
    from torch.profiler import ProfilerActivity, profile

    from kbench.evaluator import timing

    ref = problems.load_modules("moe").reference
    gpu, results = torch.cuda.get_device_name(), []
    for case in problems.load_spec("moe").benchmarks:
        data = ref.generate_input(**problems.official_case(case))
        args = extension_args(data)

        def experts_then_combine():
            y = cuda_mod.ext.moe_experts(*args, None)  # Y: the combine-pass path (KBENCH_MOE_RED_COMBINE=0)
            return cuda_mod.ext.moe_combine(y, args[2])

        paths = {"forward": (lambda: cuda_mod.ext.moe_forward(*args), {}),
                 "staged": (lambda: cuda_mod.ext.moe_forward_staged(*args), {})}
        paths.update({f"{n} staged": ((lambda m=mod: m.ext.moe_forward_staged(*args)), {})
                      for n, mod in revisions.items()})
        paths.update({"experts+combine": (experts_then_combine, {"KBENCH_MOE_RED_COMBINE": "0"}),
                      "custom eager": (lambda: cuda_mod.custom_kernel(data), {"KBENCH_MOE_GRAPH": "0"}),
                      "custom graph": (lambda: cuda_mod.custom_kernel(data), {})})
        table = {}
        for _ in range(rounds):
            for name, (fn, settings) in paths.items():
                with benchlib.knobs(settings):
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(runs):
                            fn()
                            torch.cuda.synchronize()
                per_kernel = {}
                for kname, _, dur in timing.device_work(prof):
                    if kname.startswith(("void moe::", "moe::")):
                        per_kernel.setdefault(stage_of(kname), []).append(dur)
                for kname, durs in per_kernel.items():
                    table.setdefault(kname, {}).setdefault(name, []).append(benchlib.median(durs))
        benchlib.table(f"moe kernels by entry point (us, median of {runs} a round): {problems.format_case(case)}",
                       ["kernel", *paths],
                       [[kn] + [" / ".join(f"{m:.0f}" for m in v[p]) if p in v else "—" for p in paths]
                        for kn, v in table.items()])
        line = problems.format_case(case)
        results += [benchlib.Row(gpu, 1, (f"{p[:-len(' staged')]}[staged]" if p.endswith(" staged")
                                          else f"cuda[{p.replace(' ', '-')}]") + f"/{kn}", "profiler", line, m)
                    for kn, v in table.items() for p in paths for m in v.get(p, [])]
        del data
    benchlib.record("moe", results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--candidates", default=",".join(CANDIDATES),
                    help=f"comma-separated, of {', '.join(CANDIDATES)} ('' for none)")
    ap.add_argument("--rev", action="append", default=[], metavar="REV",
                    help="also check and time the cuda backend of this git revision (repeatable)")
    ap.add_argument("--official", metavar="MODES",
                    help="instead of timing kernels: judge the shipped build and each candidate with kbench perf in "
                         "these modes (comma-separated: benchmark,leaderboard)")
    ap.add_argument("--paths", action="store_true",
                    help="instead of timing: each kernel's device time through each entry point (kernel_paths)")
    ap.add_argument("--uniform", action="store_true",
                    help="instead of the official cases: every expert the same row count (uniform_stages)")
    ap.add_argument("--tokens", default="2048,8192", help="with --uniform: the token counts")
    ap.add_argument("--trace", action="store_true",
                    help="instead of timing: every GEMM unit's stamps, official and back-to-back (unit_trace)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --official: judge every configuration this many times, in alternating order")
    args = ap.parse_args()
    if args.official:
        benchlib.official_figures("moe", "cuda", benchlib.selected(CANDIDATES, args.candidates),
                                  args.official.split(","), rounds=args.rounds)
        return
    gpu = torch.cuda.get_device_name()
    cuda_mod = benchlib.build("moe", "cuda", dev=True)
    if args.paths:
        revisions, _ = benchlib.checked_revisions("moe", "cuda", args.rev, lambda mod: [], dev=True)
        kernel_paths(cuda_mod, revisions, args.runs)
        return
    if args.trace:
        benchlib.record("moe", unit_trace(cuda_mod, args.runs, benchlib.selected(CANDIDATES, args.candidates)))
        return
    if args.uniform:
        benchlib.record("moe", uniform_stages(cuda_mod, args.runs, benchlib.selected(CANDIDATES, args.candidates),
                                              tuple(int(t) for t in args.tokens.split(","))))
        return
    ref = problems.load_modules("moe").reference
    failures = official_checks(cuda_mod, ref)
    candidates, wrong = benchlib.checked_candidates(CANDIDATES, args.candidates, lambda: official_checks(cuda_mod, ref))
    failures += wrong  # a candidate that fails a check is not timed
    revisions, wrong = benchlib.checked_revisions("moe", "cuda", args.rev, lambda mod: official_checks(mod, ref),
                                                  dev=True)
    failures += wrong
    torch_mod = benchlib.build("moe", "torch")
    rows = [time_case(c, cuda_mod, torch_mod, args.runs, candidates, revisions)
            for c in problems.load_spec("moe").benchmarks]
    backends = [("cuda", "cuda"), ("torch", "torch"), ("torch_grouped_bf16", "torch-grouped-bf16"),
                ("flashinfer", "flashinfer")] + \
        [(s, f"cuda/{s}") for s in STAGES] + [(f"cuda+{n}", f"cuda+{n}") for n in candidates] + \
        [(f"cuda+{n}/{s}", f"cuda+{n}/{s}") for n in candidates for s in STAGES] + [(n, n) for n in revisions] + \
        [(f"{n}/{s}", f"{n}/{s}") for n in revisions for s in STAGES]
    results = [benchlib.Row(gpu, 1, name, "kernel", r["case"], r[key]) for r in rows for key, name in backends
               if r.get(key)]
    results += [benchlib.Row(gpu, 1, name, "kernel", "geomean", benchlib.geomean(r.get(key) for r in rows))
                for key, name in backends if benchlib.geomean(r.get(key) for r in rows)]
    windows = [f"{n}[window]" for n in ["cuda", *(f"cuda+{c}" for c in candidates), *revisions]]
    results += [benchlib.Row(gpu, 1, w, "host-loop", r["case"], r[w]) for r in rows for w in windows]
    results += [benchlib.Row(gpu, 1, w, "host-loop", "geomean", benchlib.geomean(r[w] for r in rows))
                for w in windows]
    benchlib.record("moe", results)
    cols = ["floor", "cuda", *(f"cuda+{n}" for n in candidates), *revisions, *windows, "flashinfer", "torch",
            "torch_grouped_bf16", *STAGES]
    geo = {c: benchlib.geomean(r.get(c) for r in rows) for c in cols}
    benchlib.table(f"moe on {gpu} (us; kernel = CUDA events, L2 flushed; [window] = host clock, no flush); "
                   f"failures: {len(failures)}", ["case"] + cols + ["cuda / floor"],
                   [[r["case"]] + [r.get(c) for c in cols] + [f"{r['cuda'] / r['floor']:.2f}x"] for r in rows] +
                   [["geomean"] + [geo[c] for c in cols] + [f"{geo['cuda'] / geo['floor']:.2f}x"]])
    for msg in failures[:10]:
        print("  FAIL " + msg)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
