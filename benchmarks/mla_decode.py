"""mla-decode on one Hopper GPU: the CUDA backend against the torch backend, in one process on the same inputs;
correctness on every official case first, then time.

    python benchmarks/mla_decode.py      # table last; rows into benchmarks/results/mla-decode.csv

Times (us): "kernel" = kbench's CUDA-event timer around one call, L2 flushed, median. The attention kernel alone is
timed on the call's own q and cache; GB/s counts the cache rows it must read (kv_len x 576 x 2 bytes per batch row);
"GB/s[+q,o]" adds q and the output, as FlashMLA's benchmark counts its "GB/s" (the issue's public anchor).
The projections' share is the end-to-end time minus the attention kernel. The official protocol's figure (host
clock around the call) is `kbench perf mla-decode --backend cuda`. Floor: problems/mla-decode/spec.yml roofline at
790 TF/s bf16 and 3.0 TB/s.

Peer: FlashInfer's MLA decode (BatchMLAPagedAttentionWrapper), timed as "flashinfer/attention" on the same q and
cache (copied once into its paged layout, 64-row pages, the rope keys rotated as the reference rotates them) when
`import flashinfer` works; its output is compared with our attention kernel's first. It is not on the GPU image:
carry its wheel (device README; flashinfer-python 0.5.3 with apache-tvm-ffi) and put it on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import math
import os
import statistics
import sys
import time

import torch

from kbench import benchlib, problems

BF16_FLOPS, HBM_BPS = 790e12, 3.0e12
# candidate name -> knobs (kernels/mla-decode/cuda/mla_api.h: MlaConfig); predictions in docs/mla-decode-notes.md.
# Each is checked on every official case, then timed beside the default as "cuda+<name>"; --rev REV does the same
# for the cuda backend as it was at git revision REV ("cuda@REV").
CANDIDATES = {"eager": {"KBENCH_MLA_GRAPH": "0"},
              "rope-after-tile": {"KBENCH_MLA_ROPE_FIRST": "0"},
              "two-s": {"KBENCH_MLA_S_ONCE": "0"},
              "two-s-no-prefetch": {"KBENCH_MLA_S_ONCE": "0", "KBENCH_MLA_PREFETCH_TABLES": "0"},
              "seesaw": {"KBENCH_MLA_SEESAW": "1"},
              # every projection through cuBLAS (before finding 31: wo through linear.cuh, the rest cuBLAS)
              "cublas": {"KBENCH_MLA_LINEAR": "0"},
              # the two per-head GEMMs through cuBLAS's strided batched GEMM (before finding 32)
              "cublas-bmm": {"KBENCH_MLA_HEAD_GEMM": "0"},
              "no-pdl": {"KBENCH_MLA_LINEAR_PDL": "0"},
              # the output rows stored from registers (before finding 34)
              "row-stores": {"KBENCH_MLA_BULK_STORE": "0"},
              # the staged rows written by bulk copies (before finding 37 made staged_st, 16-byte stores, the default)
              "bulk-copies": {"KBENCH_MLA_STAGED_ST": "0"},
              # one CTA a work item (before finding 61 made the persistent kernel, one CTA an SM walking its items
              # through one ring, the default where there are more items than SMs)
              "one-item": {"KBENCH_MLA_PERSISTENT": "0"},
              # the cache's last tile computed whole where it holds <= 16 rows (before finding 42 made narrow_tail,
              # 16-row boxes, m64n16 S and one P V step, the default)
              "wide-tail": {"KBENCH_MLA_NARROW_TAIL": "0"},
              # the step's graph found and launched by entry.py's Python path (the build before the thirtieth session;
              # mla_replay: the inputs checked, the length written and the graph launched in one extension call)
              "py-replay": {"KBENCH_MLA_FAST_REPLAY": "0"},
              # the fast path writing the cache length by the stream before the launch and copying the graph's output
              # after it (the build before the thirty-sixth session's late length and output)
              "early-length": {"KBENCH_MLA_LATE": "0"},
              # a distrusted key captured only when it comes twice in a row (graph_replay's policy before the
              # thirty-seventh session; now when it comes back within two calls)
              "twice-in-a-row": {"KBENCH_GRAPH_RECUR": "1"},
              # the Python path's length written (fill_) and its key read before an eager step's launches (the build
              # before the thirty-seventh session)
              "key-first": {"KBENCH_MLA_EAGER_FIRST": "0"},
              # kv_down and q_down in launches of their own, kv_down's first (the build before finding 54)
              "split-down": {"KBENCH_MLA_FUSED_DOWN": "0"},
              # graphs captured on their inputs' addresses only (the build before the thirty-eighth session; now a
              # moving graph takes each call's addresses: kernels/_common/moving_inputs.h)
              "fixed-addresses": {"KBENCH_MLA_MOVING": "0"},
              # mla_replay reading its ~20 knobs through getenv every call (the build before the forty-seventh
              # session's kb::KnobsMemo, which reads them again only when a KBENCH_MLA_ variable changed)
              "knob-reads": {"KBENCH_MLA_KNOB_MEMO": "0"},
              # q_up, then the per-head W_UK GEMM in a launch of its own (the build before finding 59's absorbing
              # q_up: each q_up CTA multiplies its head's q_nope by W_UK in its epilogue)
              "separate-uk": {"KBENCH_MLA_ABSORB_UK": "0"},
              # each stage released and reloaded whole, once both warpgroups are done with it (the build before
              # finding 65's split release)
              "whole-stage": {"KBENCH_MLA_SPLIT_RELEASE": "0"}}
# The step's projections at the official dims (batch 128): name -> (n, k) of W [n, k]; x is [128, k].
PROJECTIONS = {"kv_down": (576, 7168), "q_down": (1536, 7168), "q_up": (24576, 1536), "wo": (7168, 16384)}


def checks(mod, ref) -> list[str]:
    failures = []
    spec = problems.load_spec("mla-decode")
    for case in list(spec.tests) + list(spec.benchmarks):
        data = ref.generate_input(**problems.official_case(case))
        check = ref.copy_data(data)
        benchlib.poison_allocator()
        ok, msg = ref.check_implementation(check, mod.custom_kernel(data))
        line = f"official {problems.format_case(case)}: {'ok' if ok else msg}"
        print(line, flush=True)
        if not ok:
            failures.append(line)
        del data, check
    return failures


def flashinfer_attention(q: torch.Tensor, cache: torch.Tensor, kv_len: int, cos: torch.Tensor, sin: torch.Tensor):
    """FlashInfer's MLA decode on our inputs: q [bs, 128, 576] bf16 (absorbed q_nope | roped q_pe), cache
    [bs, max_seq, 576] bf16 (latent | un-rotated k_rope), cos/sin [max_seq, 32] bf16. Returns a function that runs
    it (output [bs, 128, 512] bf16), or None without flashinfer."""
    if importlib.util.find_spec("flashinfer") is None:
        return None
    import flashinfer

    bs, page = q.shape[0], 64
    pages = (kv_len + page - 1) // page
    rows = cache[:, :pages * page]
    c, s = torch.cat([cos[:pages * page]] * 2, -1), torch.cat([sin[:pages * page]] * 2, -1)
    kr = rows[..., 512:]
    kr = kr * c + torch.cat((-kr[..., 32:], kr[..., :32]), -1) * s  # the reference's bf16 RoPE of the keys
    ckv = rows[..., :512].reshape(bs * pages, page, 512).contiguous()
    kpe = kr.reshape(bs * pages, page, 64).contiguous()
    q_nope, q_pe = q[..., :512].contiguous(), q[..., 512:].contiguous()
    i32 = dict(dtype=torch.int32, device=q.device)
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=q.device))
    wrapper.plan(torch.arange(bs + 1, **i32), torch.arange(bs + 1, **i32) * pages, torch.arange(bs * pages, **i32),
                 torch.full((bs,), kv_len, **i32), 128, 512, 64, page, False, 1 / math.sqrt(192), q.dtype, cache.dtype)
    return lambda: wrapper.run(q_nope, q_pe, ckv, kpe)


def attention_inputs(mod, x, cache) -> tuple:
    """The attention kernel's arguments for a case's inputs, q random: (q [bs, 128, 576] bf16, the cache's buffer
    [bs, max_seq, 576] bf16, cos, sin: the RoPE tables at bf16 angles [max_seq, 64])."""
    q = torch.randn(x.shape[0], 128, 576, device=x.device).bfloat16()
    return q, cache.data, *mod._rope_tables(cache.data.shape[1], 64, x.device)


def time_case(case, cuda_mod, torch_mod, ref, runs, candidates, revisions) -> dict:
    roofline = problems.load_spec("mla-decode").roofline
    floor = 1e6 * max(roofline.flops(case) / BF16_FLOPS, roofline.bytes(case) / HBM_BPS)
    timer = benchlib.Timer()
    data = ref.generate_input(**problems.official_case(case))
    config, x, cache = data
    seq0 = cache.seq_len

    def call(mod):
        cache.seq_len = seq0  # the same decode step every run (the cache row is rewritten, not appended)
        return mod.custom_kernel(data)

    # the shipped build, its candidates and the revisions in alternating rounds (benchlib.interleaved)
    variants = {"cuda": (lambda: call(cuda_mod), {})}
    variants |= {f"cuda+{n}": (lambda: call(cuda_mod), CANDIDATES[n]) for n in candidates}
    variants |= {name: (lambda mod=mod: call(mod), {}) for name, mod in revisions.items()}
    row = {"case": problems.format_case(case), "floor": floor, **benchlib.interleaved(timer, variants, runs),
           "cuda_host": benchlib.host_time_us(lambda: call(cuda_mod), runs),
           "torch": timer(lambda: call(torch_mod), runs)}
    # the attention kernel alone, on this call's inputs
    bs, kv_len = x.shape[0], seq0 + 1
    q, _, cos, sin = attention_inputs(cuda_mod, x, cache)

    def attention(mod):
        return mod.ext.mla_attention(q, cache.data, kv_len, cos, sin, None)

    def gbps(us):  # the latent cache read once
        return bs * kv_len * 576 * 2 / (us * 1e-6) / 1e9

    def gbps_qo(us):  # FlashMLA's benchmark's count: the cache, q [bs, 128, 576] and the output [bs, 128, 512] bf16
        return (bs * kv_len * 576 + bs * 128 * (576 + 512)) * 2 / (us * 1e-6) / 1e9

    attentions = {"attention": (lambda: attention(cuda_mod), {})}
    attentions |= {f"cuda+{n}/attention": (lambda: attention(cuda_mod), CANDIDATES[n]) for n in candidates}
    attentions |= {f"{name}/attention": (lambda mod=mod: attention(mod), {}) for name, mod in revisions.items()}
    row |= benchlib.interleaved(timer, attentions, runs)
    row["attention_GBps"] = gbps(row["attention"])
    # the official timer flushes nothing and the step's attention follows read-mostly GEMMs: a clean L2 is its setting
    row["attention[clean-L2]"] = benchlib.Timer(clean=True)(lambda: attention(cuda_mod), runs)
    row["attention[clean-L2]_GBps"] = gbps(row["attention[clean-L2]"])
    row["attention[clean-L2]_GBps[+q,o]"] = gbps_qo(row["attention[clean-L2]"])
    peer = flashinfer_attention(q, cache.data, kv_len, cos, sin)
    if peer is not None:
        ratio = benchlib.tolerance_ratio(peer(), attention(cuda_mod), 2e-2, 8e-3)
        print(f"{row['case']}: flashinfer's attention within {ratio:.2f}x of the tolerance from ours", flush=True)
        row["flashinfer/attention"] = timer(peer, runs)
    row["projections"] = row["cuda"] - row["attention"]
    # the shipped attention once more, last: a drift across the run shows as the two figures' difference
    row["attention (again)"] = timer(lambda: attention(cuda_mod), runs)
    return row


class _EntryStamps:
    """The extension module as custom_kernel sees it (its global `ext`), each function stamping when it was first
    entered in a call (perf_counter ns, into `entered`): where the host time before mla_step goes (~1 us a call)."""

    def __init__(self, ext, entered: dict):
        self._ext, self._entered = ext, entered

    def __getattr__(self, name):
        fn = getattr(self._ext, name)
        if not callable(fn) or name in ("mla_eager_steps", "mla_replay_steps", "mla_late_wait_us"):
            return fn

        def stamped(*args, **kwargs):
            self._entered.setdefault(name, time.perf_counter_ns())
            return fn(*args, **kwargs)
        return stamped


def windows(runs: int, rounds: int, candidates: dict, leaderboard: bool = False) -> None:
    """--windows: the official benchmark loop's windows in one process (synchronize, host clock, call, synchronize,
    host clock; the same input objects every call and the cache one row longer each, as benchmark mode runs them),
    the shipped path and each candidate alternating in rounds (benchlib.interleaved_samples): a host-path change too
    small for kbench perf's spread between processes. Also the fast path's own steps (ext.mla_replay_steps: host us
    from the call's entry into the binding to its return) and, for a late graph, how long the GPU waited for the
    call's address and length (ext.mla_late_wait_us). Rows: metric host-loop, backend "cuda[windows]" and
    "cuda+<name>[windows]", the median window (us), and "<that>/replay:<step>", "<that>/late-wait", their medians.
    leaderboard: every window's inputs regenerated first (the case seed + 13 a run, while the previous run's are
    still held) and its output checked after it, as leaderboard mode runs them; the calls run eagerly, so the steps
    are the eager step's (ext.mla_eager_steps: "to-step" the host time from the window's start to mla_step, then
    mla_step's own steps; "eager:<step>" rows), "enter:<function>" the time from the window's start to each
    extension function's first entry, and "cudaMalloc calls" the caching allocator's new segments in the window (a
    count); rows under "...[leaderboard-windows]"."""
    import host_gap  # (benchmarks/host_gap.py: a script's own folder is on sys.path)
    gpu = torch.cuda.get_device_name()
    ref = problems.load_modules("mla-decode").reference
    mod = benchlib.build("mla-decode", "cuda")
    entered = {}  # leaderboard: when (perf_counter ns) the call entered each extension function it called, first time
    if leaderboard:
        mod.ext = _EntryStamps(mod.ext, entered)
    tag = "[leaderboard-windows]" if leaderboard else "[windows]"
    variants = {f"cuda{tag}": {}} | {f"cuda+{n}{tag}": k for n, k in candidates.items()}
    spec = problems.load_spec("mla-decode")
    rows, table = [], []
    for case in spec.benchmarks:
        data = ref.generate_input(**problems.official_case(case))
        # benchmark mode: the same objects every call, the cache a row longer each; leaderboard: host_gap's reseeded
        # inputs (benchmarks/host_gap.py: generated while the previous run's are held, checked after each window)
        next_inputs = (host_gap.reseeded_inputs(ref, case, data, spec.protocol.clone_inputs,
                                                spec.protocol.reseed_step, check_each=True)
                       if leaderboard else lambda: data)

        def sample(fn, n: int, warmup: int) -> list:
            for _ in range(warmup):  # (a candidate's first calls capture its graph)
                mod.custom_kernel(next_inputs())
            got = []
            for _ in range(n):
                given = next_inputs()
                entered.clear()
                segments = torch.cuda.memory_stats().get("segment.all.allocated", 0)
                collections = sum(g["collections"] for g in gc.get_stats())
                torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                out = mod.custom_kernel(given)
                torch.cuda.synchronize()
                us = (time.perf_counter_ns() - t0) / 1e3
                steps = {f"replay:{k}": v for k, v in mod.ext.mla_replay_steps()}
                if "replay:launch" not in steps:  # ran eagerly: mla_step's steps, and the host time before it
                    eager, start_ns = mod.ext.mla_eager_steps()
                    steps = ({f"enter:{name}": (ns - t0) / 1e3 for name, ns in entered.items()} |
                             {"to-step": (start_ns - t0) / 1e3} | {f"eager:{k}": v for k, v in eager})
                    # new segments: the caching allocator called cudaMalloc inside the window (a count, not us)
                    steps["cudaMalloc calls"] = torch.cuda.memory_stats().get("segment.all.allocated", 0) - segments
                    steps["gc calls"] = sum(g["collections"] for g in gc.get_stats()) - collections  # Python's
                # a late graph launched (no stream write of the length): the wait figure is then this call's
                late = "replay:output" in steps and "replay:length" not in steps
                got.append((us, steps, mod.ext.mla_late_wait_us(given[1]) if late else None))
                if leaderboard:
                    next_inputs.check(out)
            return got

        got = benchlib.interleaved_samples(sample, {name: (None, k) for name, k in variants.items()}, runs, rounds)
        label = problems.format_case(case)
        for name, samples in got.items():
            windows_us = [us for us, _, _ in samples]
            figures = {name: statistics.median(windows_us)}
            for step in dict.fromkeys(k for _, s, _ in samples for k in s):  # (steps in the order taken)
                figures[f"{name}/{step}"] = statistics.median(s[step] for _, s, _ in samples if step in s)
            waits = [w for *_, w in samples if w is not None]
            if waits:
                figures[f"{name}/late-wait"] = statistics.median(waits)
            rows += [benchlib.Row(gpu, 1, b, "host-loop", label, us) for b, us in figures.items()
                     if not b.endswith(" calls")]  # (a count is no time: table only)
            if leaderboard:  # what the slowest windows did (a capture shows as enter:mla_hold_graph)
                for us, steps, _ in sorted(samples, key=lambda sample: -sample[0])[:4]:
                    print(f"slow window {name} {label[:40]}: {us:.1f} us; " +
                          " ".join(f"{k} {v:.1f}" for k, v in steps.items()), flush=True)
            steps = "  ".join(f"{b.split('/')[-1]} {us:.1f}" for b, us in figures.items() if "/" in b)
            table.append([label.split("; seed")[0], name, figures[name], statistics.fmean(windows_us),
                          min(windows_us), len(windows_us), steps])
        del data, next_inputs
    benchlib.record("mla-decode", rows)
    benchlib.table(f"mla-decode: official-style {'leaderboard ' if leaderboard else ''}windows in one process, "
                   f"alternating ({gpu}; us)",
                   ["case", "variant", "median", "mean", "best", "runs", "the steps, late wait (medians)"], table)


# --scaling: the attention kernel alone over cache lengths and batch sizes; batch 66 is one wave of 132 CTAs on an
# H100, batch 128 1.94 waves. A line through time against the tiles of a batch row gives the per-tile period (slope)
# and what does not grow with the cache (intercept: the launch, the first loads, the last wave's spread, the timer's
# flushed lines written back); docs/mla-decode-notes.md, finding 29.
SCALING_BATCHES, SCALING_PREFILLS = (128, 66), (1024, 2048, 4096, 6144)


def scaling(runs: int, candidates: dict, clean: bool = False) -> None:
    """--scaling: attention time (CUDA events, L2 flushed) per (batch, prefill) for the shipped kernel and each
    candidate's knobs; rows <backend>/attention, metric kernel, case "batchsize: B; prefill: P". clean: the L2
    flushed by reading (no write-backs inside the timed kernel; rows <backend>/attention[clean-L2])."""
    gpu = torch.cuda.get_device_name()
    mod = benchlib.build("mla-decode", "cuda")
    timer = benchlib.Timer(clean=clean)
    suffix = "[clean-L2]" if clean else ""
    configs = {"cuda": {}} | {f"cuda+{n}": k for n, k in candidates.items()}
    rows, table = [], []
    for bs in SCALING_BATCHES:
        max_seq = (max(SCALING_PREFILLS) + 1 + 63) // 64 * 64
        cache = torch.randn(bs, max_seq, 576, device="cuda").bfloat16()
        q = torch.randn(bs, 128, 576, device="cuda").bfloat16()
        cos, sin = mod._rope_tables(max_seq, 64, q.device)
        for prefill in SCALING_PREFILLS:
            kv_len, case = prefill + 1, f"batchsize: {bs}; prefill: {prefill}"
            line = [case, (kv_len + 63) // 64]
            want = None
            for name, knobs in configs.items():
                with benchlib.knobs(knobs):
                    out = mod.ext.mla_attention(q, cache, kv_len, cos, sin, None).float()
                    if want is None:
                        want = out
                    elif not torch.allclose(out, want, atol=2e-2, rtol=2e-2):
                        print(f"{case}: {name} differs from the shipped kernel; not timed", flush=True)
                        line.append(None)
                        continue
                    us = timer(lambda: mod.ext.mla_attention(q, cache, kv_len, cos, sin, None), runs)
                rows.append(benchlib.Row(gpu, 1, f"{name}/attention{suffix}", "kernel", case, us))
                line.append(us)
            table.append(line)
        del cache, q
    benchlib.record("mla-decode", rows)
    names = list(configs)
    for i, name in enumerate(names):  # least squares of time against tiles, per batch
        for bs in SCALING_BATCHES:
            pts = [(r[1], r[2 + i]) for r in table if r[0].startswith(f"batchsize: {bs};") and r[2 + i]]
            if len(pts) > 1:
                n, sx, sy = len(pts), sum(x for x, _ in pts), sum(y for _, y in pts)
                sxx, sxy = sum(x * x for x, _ in pts), sum(x * y for x, y in pts)
                slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
                print(f"{name} batch {bs}: {slope:.3f} us a tile, intercept {(sy - slope * sx) / n:.1f} us", flush=True)
    benchlib.table(f"mla-decode attention alone on {gpu} (us; CUDA events, L2 flushed{' clean' if clean else ''})",
                   ["case", "tiles"] + names, table)


# --energy: the attention kernel alone launched back to back on each benchmark case's q and cache (the kernel leaves
# its inputs as they are, unlike the whole step, which appends to the cache): NVML's joules a call, the SM clock and
# whether the power cap set it (docs/mla-decode-notes.md, finding 46).
def attention_energy(seconds: float, rounds: int, candidates: dict) -> None:
    """--energy: rows <backend>/attention, metric energy (mJ a call) and <backend>/attention[energy-loop], metric
    host-loop (us a call, 8 launches between synchronizes), per benchmark case; the variants take turns each round."""
    import energy  # (benchmarks/energy.py: a script's own folder is on sys.path)
    counter = energy.EnergyCounter()
    gpu = torch.cuda.get_device_name()
    mod = benchlib.build("mla-decode", "cuda")
    ref = problems.load_modules("mla-decode").reference
    variants = {"cuda/attention": {}} | {f"cuda+{n}/attention": k for n, k in candidates.items()}
    rows, table = [], []
    for case in problems.load_spec("mla-decode").benchmarks:
        _, x, cache = ref.generate_input(**problems.official_case(case))
        kv_len = cache.seq_len + 1  # (the step appends its row, then attends over it: the official cases' length)
        q, kv, cos, sin = attention_inputs(mod, x, cache)
        case_rows, lines = energy.variant_results(lambda: mod.ext.mla_attention(q, kv, kv_len, cos, sin, None),
                                                  variants, counter, gpu, problems.format_case(case), seconds,
                                                  rounds, batch=8)
        rows += case_rows
        table += lines
        del q, kv, x, cache
    benchlib.record("mla-decode", rows)
    benchlib.table(f"mla-decode attention alone on {gpu}: energy a call (NVML), back-to-back launches",
                   energy.TABLE_COLUMNS, table)


# --projections: linear.cuh's variants timed beside cuBLAS (knobs of LinearConfig, linear_config.h)
PROJECTION_VARIANTS = {"linear": {}, "linear-bn64": {"KBENCH_MLA_LINEAR_BN": "64"},
                       "linear-bn112": {"KBENCH_MLA_LINEAR_BN": "112"}, "linear-bn224": {"KBENCH_MLA_LINEAR_BN": "224"},
                       "linear-no-pdl": {"KBENCH_MLA_LINEAR_PDL": "0"}}


def projections(runs: int) -> None:
    """--projections: each projection GEMM of the step alone: cuBLAS (F.linear) against linear.cuh's variants
    (ext.mla_linear; the step runs only wo through it) on the same fresh random inputs, and torch.sum of W as a
    read-only yardstick. Before each run the L2 is flushed by reading 256 MB, which leaves it clean, as the attention
    kernel leaves it in the step (the judge's timer writes its flush buffer: its dirty lines are written back during
    the timed kernel). GB/s counts W's bytes."""
    import torch.nn.functional as F

    gpu = torch.cuda.get_device_name()
    mod = benchlib.build("mla-decode", "cuda")
    timer = benchlib.Timer(clean=True)
    case = problems.format_case(problems.load_spec("mla-decode").benchmarks[0])
    rows, results, failures = [], [], []
    for name, (n, k) in PROJECTIONS.items():
        x = torch.randn(128, k, device="cuda").bfloat16()
        w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).bfloat16()
        expected = x.float() @ w.float().T
        gbps = lambda us: n * k * 2 / (us * 1e-6) / 1e9  # noqa: E731
        times = {"cublas": timer(lambda: F.linear(x, w), runs), "read (torch.sum)": timer(lambda: w.sum(), runs)}
        for variant, knobs in PROJECTION_VARIANTS.items():
            with benchlib.knobs(knobs):
                plan = mod.ext.mla_linear_plan(128, n, k)
                if not plan[0]:
                    continue  # no configuration of this variant fits the shape
                benchlib.poison_allocator()
                ratio = benchlib.tolerance_ratio(mod.ext.mla_linear(x, w), expected, 1e-2, 1e-3)
                if ratio > 1:
                    failures.append(f"{name}, {variant}: {ratio:.2f}x the tolerance from fp32")
                    continue
                times[f"{variant} ({plan[0]}/{plan[1]}/{plan[2]})"] = timer(lambda: mod.ext.mla_linear(x, w), runs)
        for label, us in times.items():
            rows.append([name, f"{n}x{k}", label, us, gbps(us)])
            backend = "cublas" if label == "cublas" else "torch.sum" if label.startswith("read") else \
                "cuda+" + label.split(" ")[0]
            results.append(benchlib.Row(gpu, 1, f"{backend}/{name}[clean-L2]", "kernel", case, us))
    benchlib.record("mla-decode", results)
    benchlib.table(f"mla-decode projections on {gpu}, x [128, k] (us, CUDA events, L2 flushed clean; plan = "
                   f"bn/splits/pdl); failures: {len(failures)}", ["W", "n x k", "kernel", "us", "W GB/s"], rows)
    for msg in failures:
        print("  FAIL " + msg)
    if failures:
        sys.exit(1)


