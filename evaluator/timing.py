"""Timing, the official way (EVAL_PROTOCOL.md): the timers, the statistics and the stopping rule.

One timer per ``protocol.timer`` kind, plus the multi-rank window; the harness, ``kbench device`` and the benchmark
scripts all time through these. Pure Python: the device calls arrive in a ``Clock`` built by the caller (the harness
builds it before the submission is imported, so a submission that patches torch's timing functions changes nothing).
Staged into the run directory as ``timing.py`` beside ``harness.py``; the parent recomputes the statistics from the
raw durations a worker sends, so a patched copy inside the worker cannot change the reported numbers.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from typing import Any, Callable, NamedTuple


class Clock(NamedTuple):
    """The device calls a timer needs. ``sync`` waits for the device; ``now_ns`` is the host clock.

    new_event / record / elapsed_ms: CUDA events (``torch.cuda.Event(enable_timing=True)``, ``Event.record``,
    ``Event.elapsed_time``), None where there are none. barrier: the process group's barrier (several ranks).
    flush: clears the L2 cache before a timed call, None when the protocol does not flush.
    """
    sync: Callable[[], Any]
    now_ns: Callable[[], int] = time.perf_counter_ns
    new_event: Callable[[], Any] | None = None
    record: Callable[[Any], Any] | None = None
    elapsed_ms: Callable[[Any, Any], float] | None = None
    barrier: Callable[[], Any] | None = None
    flush: Callable[[], Any] | None = None


def host_window(clock: Clock, call: Callable[[], Any]) -> tuple[float, Any]:
    """Timer "host": synchronize, host clock, call, synchronize, host clock. Launch and Python overhead count."""
    clock.sync()
    t0 = clock.now_ns()
    out = call()
    clock.sync()
    return float(clock.now_ns() - t0), out


def cuda_event_window(clock: Clock, call: Callable[[], Any]) -> tuple[float, Any]:
    """Timer "cuda_event": (L2 flush,) event, call, event, synchronize; the device time between the two events."""
    if clock.flush is not None:
        clock.flush()
    start, end = clock.new_event(), clock.new_event()
    clock.record(start)
    out = call()
    clock.record(end)
    clock.sync()
    return clock.elapsed_ms(start, end) * 1e6, out


def ranks_window(clock: Clock, call: Callable[[], Any]) -> tuple[float, Any]:
    """The official multi-rank window on every rank: (L2 flush,) synchronize, barrier, host clock, call,
    synchronize, barrier, host clock. Rank 0's figure is the one reported."""
    if clock.flush is not None:
        clock.flush()
    clock.sync()
    clock.barrier()
    t0 = clock.now_ns()
    out = call()
    clock.sync()
    clock.barrier()
    return float(clock.now_ns() - t0), out


TIMERS = {"host": host_window, "cuda_event": cuda_event_window}


def timer_for(kind: str, ranks: int, has_events: bool) -> Callable[[Clock, Callable[[], Any]], tuple[float, Any]]:
    """The window a judged call runs in: several ranks always use the rank window; one rank its protocol's timer
    (CUDA events need a GPU: on the CPU both kinds read the host clock)."""
    if ranks > 1:
        return ranks_window
    if kind == "cuda_event" and has_events:
        return cuda_event_window
    return host_window


def summarize(durations_ns: list[float]) -> dict:
    """runs, mean, std (n-1), err = std/sqrt(n), median, best, worst of a list of durations (ns); {} when empty."""
    n = len(durations_ns)
    if n == 0:
        return {}
    mean = sum(durations_ns) / n
    std = math.sqrt(sum((d - mean) ** 2 for d in durations_ns) / (n - 1)) if n > 1 else 0.0
    return {"runs": n, "mean": mean, "std": std, "err": std / math.sqrt(n), "median": statistics.median(durations_ns),
            "best": min(durations_ns), "worst": max(durations_ns)}


def should_stop(durations_ns: list[float], elapsed_ns: float, *, rel_err_stop: float, budget_s: float,
                max_wall_s: float, min_runs: int, max_runs: int) -> bool:
    """The official rule after each timed run: stop at max_runs, or once min_runs are in and the mean is precise
    enough (err/mean < rel_err_stop), the timed total passed the budget (mean*runs > budget), or the wall clock of
    the loop passed max_wall_s."""
    n = len(durations_ns)
    if n >= max_runs:
        return True
    if n < min_runs:
        return False
    s = summarize(durations_ns)
    if s["mean"] <= 0:
        return True
    return (s["err"] / s["mean"] < rel_err_stop
            or s["mean"] * n > budget_s * 1e9
            or elapsed_ns > max_wall_s * 1e9)


def trace_events(prof: Any) -> list[dict]:
    """Every event of a finished torch profiler run (``prof``: what ``torch.profiler.profile`` yields), as its Chrome
    trace holds them (dicts with cat, name, ts and dur in us, ...)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("traceEvents", [])


def device_work(prof: Any) -> list[tuple[str, float, float]]:
    """The kernels and copies of a finished torch profiler run, as (name, start, duration) in us, read from its
    Chrome trace."""
    return work_of(trace_events(prof))


def work_of(events: list[dict]) -> list[tuple[str, float, float]]:
    """device_work's (name, start, duration) in us, from Chrome trace events already read."""
    return [(e.get("name", ""), e["ts"], e["dur"]) for e in events
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]


def call_timelines(work: list[tuple[str, float, float]],
                   calls: list[tuple[float, float]]) -> list[list[tuple[str, float, float, float]]]:
    """The device work of synchronised calls, one list a call: each kernel or copy as (name, start after the call's
    host start, duration, gap: the device idle since the call's previous work ended, or since the host start for the
    first), in start order. work: (name, start, duration) as device_work gives it; calls: each call's host window
    (start, end) in the same clock, the end after its synchronize, so that the call's work starts inside it; work
    outside every window (the inputs' clones between calls) is left out."""
    timelines = []
    for begin, end in calls:
        done, rows = begin, []
        for name, start, dur in sorted((w for w in work if begin <= w[1] < end), key=lambda w: w[1]):
            rows.append((name, start - begin, dur, max(0.0, start - done)))
            done = max(done, start + dur)
        timelines.append(rows)
    return timelines


def device_gaps(kernels: list[tuple[float, float]]) -> tuple[float, float]:
    """(span, busy) of a call's device work, from its kernels' (start, duration) in one unit: span runs from the
    first start to the last end, busy is the length of the union of the kernels' intervals. span - busy is the time
    the device sat idle inside the call, waiting for the host (launch gaps, allocations, host synchronisation)."""
    if not kernels:
        return 0.0, 0.0
    spans = sorted((start, start + dur) for start, dur in kernels)
    busy, cur_start, cur_end = 0.0, spans[0][0], spans[0][1]
    for start, end in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return max(e for _, e in spans) - spans[0][0], busy

