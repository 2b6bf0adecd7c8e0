"""Energy a call of a single-GPU problem's backend and its candidates, from NVML's total-energy counter: at the board's
power cap a kernel's time is its energy over the cap, so a candidate that shortens one launch by drawing more power
elsewhere reads as a tie in time but not in joules (docs/moe-notes.md, thirty-first session).

    python benchmarks/energy.py moe --backend cuda --candidate no-skip=KBENCH_MOE_SKIP_EMPTY_HALVES=0

Per benchmark case: inputs generated once, each variant's output checked against the reference (untimed), then
--rounds rounds in which the variants take turns: a few warm-up calls, then calls back to back, each followed by a
synchronize, for --seconds; the counter (millijoules since the driver loaded) read before and after. Rows: metric
energy, "<backend>" / "<backend>+<name>", the value in millijoules a call (benchlib.METRICS says so); metric
host-loop, "<backend>[energy-loop]", the same loop's host time a call in us. A --candidate is NAME=KNOB=VALUE[,KNOB=
VALUE...] (the environment it runs under). NVML through ctypes (libnvidia-ml.so.1, the driver's), device index 0
unless --nvml-index says otherwise (NVML counts the machine's GPUs, not CUDA_VISIBLE_DEVICES'). The printed table
adds the SM clock (median of NVML samples every ~10 ms) and the shares of samples with the power cap or a hardware
slowdown as the clock's reason. Problems whose protocol clones the inputs only (moe, fp8-mm): mla-decode's calls grow
the cache they are given (`benchmarks/mla_decode.py --energy` measures its attention kernel alone).
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

from kbench import benchlib, problems
from kbench.evaluator import guards


NVML_CLOCK_SM = 1
SW_POWER_CAP, HW_SLOWDOWN = 0x4, 0x8  # clock event reasons (nvml.h): the board's power cap; power brake or thermal


def clock_summary(samples: list[tuple[int, int]]) -> tuple[float, float, float]:
    """(median SM MHz, share of samples with the software power cap set, share with a hardware slowdown) of
    clock_sample() readings taken while the loop ran."""
    if not samples:
        return float("nan"), float("nan"), float("nan")
    n = len(samples)
    return (statistics.median(m for m, _ in samples), sum(bool(r & SW_POWER_CAP) for _, r in samples) / n,
            sum(bool(r & HW_SLOWDOWN) for _, r in samples) / n)


class EnergyCounter:
    """NVML's total energy of one GPU since the driver loaded, in millijoules."""

    def __init__(self, index: int = 0):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as exc:
            raise SystemExit(f"energy: no NVML library ({exc}); run this on a GPU machine with the NVIDIA driver")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)), "GetHandleByIndex")

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise SystemExit(f"energy: NVML {what} failed (code {rc}); this GPU or driver may not count energy")

    def millijoules(self) -> int:
        value = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)),
                    "GetTotalEnergyConsumption")
        return value.value

    def clock_sample(self) -> tuple[int, int]:
        """(SM clock in MHz, the clock event reasons' bits) now; NVML answers from the host while kernels run."""
        mhz, reasons = ctypes.c_uint(), ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(mhz)), "GetClockInfo")
        self._check(self.lib.nvmlDeviceGetCurrentClocksEventReasons(self.handle, ctypes.byref(reasons)),
                    "GetCurrentClocksEventReasons")
        return mhz.value, reasons.value


def per_call(mj0: int, mj1: int, t0: float, t1: float, calls: int) -> tuple[float, float, float]:
    """(mJ a call, us a call, mean watts) of `calls` calls between two counter readings and two host clocks (s)."""
    if calls < 1 or t1 <= t0:
        raise ValueError("energy: need at least one call over a positive time")
    return (mj1 - mj0) / calls, (t1 - t0) * 1e6 / calls, (mj1 - mj0) / 1e3 / (t1 - t0)


def parse_candidate(text: str) -> tuple[str, dict[str, str]]:
    """'no-skip=KBENCH_MOE_SKIP_EMPTY_HALVES=0,KBENCH_X=1' -> ('no-skip', {knob: value, ...})."""
    name, _, knobs = text.partition("=")
    pairs = [k.split("=", 1) for k in knobs.split(",") if k]
    if not name or not pairs or any(len(p) != 2 or not p[0] or not p[1] for p in pairs):
        raise SystemExit(f"energy: --candidate {text!r} is not NAME=KNOB=VALUE[,KNOB=VALUE...]")
    return name, dict(pairs)


