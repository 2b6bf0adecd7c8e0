"""The judge inside a worker process: read the case file, generate, call the submission, check, time.

Staged into the run directory as ``harness.py`` and started by evaluator/workers.py in a spawned process, one per
rank, with the run directory as cwd and sys.path[0]. Like the official harness, it reads its cases from the staged
``cases.txt`` (one ``key: value; key: value`` line each, world size and secret seed already applied).
``main(conn, job)`` imports torch, task, reference, utils and the submission once, runs the job's lines in order
and sends one message per event through ``conn`` (the write end of a pipe only the parent reads):

    ("hello", rank, environment)        after torch is up (rank 0 fills gpu, torch, cuda, ...)
    ("start", rank, index)              a case begins
    ("result", rank, index, payload)    payload: {"status": "pass"|"fail", "message": str, "durations": [ns...],
                                                  "wall_s": float, "leaving": bool (several ranks: exits next)}
    ("fatal", rank, message)            the submission (or the problem's files) cannot be imported: nothing can run
    ("imported", rank, seconds)         the submission's import took this long (its extension builds included)
    ("done", rank)                      every case of the job ran

job: {"run_dir", "rank", "world_size" (1 for one process), "distributed" (multi-rank problem: checks use
ref_kernel_local + compare, and a process group exists even for one rank), "device" ("cuda"|"cpu"), "mode",
"protocol" (Protocol fields), "run" ([case index, line number in cases.txt] pairs), "warmup" (a line number or
None), "intended_bools", "port", "pg_timeout_s"}.

Before each case the worker prints ``CASE_MARK`` + index to its log, so the parent can show what a case printed.
With several ranks, an exception raised by the submission leaves the others inside a collective, so the rank reports
it and exits; the parent then ends the group and starts a fresh one for the next case.
"""
from __future__ import annotations

import os
import platform
import sys
import time
import traceback
import types

# Captured before any submission code runs, so a submission that patches time cannot change the clock we read.
_perf_ns = time.perf_counter_ns

if __package__:
    from . import guards, timing
    from .guards import bad_aliases, bitwise_equal, clone, describe, leaves
else:  # staged in the run directory
    import guards
    import timing
    from guards import bad_aliases, bitwise_equal, clone, describe, leaves

_should_stop = timing.should_stop
CASE_MARK = "[kbench] case "
torch = None  # imported in main(); the module itself stays importable without torch


class _Unsafe(Exception):
    """An exception after which the ranks are no longer in step (raised by the submission or around a collective)."""


# ----------------------------------------------------------------------------------------------------------------
# the case file

def parse_line(line: str, intended_bools: bool = False) -> dict:
    """One official case line -> the dict generate_input gets: int where the value parses, else the string
    (``True``/``False`` become booleans only with intended_bools)."""
    case = {}
    for part in line.strip().split(";"):
        if not part.strip():
            continue
        key, _, value = part.partition(":")
        value = value.strip()
        try:
            case[key.strip()] = int(value)
        except ValueError:
            case[key.strip()] = (value == "True") if intended_bools and value in ("True", "False") else value
    return case