def absorb(runs: int) -> None:
    """--absorb: the step's q path at batch 128, CUDA events with the L2 flushed clean: q_up alone, q_up then the
    per-head W_UK GEMM (the separate launches), and q_up absorbing W_UK (linear.cuh's kAbsorb, finding 59);
    the absorbing output checked against the separate launches first. (Finding 59's probes of the kernel's parts
    were a knob of e1d02b6, since removed.)"""
    gpu = torch.cuda.get_device_name()
    mod = benchlib.build("mla-decode", "cuda")
    case = problems.format_case(problems.load_spec("mla-decode").benchmarks[0])
    timer, bs = benchlib.Timer(clean=True), 128
    x = torch.randn(bs, 1536, device="cuda").bfloat16()
    w = (torch.randn(128 * 192, 1536, device="cuda") / math.sqrt(1536)).bfloat16()
    w_kvu = (torch.randn(128 * 256, 512, device="cuda") / 16).bfloat16()
    q_full = torch.empty(bs, 128, 576, device="cuda").bfloat16()
    sep_full = torch.empty_like(q_full)
    w_uk = w_kvu.view(128, 256, 512).narrow(1, 0, 128)

    def separate():
        q = mod.ext.mla_linear(x, w).view(bs, 128, 192)
        mod.ext.mla_bmm_out(sep_full.narrow(2, 0, 512).transpose(0, 1), q.narrow(2, 0, 128).transpose(0, 1), w_uk)

    separate()
    q_nope = mod.ext.mla_linear(x, w).view(bs, 128, 192).narrow(2, 0, 128).transpose(0, 1)
    mod.ext.mla_linear_absorb(x, w, w_kvu, q_full)
    ratio = benchlib.tolerance_ratio(q_full[..., :512], sep_full[..., :512].float(), 8e-3, 1e-2)
    print(f"absorbing q_up against the separate launches: {ratio:.3f}x the tolerance", flush=True)
    if ratio > 1:
        sys.exit(1)
    variants = {"q_up": (lambda: mod.ext.mla_linear(x, w), {}), "q_up+bmm_uk": (separate, {}),
                "bmm_uk": (lambda: mod.ext.mla_bmm_out(sep_full.narrow(2, 0, 512).transpose(0, 1), q_nope, w_uk), {}),
                "absorb": (lambda: mod.ext.mla_linear_absorb(x, w, w_kvu, q_full), {})}
    times = benchlib.interleaved(timer, variants, runs)
    benchlib.record("mla-decode", [benchlib.Row(gpu, 1, f"cuda/{name}[q-path]", "kernel", case, us)
                                   for name, us in times.items()])
    benchlib.table(f"mla-decode q path at batch 128 on {gpu} (us, CUDA events, L2 flushed clean)", ["variant", "us"],
                   [[name, us] for name, us in times.items()])