def measure(call, counter: EnergyCounter, seconds: float, warmup: int = 3, batch: int = 1,
            clocks: list | None = None) -> tuple[float, float, float]:
    """(mJ, us, W) a call over back-to-back calls for `seconds`: `batch` calls launched, then a synchronize. With a
    list for `clocks`, clock_sample() is appended to it every ~10 ms, read after a batch's launches (while the GPU
    runs them)."""
    import torch
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    calls, mj0, t0 = 0, counter.millijoules(), time.perf_counter()
    sampled = t0
    while True:
        for _ in range(batch):
            call()
        calls += batch
        if clocks is not None and time.perf_counter() - sampled >= 0.01:
            clocks.append(counter.clock_sample())
            sampled = time.perf_counter()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        if t1 - t0 >= seconds:
            break
    return per_call(mj0, counter.millijoules(), t0, t1, calls)


TABLE_COLUMNS = ["case", "variant", "mJ a call", "us a call", "W", "SM MHz", "power cap", "HW slowdown",
                 "mJ each round"]


def result_rows(gpu: str, label: str, case: str, runs: list) -> list:
    """The rows of one variant's rounds ((mJ, us, W) each): metric energy (mJ a call) and host-loop (us a call)."""
    mj, us = (statistics.mean(r[i] for r in runs) for i in range(2))
    return [benchlib.Row(gpu, 1, label, "energy", case, mj),
            benchlib.Row(gpu, 1, f"{label}[energy-loop]", "host-loop", case, us)]


def table_line(case: str, label: str, runs: list, clocks: list) -> list:
    """One printed line: the rounds' means, the clock samples' median and the power-cap and slowdown shares."""
    mj, us, watts = (statistics.mean(r[i] for r in runs) for i in range(3))
    mhz, capped, slowed = clock_summary(clocks)
    return [case, label, f"{mj:.1f}", f"{us:.1f}", f"{watts:.0f}", f"{mhz:.0f}", f"{capped:.0%}", f"{slowed:.0%}",
            " ".join(f"{r[0]:.0f}" for r in runs)]


def variant_results(call, variants: dict, counter: EnergyCounter, gpu: str, case: str, seconds: float, rounds: int,
                    batch: int = 1) -> tuple[list, list]:
    """`call` measured under each variant's knobs (label -> knobs), the variants taking turns for `rounds` rounds:
    (its rows, its printed lines) for one case (the official case line; the table shows it up to its seed)."""
    got = {label: [] for label in variants}
    clocks = {label: [] for label in variants}
    for _ in range(rounds):
        for label, knobs in variants.items():
            with benchlib.knobs(knobs):
                got[label].append(measure(call, counter, seconds, batch=batch, clocks=clocks[label]))
    rows, lines = [], []
    for label, runs in got.items():
        rows += result_rows(gpu, label, case, runs)
        lines.append(table_line(case.split("; seed")[0], label, runs, clocks[label]))
    return rows, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--candidate", action="append", default=[], metavar="NAME=KNOB=VALUE[,...]")
    ap.add_argument("--seconds", type=float, default=3.0, help="each variant's loop a round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nvml-index", type=int, default=0)
    args = ap.parse_args()
    import torch
    guards.torch = torch  # (the harness sets it; guards.clone needs it)
    spec = problems.load_spec(args.problem)
    if spec.distributed:
        raise SystemExit(f"energy: {args.problem} is distributed (one GPU's counter would miss the others)")
    if not spec.protocol.clone_inputs:  # (mla-decode: the submission appends to the cache it is given)
        raise SystemExit(f"energy: {args.problem}'s calls change their inputs, and this loop repeats one input set "
                         "thousands of times; measure a problem whose protocol clones its inputs (moe, fp8-mm)")
    variants = {args.backend: {}}
    for text in args.candidate:
        name, knobs = parse_candidate(text)
        variants[f"{args.backend}+{name}"] = knobs
    counter = EnergyCounter(args.nvml_index)
    mod = benchlib.build(args.problem, args.backend)
    ref = problems.load_modules(args.problem).reference
    gpu = torch.cuda.get_device_name()
    rows, table = [], []
    for case in spec.benchmarks:
        line = problems.format_case(case)
        data = ref.generate_input(**problems.official_case(case))
        for label, knobs in variants.items():
            with benchlib.knobs(knobs):
                ok, msg = ref.check_implementation(guards.clone(data, deep=True), mod.custom_kernel(guards.clone(data)))
            if not ok:
                raise SystemExit(f"energy: {label} fails {line}: {msg}")
        given = guards.clone(data)  # one input set for every call (its addresses stay: graphs replay)
        case_rows, lines = variant_results(lambda: mod.custom_kernel(given), variants, counter, gpu, line,
                                           args.seconds, args.rounds)
        rows += case_rows
        table += lines
    print(f"written to {benchlib.record(args.problem, rows)}")
    benchlib.table(f"{args.problem} on {gpu}: energy a call (NVML), back-to-back calls", TABLE_COLUMNS, table)


if __name__ == "__main__":
    main()