def read_case_file(run_dir: str) -> list[str]:
    with open(os.path.join(run_dir, "cases.txt"), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def _noop(*_a, **_k):
    return None


# ----------------------------------------------------------------------------------------------------------------
# one rank: device, process group, clock

class Rank:
    """This process's place in the run: its device, the process group (several ranks) and the timing clock.

    Every torch function the timers and the rank checks call is bound here, before the submission is imported:
    patching torch.cuda.synchronize or the Event class afterwards does not reach them.
    """

    def __init__(self, job: dict):
        self.rank, self.world_size = job["rank"], job["world_size"]
        self.multi, self.distributed = self.world_size > 1, job["distributed"]
        self.cuda = job["device"] == "cuda"
        if self.cuda:
            self.dev = torch.device("cuda", self.rank if self.distributed else torch.cuda.current_device())
            torch.cuda.set_device(self.dev)
            self.sync = torch.cuda.synchronize
            event = torch.cuda.Event
            self._events = dict(new_event=lambda: event(enable_timing=True), record=event.record,
                                elapsed_ms=event.elapsed_time)
        else:
            self.dev = torch.device("cpu")
            self.sync = _noop
            self._events = {}
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world_size))
        if self.distributed:
            self._init_process_group(job)

    def _init_process_group(self, job: dict) -> None:
        import datetime
        import torch.distributed as dist
        kw = dict(backend="nccl" if self.cuda else "gloo", init_method=f"tcp://127.0.0.1:{job['port']}",
                  rank=self.rank, world_size=self.world_size,
                  timeout=datetime.timedelta(seconds=job["pg_timeout_s"]))
        try:
            dist.init_process_group(**kw, **({"device_id": self.dev} if self.cuda else {}))
        except TypeError:  # torch without device_id
            dist.init_process_group(**kw)
        self.dist = dist
        self._barrier, self._all_reduce, self._broadcast, self._MAX = (dist.barrier, dist.all_reduce,
                                                                       dist.broadcast, dist.ReduceOp.MAX)

    def clock(self, flush) -> timing.Clock:
        return timing.Clock(sync=self.sync, now_ns=_perf_ns, barrier=self._barrier if self.multi else None,
                            flush=flush if self.cuda else None, **self._events)

    def any_true(self, flag: bool) -> bool:
        """True if this rank's flag or (several ranks) any rank's flag is set: every rank gets the same answer."""
        if not self.multi:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.dev)
        self._all_reduce(t, op=self._MAX)
        return bool(t.item())

    def from_rank0(self, flag: bool) -> bool:
        """Rank 0's flag on every rank (the official stop decision)."""
        if not self.multi:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.dev)
        self._broadcast(t, src=0)
        return bool(t.item())

    def environment(self) -> dict:
        env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
        if self.cuda:
            env.update(gpu=torch.cuda.get_device_name(self.dev), gpu_count=torch.cuda.device_count())
        return env

    def leave(self) -> None:
        if self.distributed:
            try:
                self.dist.destroy_process_group()
            except Exception:
                pass


# ----------------------------------------------------------------------------------------------------------------
# the judge: the problem's functions, the submission, and one checked call

class Judge:
    """The problem's generate/check functions and the submission's custom_kernel, captured once at import."""

    def __init__(self, rank: Rank, protocol: dict):
        self.r, self.p = rank, types.SimpleNamespace(**protocol)
        self.import_s = 0.0

    def import_modules(self) -> str | None:
        """Import the problem's files, capture what the judge calls, then import the submission; an error or None."""
        try:
            import utils
            import task  # noqa: F401  (submissions import it; an error here is the problem's, reported early)
            import reference
        except Exception as exc:
            return describe(exc, "importing the problem's task/reference/utils")
        # Captured before the submission is imported, so patching these module attributes changes nothing here.
        self._generate_input = reference.generate_input
        self._check = getattr(reference, "check_implementation", None)
        self._ref_local = getattr(reference, "ref_kernel_local", None)
        self._compare = getattr(reference, "compare", None)
        self.clear_l2 = getattr(utils, "clear_l2_cache", _noop) if self.p.l2_flush else None
        if self.r.distributed and (self._ref_local is None or self._compare is None):
            return "reference.py of a distributed problem must define ref_kernel_local(rank, **case) and compare()"
        t0 = _perf_ns()
        try:
            import submission
        except BaseException as exc:  # SystemExit from a submission is an import failure too
            return describe(exc, "importing submission.py")
        self.import_s = (_perf_ns() - t0) / 1e9  # load_inline builds (or finds in torch's cache) inside the import
        fn = getattr(submission, "custom_kernel", None)
        if not callable(fn):
            return "submission.py defines no custom_kernel(data): add `def custom_kernel(data): ...`"
        self._custom_kernel = fn
        return None

    def generate(self, case: dict):
        try:
            if self.r.distributed:
                return self._generate_input(**case, rank=self.r.rank)
            return self._generate_input(**case)
        except Exception as exc:
            raise _Unsafe(describe(exc, "generate_input")) from exc

    def call(self, given):
        try:
            return self._custom_kernel(given)
        except Exception as exc:
            raise _Unsafe(describe(exc, "custom_kernel")) from exc

    def inputs(self, data, need_check_copy: bool = True):
        """(what the submission gets, what the check uses): a clone and the original, or (clone_inputs false) the
        original and a copy taken before the call."""
        if self.p.clone_inputs:
            return clone(data), data
        return data, (clone(data, deep=True) if need_check_copy else None)

    def verify(self, check_data, given, output, case) -> str | None:
        """None if the output is right, else why not."""
        try:
            if self.r.cuda:
                # Work the submission left running on another stream: a copy taken on the current stream before a
                # full device synchronize differs from the output after it.
                snapshot = [t.clone() for _, t in leaves(output)]
                self.r.sync()
                after = [t for _, t in leaves(output)]
                if len(snapshot) != len(after) or not all(map(bitwise_equal, snapshot, after)):
                    return ("output changed after a full device synchronize: the submission leaves work running "
                            "(e.g. on a side stream) that the timer does not wait for")
            aliased = bad_aliases(output, given, check_data)
            if aliased:
                return f"returned a view of its input ({', '.join(aliased)}): return a tensor of its own"
            if self.r.distributed:
                ok, msg = self._compare(output, self._ref_local(self.r.rank, **case))
            else:
                ok, msg = self._check(check_data, output)
            return None if ok else (str(msg).strip() or "output does not match the reference")
        except Exception as exc:
            return describe(exc, "checking the output")

    def check_once(self, case):
        """Generate, call once, check: (data, error or None)."""
        data = self.generate(case)
        given, check_data = self.inputs(data)
        return data, self.verify(check_data, given, self.call(given), case)