def head_gemm(runs: int) -> None:
    """--head-gemm: the step's two per-head GEMMs at batch 128 on its own strided views (W_UK into the query's latent
    columns; W_UV out of the attention, b a transposed view), head_gemm.cuh (ext.mla_bmm_out) against cuBLAS
    (torch.bmm(out=)), CUDA events with the L2 flushed clean, each checked against fp32 first. GB/s counts the
    weights' bytes (the step reads each once: 16 MB a GEMM)."""
    gpu = torch.cuda.get_device_name()
    mod = benchlib.build("mla-decode", "cuda")
    case = problems.format_case(problems.load_spec("mla-decode").benchmarks[0])
    timer, bs = benchlib.Timer(clean=True), 128
    w_kvu = (torch.randn(128, 256, 512, device="cuda") / 16).bfloat16()
    q = torch.randn(bs, 128, 192, device="cuda").bfloat16()
    o = torch.randn(bs, 128, 512, device="cuda").bfloat16()
    q_full, y = torch.empty(bs, 128, 576, device="cuda").bfloat16(), torch.empty(bs, 128, 128, device="cuda").bfloat16()
    gemms = {"w_uk": (q_full.narrow(2, 0, 512).transpose(0, 1), q.narrow(2, 0, 128).transpose(0, 1),
                      w_kvu.narrow(1, 0, 128)),
             "w_uv": (y.transpose(0, 1), o.transpose(0, 1), w_kvu.narrow(1, 128, 128).transpose(1, 2))}
    rows, table, failures = [], [], []
    for name, (c, a, b) in gemms.items():
        want = torch.bmm(a.float(), b.float())
        times = {}
        for label, fn in (("head_gemm", lambda: mod.ext.mla_bmm_out(c, a, b)),
                          ("cublas", lambda: torch.bmm(a, b, out=c))):
            c.fill_(float("nan"))
            fn()
            ratio = benchlib.tolerance_ratio(c, want, 8e-3, 1e-2)
            if ratio > 1:
                failures.append(f"{name}, {label}: {ratio:.2f}x the tolerance from fp32")
                continue
            times[label] = timer(fn, runs)
            backend = "cuda+head-gemm" if label == "head_gemm" else "cublas"
            rows.append(benchlib.Row(gpu, 1, f"{backend}/{name}[clean-L2]", "kernel", case, times[label]))
            table.append([name, label, times[label], 128 * 128 * 512 * 2 / (times[label] * 1e-6) / 1e9])
    benchlib.record("mla-decode", rows)
    benchlib.table(f"mla-decode per-head GEMMs on {gpu}, batch 128 (us, CUDA events, L2 flushed clean); "
                   f"failures: {len(failures)}", ["GEMM", "kernel", "us", "W GB/s"], table)
    for msg in failures:
        print("  FAIL " + msg)
    if failures:
        sys.exit(1)


