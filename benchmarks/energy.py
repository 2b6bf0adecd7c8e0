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
unless --nvml-index says otherwise (NVML counts the machine's GPUs, not CUDA_VISIBLE_DEVICES'). Problems whose
protocol clones the inputs only (moe, fp8-mm): mla-decode's calls grow the cache they are given.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

from kbench import benchlib, problems
from kbench.evaluator import guards


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


def measure(call, counter: EnergyCounter, seconds: float, warmup: int = 3) -> tuple[float, float, float]:
    import torch
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    calls, mj0, t0 = 0, counter.millijoules(), time.perf_counter()
    while True:
        call()
        torch.cuda.synchronize()
        calls += 1
        t1 = time.perf_counter()
        if t1 - t0 >= seconds:
            break
    return per_call(mj0, counter.millijoules(), t0, t1, calls)


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
        got = {label: [] for label in variants}
        for _ in range(args.rounds):
            for label, knobs in variants.items():
                with benchlib.knobs(knobs):
                    got[label].append(measure(lambda: mod.custom_kernel(given), counter, args.seconds))
        for label, runs in got.items():
            mj, us, watts = (statistics.mean(r[i] for r in runs) for i in range(3))
            rows += [benchlib.Row(gpu, 1, label, "energy", line, mj),
                     benchlib.Row(gpu, 1, f"{label}[energy-loop]", "host-loop", line, us)]
            table.append([line.split("; seed")[0], label, f"{mj:.1f}", f"{us:.1f}", f"{watts:.0f}",
                          " ".join(f"{r[0]:.0f}" for r in runs)])
    print(f"written to {benchlib.record(args.problem, rows)}")
    benchlib.table(f"{args.problem} on {gpu}: energy a call (NVML), back-to-back calls",
                   ["case", "variant", "mJ a call", "us a call", "W", "mJ each round"], table)


if __name__ == "__main__":
    main()