# ----------------------------------------------------------------------------------------------------------------
# the modes

def timed_loop(judge: Judge, case: dict, budget_s: float, recheck: bool) -> tuple[str | None, list]:
    """The official benchmark loop of one case: check once, then up to max_runs timed calls (leaderboard mode
    reseeds, regenerates and checks every run) until the stopping rule says so. (error or None, durations)."""
    r, p = judge.r, judge.p
    data, err = judge.check_once(case)
    if r.any_true(err is not None):
        return err or "", []
    clock = r.clock(judge.clear_l2)
    window = timing.timer_for(p.timer, r.world_size, r.cuda)
    durations, loop_start = [], _perf_ns()
    for i in range(p.max_runs):
        cur = case
        if recheck:
            cur = dict(case, seed=case["seed"] + p.reseed_step * (i + 1))
            data = judge.generate(cur)
        holder = {}
        if r.multi:  # the official multi-rank window clones inside the timed call, one rank clones before it
            check_data = data if p.clone_inputs else (clone(data, deep=True) if recheck else None)

            def call():
                holder["given"] = clone(data) if p.clone_inputs else data
                return judge.call(holder["given"])
        else:
            holder["given"], check_data = judge.inputs(data, need_check_copy=recheck)

            def call():
                return judge.call(holder["given"])

        ns, out = window(clock, call)
        err = judge.verify(check_data, holder["given"], out, cur) if recheck else None
        del out, holder, check_data
        if r.any_true(err is not None):
            return (f"run {i + 1} (seed {cur['seed']}): {err}" if err else ""), durations
        durations.append(ns)
        stop = _should_stop(durations, _perf_ns() - loop_start, rel_err_stop=p.rel_err_stop, budget_s=budget_s,
                            max_wall_s=p.max_wall_s, min_runs=p.min_runs, max_runs=p.max_runs)
        if r.from_rank0(stop):
            break
    return None, durations