# --dev-costs: what parts of the shipped attention kernel cost, by dev builds' timing-only knobs (wrong results):
# variant name -> knobs. attention-loads-only keeps the ring (TMA, the rotation, every barrier) and drops the
# consumers' MMAs, softmax and P: the rate the two-stage ring streams the cache at by itself (finding 70).
DEV_COST_VARIANTS = {"attention": {"KBENCH_MLA_DEV_SKIP_ROPE": "0", "KBENCH_MLA_DEV_SKIP_MATH": "0"},
                     "attention-without-rope": {"KBENCH_MLA_DEV_SKIP_ROPE": "1", "KBENCH_MLA_DEV_SKIP_MATH": "0"},
                     "attention-loads-only": {"KBENCH_MLA_DEV_SKIP_ROPE": "0", "KBENCH_MLA_DEV_SKIP_MATH": "1"}}


def dev_costs(runs: int) -> None:
    """--dev-costs: the shipped attention kernel (a dev build) timed as shipped and under each of DEV_COST_VARIANTS'
    timing-only knobs, twice each, alternating, on every benchmark case's cache, with the cache's rate by its rows
    alone. Rows: cuda[dev]/<variant> (the medians)."""
    gpu = torch.cuda.get_device_name()
    ref = problems.load_modules("mla-decode").reference
    mod = benchlib.build("mla-decode", "cuda", dev=True)
    timer, rows, table = benchlib.Timer(), [], []
    for case in problems.load_spec("mla-decode").benchmarks:
        config, x, cache = ref.generate_input(**problems.official_case(case))
        bs, kv_len = x.shape[0], cache.seq_len + 1
        q = torch.randn(bs, 128, 576, device="cuda").bfloat16()
        cos, sin = mod._rope_tables(cache.data.shape[1], 64, x.device)
        times = {name: [] for name in DEV_COST_VARIANTS}
        for _ in range(2):
            for name, knobs in DEV_COST_VARIANTS.items():
                with benchlib.knobs(knobs):
                    times[name].append(timer(lambda: mod.ext.mla_attention(q, cache.data, kv_len, cos, sin, None),
                                             runs))
        label = problems.format_case(case)
        medians = {n: benchlib.median(t) for n, t in times.items()}
        rows += [benchlib.Row(gpu, 1, f"cuda[dev]/{n}", "kernel", label, v) for n, v in medians.items()]
        cache_bytes = bs * kv_len * 576 * 2
        table.append([label.split("; seed")[0]] + [" / ".join(f"{v:.1f}" for v in t) for t in times.values()]
                     + [" / ".join(f"{cache_bytes / v / 1e6:.2f}" for v in medians.values())])
        del config, x, cache
    benchlib.record("mla-decode", rows)
    benchlib.table(f"mla-decode attention: as shipped and with parts left out (us, two rounds; TB/s by the cache; "
                   f"timing only; {gpu})", ["case"] + list(DEV_COST_VARIANTS) + ["TB/s (medians)"], table)


# --phase-trace: the intervals between the s-once kernel's clock64 stamps (attention.cuh: trace_stamp):
# (name, from (role, event, tile offset), to (role, event, tile offset)). Roles: 0 = consumer warpgroup 0 (S,
# softmax, its P V), 1 = warpgroup 1 (the other P V), 2 = the TMA thread, 3 = a rotator warp. Events: wg0 0 before
# its ready wait, 1 S issued, 2 S done, 3 softmax done, 4 P buffer free, 5 P V issued, 6 P V done; wg1 0 before its
# ready wait, 1 ready, 2 P ready, 3 P V done; loader 0 before its empty wait, 1 tile issued; rotator 0 before its
# landed wait, 1 landed, 2 rotated. The last rows follow one tile across the roles (the chain that two stages make).
TRACE_SHAPE = (8, 5, 128, 8)  # kTraceCtas, kTraceRoles, kTraceTiles, kTraceEvents (role 4: clock calibration)
TRACE_PHASES = [
    ("tile period (wg0)", (0, 0, 0), (0, 0, 1)),
    ("wg0 wait ready", (0, 0, 0), (0, 1, 0)), ("wg0 S", (0, 1, 0), (0, 2, 0)), ("wg0 softmax", (0, 2, 0), (0, 3, 0)),
    ("wg0 wait P free", (0, 3, 0), (0, 4, 0)), ("wg0 P store + rescale", (0, 4, 0), (0, 5, 0)),
    ("wg0 P V", (0, 5, 0), (0, 6, 0)), ("wg0 release -> next", (0, 6, 0), (0, 0, 1)),
    ("wg1 wait ready", (1, 0, 0), (1, 1, 0)), ("wg1 wait P ready", (1, 1, 0), (1, 2, 0)),
    ("wg1 rescale + P V", (1, 2, 0), (1, 3, 0)), ("wg1 release -> next", (1, 3, 0), (1, 0, 1)),
    ("loader wait empty", (2, 0, 0), (2, 1, 0)),
    ("rotator wait landed", (3, 0, 0), (3, 1, 0)), ("rotator rotate", (3, 1, 0), (3, 2, 0)),
    ("chain: tma issue -> landed (<=)", (2, 1, 0), (3, 1, 0)), ("chain: tma issue -> rotated", (2, 1, 0), (3, 2, 0)),
    ("chain: tma issue -> wg0 S", (2, 1, 0), (0, 1, 0)), ("chain: wg0 P V issued -> wg1 P V done", (0, 5, 0), (1, 3, 0)),
    ("chain: wg1 P V done -> next tma issue", (1, 3, 0), (2, 1, 2)),
]