def profile_once(judge: Judge, case: dict) -> tuple[str | None, str]:
    """Check once, then (protocol profile_warmup) that many plain calls, then one call under the torch profiler:
    (error or None, the top-kernels table)."""
    data, err = judge.check_once(case)
    if judge.r.any_true(err is not None):
        return err or "", ""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if judge.r.cuda else [])
    for _ in range(judge.p.profile_warmup):
        given, _ = judge.inputs(data, need_check_copy=False)
        judge.call(given)
        judge.r.sync()
    given, _ = judge.inputs(data, need_check_copy=False)
    judge.r.sync()
    with profile(activities=activities) as prof:
        judge.call(given)
        judge.r.sync()
    averages, table = prof.key_averages(), None
    for sort in (("device_time_total", "cuda_time_total") if judge.r.cuda else ("cpu_time_total",)):
        try:  # torch renamed the CUDA column to "device"; older versions know only the first name
            table = averages.table(sort_by=sort, row_limit=15)
            break
        except Exception:
            continue
    table = table or averages.table(row_limit=15)
    return None, table + (_device_idle_line(prof) if judge.r.cuda else "")


def _device_idle_line(prof) -> str:
    """One line under a CUDA profile: the call's device span, the time its kernels and copies kept the device busy,
    and the difference (the device waiting for the host inside the call), from the profiler's trace."""
    work = [(start, dur) for _, start, dur in timing.device_work(prof)]
    span, busy = timing.device_gaps(work)
    return (f"\ndevice: {span:.1f} us from the first kernel's start to the last one's end, {busy:.1f} us busy, "
            f"{span - busy:.1f} us idle between them")


def run_case(judge: Judge, job: dict, case: dict, warmup: dict | None) -> dict:
    """One case in the job's mode -> the result payload."""
    t0, mode, p = _perf_ns(), job["mode"], judge.p
    table, durations = "", []
    if mode == "test":
        _, err = judge.check_once(case)
        judge.r.any_true(err is not None)  # keeps the ranks in step with each other
    elif mode == "profile":
        err, table = profile_once(judge, case)
    else:
        if warmup is not None:
            try:
                timed_loop(judge, warmup, p.warmup_budget_s[mode], recheck=False)
            except _Unsafe as exc:
                if judge.r.multi:  # the ranks are out of step: this case cannot run in this group
                    raise _Unsafe(f"during the warm-up: {exc}") from exc
                # one process: the case below shows the submission's behaviour on its own inputs
        err, durations = timed_loop(judge, case, p.budget_s[mode], recheck=(mode == "leaderboard"))
    return {"status": "pass" if err is None else "fail", "message": table if err is None else err,
            "durations": durations, "wall_s": (_perf_ns() - t0) / 1e9}


def work(conn, job: dict) -> None:
    """Set up, import, then run the job's cases in order, reporting each through conn."""
    rank = Rank(job)
    send = conn.send
    send(("hello", rank.rank, rank.environment() if rank.rank == 0 else {}))
    judge = Judge(rank, job["protocol"])
    error = judge.import_modules()
    if error:
        send(("fatal", rank.rank, error))
        return
    send(("imported", rank.rank, judge.import_s))
    lines = read_case_file(job["run_dir"])
    parse = lambda n: parse_line(lines[n], job["intended_bools"])  # noqa: E731
    for n, (index, line_no) in enumerate(job["run"]):
        print(f"\n{CASE_MARK}{index}", flush=True)
        send(("start", rank.rank, index))
        t0 = _perf_ns()
        warmup = parse(job["warmup"]) if n == 0 and job.get("warmup") is not None else None
        try:
            payload = run_case(judge, job, parse(line_no), warmup)
        except Exception as exc:
            message = str(exc) if isinstance(exc, _Unsafe) else describe(exc, "the harness")
            send(("result", rank.rank, index, {"status": "fail", "message": message, "durations": [],
                                                "wall_s": (_perf_ns() - t0) / 1e9, "leaving": rank.multi}))
            if rank.multi:  # the other ranks may sit in a collective this rank will never join
                conn.close()
                os._exit(0)
            continue
        sys.stdout.flush()
        send(("result", rank.rank, index, payload))
    send(("done", rank.rank))
    rank.leave()


def main(conn, job: dict) -> None:
    """Worker entry: run the job, then leave without running the submission's exit hooks or waiting on its threads."""
    global torch
    import torch as _torch
    torch = guards.torch = _torch
    try:
        work(conn, job)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(70)
    sys.stdout.flush()
    sys.stderr.flush()
    conn.close()
    os._exit(0)