# The seesaw kernel's stamps (attention_seesaw.cuh, KBENCH_MLA_SEESAW=1), per pair of tiles (a, b): warpgroup 0
# (owner of a) 0 pair start, 1 a's rope block ready, 2 its first latent half, 3 the second (S issued), 4 S done,
# 5 P(a) published, 6 P(b) read, 7 pair done; warpgroup 1 (owner of b) 0 start, 1-3 b's parts ready as above,
# 4 P(a) read, 5 S(b) done, 6 P(b) published, 7 done.
SEESAW_TRACE_PHASES = [
    ("pair period (wg0)", (0, 0, 0), (0, 0, 1)),
    ("wg0 wait rope", (0, 0, 0), (0, 1, 0)), ("wg0 wait first half", (0, 1, 0), (0, 2, 0)),
    ("wg0 wait second half", (0, 2, 0), (0, 3, 0)), ("wg0 S rest", (0, 3, 0), (0, 4, 0)),
    ("wg0 softmax + publish", (0, 4, 0), (0, 5, 0)), ("wg0 P(a) V, wait P(b)", (0, 5, 0), (0, 6, 0)),
    ("wg0 P(b) V", (0, 6, 0), (0, 7, 0)),
    ("wg1 wait rope", (1, 0, 0), (1, 1, 0)), ("wg1 wait first half", (1, 1, 0), (1, 2, 0)),
    ("wg1 wait second half", (1, 2, 0), (1, 3, 0)), ("wg1 S issued -> P(a) read", (1, 3, 0), (1, 4, 0)),
    ("wg1 P(a) read -> S done", (1, 4, 0), (1, 5, 0)), ("wg1 softmax + publish", (1, 5, 0), (1, 6, 0)),
    ("wg1 P(b) V", (1, 6, 0), (1, 7, 0)),
]


def trace_clock_mhz(t: torch.Tensor) -> float:
    """The SM clock of a traced run: clock64 against the global timer (ns) over warpgroup 0's loop, median over the
    CTAs. t: the stamps, float64 [ctas, roles, tiles, events] (TRACE_SHAPE)."""
    return ((t[:, 4, 0, 2] - t[:, 4, 0, 0]) / (t[:, 4, 0, 3] - t[:, 4, 0, 1]) * 1e3).median().item()


def trace_intervals(t: torch.Tensor, ntiles: int, phases=TRACE_PHASES) -> dict[str, float | None]:
    """Each interval of phases in cycles, the median over the CTAs and the middle tiles (the first two and the
    last three left out, where the pipeline fills and drains); None where the kernel never stamped one of its ends
    (the persistent kernel's loader stamps nothing: its chain rows were clock64 values, not intervals). t: float64
    [ctas, roles, tiles, events]; ntiles: the stamped steps (tiles; the seesaw stamps pairs of tiles)."""
    out = {}
    for name, (ra, ea, oa), (rb, eb, ob) in phases:
        start = t[:, ra, 2 + oa:ntiles - 3 + oa, ea]
        end = t[:, rb, 2 + ob:ntiles - 3 + ob, eb]
        out[name] = None if not start.any() or not end.any() else (end - start).median().item()
    return out


# A work item's fixed cost (what does not grow with its tiles; finding 33), from the s-once kernel's stamps at the CTA's
# entry and once its rows are stored (role 4, events 4 and 6) around warpgroup 0's loop: the parts add up to the last.
ITEM_PARTS = ("item: entry -> Q landed", "item: Q landed -> tile 0's S", "item: tiles 0-1 over the period",
              "item: middle tiles over the period", "item: last 3 tiles over the period",
              "item: loop end -> rows stored", "item: fixed cost (all parts)")
# "loop end -> rows stored" in steps (None where the build does not stamp them; with the direct stores the last
# step is from warpgroup 1's end to the rows stored)
ITEM_STORE_PARTS = ("store: loop end -> warpgroup 1 done", "store: -> columns staged", "store: -> rows copied")


def trace_item_parts(t: torch.Tensor, ntiles: int) -> dict[str, float] | None:
    """ITEM_PARTS in cycles, each the median over the CTAs whose entry and end were stamped; "over the period" is a
    stretch of tiles' time minus as many median tile periods (trace_intervals'). None without those stamps (builds
    before them, the seesaw kernel) or under 6 tiles. t: float64 [ctas, roles, tiles, events] (TRACE_SHAPE)."""
    clk = t[:, 4, 0]
    have = (clk[:, 4] != 0) & (clk[:, 6] != 0)
    if ntiles < 6 or not bool(have.any()):
        return None
    period = trace_intervals(t, ntiles)["tile period (wg0)"]
    c, s_issued = clk[have], t[have, 0, :, 1]  # per CTA: the clock pairs; when each tile's S was issued
    parts = (c[:, 0] - c[:, 4], s_issued[:, 0] - c[:, 0], s_issued[:, 2] - s_issued[:, 0] - 2 * period,
             s_issued[:, ntiles - 3] - s_issued[:, 2] - (ntiles - 5) * period,
             c[:, 2] - s_issued[:, ntiles - 3] - 3 * period, c[:, 6] - c[:, 2], c[:, 6] - c[:, 4] - ntiles * period)
    out = {name: part.median().item() for name, part in zip(ITEM_PARTS, parts)}
    # the store's steps (finding 34), where the build stamps them: warpgroup 1 done, columns staged (bulk_store)
    done, staged = t[have, 4, 1, 0], t[have, 4, 1, 2]
    has_done, has_staged = bool((done != 0).all()), bool((staged != 0).all())
    last = staged if has_staged else done if has_done else None  # the step the copies (or direct stores) follow
    out[ITEM_STORE_PARTS[0]] = (done - c[:, 2]).median().item() if has_done else None
    out[ITEM_STORE_PARTS[1]] = (staged - done).median().item() if has_staged else None
    out[ITEM_STORE_PARTS[2]] = (c[:, 6] - last).median().item() if last is not None else None
    return out


def phase_trace(trace_out: str | None = None) -> None:
    """--phase-trace: one run of the shipped attention kernel (a dev build) per benchmark case with clock64 stamps
    at each role's points of the tile loop in the first 8 CTAs; prints the median of each interval over the middle
    tiles (cycles and us at the SM clock), plus the TMA issue -> landed latency, and a work item's fixed cost in
    parts (ITEM_PARTS). Rows: cuda[dev]/trace:<phase>,
    metric trace. With KBENCH_MLA_SEESAW=1 the seesaw kernel's stamps instead (SEESAW_TRACE_PHASES, per pair of
    tiles; rows cuda+seesaw[dev]/trace:<phase>); with another candidate's knobs set, rows
    cuda+<candidate>[dev]/trace:<phase>. trace_out: also save each case's raw stamps (int64 [ctas, roles,
    tiles, events]) as <trace_out>_<prefill>.pt."""
    gpu = torch.cuda.get_device_name()
    ref = problems.load_modules("mla-decode").reference
    mod = benchlib.build("mla-decode", "cuda", dev=True)
    seesaw = os.environ.get("KBENCH_MLA_SEESAW") == "1"  # the seesaw kernel stamps other points, per pair of tiles
    rows, table = [], []
    for case in problems.load_spec("mla-decode").benchmarks:
        config, x, cache = ref.generate_input(**problems.official_case(case))
        bs, kv_len = x.shape[0], cache.seq_len + 1
        q = torch.randn(bs, 128, 576, device="cuda").bfloat16()
        cos, sin = mod._rope_tables(cache.data.shape[1], 64, x.device)
        trace = torch.zeros(TRACE_SHAPE, dtype=torch.int64, device="cuda")
        for _ in range(3):  # the last run's stamps are kept (each run overwrites them)
            with benchlib.knobs({"KBENCH_MLA_DEV_TRACE": str(trace.data_ptr())}):
                mod.ext.mla_attention(q, cache.data, kv_len, cos, sin, None)
        torch.cuda.synchronize()
        t = trace.cpu().double()
        if trace_out:
            torch.save(t, f"{trace_out}_{kv_len - 1}.pt")
        label = problems.format_case(case)
        rows += trace_rows(t, kv_len, gpu, label, table, seesaw)
        del config, x, cache
    benchlib.record("mla-decode", rows)
    names = [n for n, *_ in (SEESAW_TRACE_PHASES if seesaw else TRACE_PHASES)] + (
        [] if seesaw else list(ITEM_PARTS) + list(ITEM_STORE_PARTS))
    benchlib.table(f"mla-decode {'seesaw' if seesaw else 's-once'} attention: median cycles (us at the measured SM "
                   f"clock) per {'pair of tiles' if seesaw else 'tile'}, middle ones of 8 CTAs; {gpu}",
                   ["phase"] + [r[0] for r in table], [[n] + [r[i + 1] for r in table] for i, n in enumerate(names)])


def trace_rows(t: torch.Tensor, kv_len: int, gpu: str, label: str, table: list, seesaw: bool) -> list:
    """The trace's intervals as rows (backend cuda[dev]/trace:<phase>, or cuda+<candidate>[dev]/... for the
    candidate whose knobs the environment sets, metric trace, us at the measured clock), and a line of the printed
    table appended to table. t: one case's stamps (float64, TRACE_SHAPE)."""
    mhz = trace_clock_mhz(t)
    # the most specific candidate, where one's knobs include another's
    matching = [n for n, k in CANDIDATES.items() if all(os.environ.get(a) == v for a, v in k.items())]
    traced = max(matching, key=lambda n: len(CANDIDATES[n]), default=None)
    backend = f"cuda+{traced}[dev]" if traced else "cuda[dev]"
    steps = min((kv_len + 63) // 64, TRACE_SHAPE[2]) // (2 if seesaw else 1)
    line, rows = [label.split("; seed")[0] + f" ({mhz:.0f} MHz)"], []
    for name, cycles in trace_intervals(t, steps, SEESAW_TRACE_PHASES if seesaw else TRACE_PHASES).items():
        if cycles is None:  # not stamped by this kernel
            line.append(None)
            continue
        if cycles > 0:  # an interval that runs backwards (a schedule that reorders the stamps) is no time
            rows.append(benchlib.Row(gpu, 1, f"{backend}/trace:{name}", "trace", label, cycles / mhz))
        line.append(f"{cycles:.0f} ({cycles / mhz:.2f})")
    if not seesaw:  # a work item's fixed cost in parts (signed: a stretch may run faster than the median period)
        parts = trace_item_parts(t, steps)
        for name in ITEM_PARTS + ITEM_STORE_PARTS:
            if parts is None or parts[name] is None:
                line.append(None)
                continue
            if parts[name] > 0:  # a results row is a time; the table shows the signed stretch
                rows.append(benchlib.Row(gpu, 1, f"{backend}/trace:{name}", "trace", label, parts[name] / mhz))
            line.append(f"{parts[name]:.0f} ({parts[name] / mhz:.2f})")
    table.append(line)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--candidates", default=",".join(CANDIDATES),
                    help=f"comma-separated, of {', '.join(CANDIDATES)} ('' for none)")
    ap.add_argument("--rev", action="append", default=[], metavar="REV",
                    help="also check and time the cuda backend of this git revision as cuda@REV (repeatable)")
    ap.add_argument("--official", metavar="MODES",
                    help="instead of timing kernels: judge the shipped build and each candidate with kbench perf in "
                         "these modes (comma-separated: benchmark,leaderboard)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --official: this many rounds, every other one in reverse order")
    ap.add_argument("--dev-costs", "--rope-cost", dest="dev_costs", action="store_true",
                    help="a dev build timed as shipped, without the keys' RoPE and with the ring's loads alone "
                         "(timing only)")
    ap.add_argument("--absorb", action="store_true",
                    help="instead: the q path (q_up, W_UK) separate and absorbed (one check, then CUDA events)")
    ap.add_argument("--projections", action="store_true",
                    help="instead: each projection GEMM alone, cuBLAS against linear.cuh")
    ap.add_argument("--phase-trace", action="store_true",
                    help="instead: where the attention kernel's tile time goes, from clock64 stamps (a dev build)")
    ap.add_argument("--scaling", action="store_true",
                    help="instead: the attention kernel alone over cache lengths and batch sizes (per-tile period, "
                         "fixed cost), the shipped kernel and the candidates")
    ap.add_argument("--clean-l2", action="store_true",
                    help="with --scaling: flush the L2 by reading, so the timed kernel writes back no dirty lines")
    ap.add_argument("--head-gemm", action="store_true",
                    help="instead: the step's two per-head GEMMs alone, head_gemm.cuh against cuBLAS")
    ap.add_argument("--trace-out", metavar="PREFIX", help="with --phase-trace: save the raw stamps too")
    ap.add_argument("--energy", action="store_true",
                    help="instead: the attention kernel alone back to back, joules a call and the SM clock (NVML)")
    ap.add_argument("--seconds", type=float, default=3.0, help="with --energy: each variant's loop a round")
    ap.add_argument("--windows", action="store_true",
                    help="instead: official-style host windows in one process, the shipped path and the candidates "
                         "alternating in --rounds rounds of --runs calls each in all")
    ap.add_argument("--leaderboard", action="store_true",
                    help="with --windows: each window's inputs regenerated before it and its output checked after "
                         "it, as leaderboard mode does (the eager path's steps)")
    args = ap.parse_args()
    if args.dev_costs:
        dev_costs(args.runs)
        return
    if args.absorb:
        absorb(args.runs)
        return
    if args.projections:
        projections(args.runs)
        return
    if args.phase_trace:
        phase_trace(args.trace_out)
        return
    if args.scaling:
        scaling(args.runs, benchlib.selected(CANDIDATES, args.candidates), args.clean_l2)
        return
    if args.head_gemm:
        head_gemm(args.runs)
        return
    if args.energy:
        attention_energy(args.seconds, args.rounds, benchlib.selected(CANDIDATES, args.candidates))
        return
    if args.windows:
        windows(args.runs, max(args.rounds, 2), benchlib.selected(CANDIDATES, args.candidates), args.leaderboard)
        return
    if args.official:
        benchlib.official_figures("mla-decode", "cuda", benchlib.selected(CANDIDATES, args.candidates),
                                  args.official.split(","), args.rounds)
        return
    gpu = torch.cuda.get_device_name()
    ref = problems.load_modules("mla-decode").reference
    cuda_mod = benchlib.build("mla-decode", "cuda")
    failures = checks(cuda_mod, ref)
    candidates, wrong = benchlib.checked_candidates(CANDIDATES, args.candidates, lambda: checks(cuda_mod, ref))
    failures += wrong  # a candidate that fails a check is not timed
    revisions, wrong = benchlib.checked_revisions("mla-decode", "cuda", args.rev, lambda mod: checks(mod, ref))
    failures += wrong
    torch_mod = benchlib.build("mla-decode", "torch")
    rows = [time_case(c, cuda_mod, torch_mod, ref, args.runs, candidates, revisions)
            for c in problems.load_spec("mla-decode").benchmarks]
    names = [("cuda", "cuda"), ("torch", "torch"), ("attention", "cuda/attention"),
             ("attention[clean-L2]", "cuda/attention[clean-L2]"), ("projections", "cuda/projections")] + \
        [(f"cuda+{n}{part}", f"cuda+{n}{part}") for n in candidates for part in ("", "/attention")] + \
        [(n + part, n + part) for n in revisions for part in ("", "/attention")] + \
        [("flashinfer/attention", "flashinfer/attention")]
    results = [benchlib.Row(gpu, 1, name, "kernel", r["case"], r[key]) for r in rows for key, name in names
               if r.get(key)]
    results += [benchlib.Row(gpu, 1, name, "kernel", "geomean", benchlib.geomean(r.get(key) for r in rows))
                for key, name in names if benchlib.geomean(r.get(key) for r in rows)]
    benchlib.record("mla-decode", results)
    cols = ["floor", "cuda", *(f"cuda+{n}" for n in candidates), *revisions, "cuda_host", "torch", "attention",
            "attention (again)", *(f"cuda+{n}/attention" for n in candidates), *(f"{n}/attention" for n in revisions),
            "flashinfer/attention", "attention_GBps", "attention[clean-L2]", "attention[clean-L2]_GBps",
            "attention[clean-L2]_GBps[+q,o]", "projections"]
    benchlib.table(f"mla-decode on {gpu} (us; kernel = CUDA events, L2 flushed; cuda_host = host clock); "
                   f"failures: {len(failures)}", ["case"] + cols,
                   [[r["case"]] + [r.get(c) for c in cols] for r in rows] +
                   [["geomean"] + [benchlib.geomean(r.get(c) for r in rows) for c in cols]])
    for msg in failures[:10]:
        print("  FAIL " + msg)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
