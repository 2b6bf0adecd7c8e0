"""The judge inside a worker process: generate, call the submission, check, time (EVAL_PROTOCOL.md).

Staged into the run directory as ``harness.py`` and started by evaluator/runner.py in a spawned process, one per rank,
with the run directory as cwd and sys.path[0]. ``main(conn, job)`` imports torch, task, reference, utils and the
submission once, then runs the job's cases in order and sends one message per event through ``conn`` (the write end
of a pipe only the parent reads; results never go through a file descriptor the submission is told about):

    ("hello", rank, environment)        after torch is up (rank 0 fills gpu, torch, cuda, ...)
    ("start", rank, index)              a case begins
    ("result", rank, index, payload)    payload: {"status": "pass"|"fail", "message": str, "durations": [ns...],
                                                  "wall_s": float, "leaving": bool (several ranks: exits next)}
    ("fatal", rank, message)            the submission (or the problem's files) cannot be imported: nothing can run
    ("done", rank)                      every case of the job ran

job: {"run_dir", "rank", "world_size" (1 for one process), "distributed" (the problem is multi-rank: its checks use
ref_kernel_local + compare, and a process group exists even for one rank), "device" ("cuda"|"cpu"), "mode",
"protocol" (Protocol fields as a dict), "cases" ([index, case] with the seed already combined), "warmup" (case or
None), "port", "pg_timeout_s"}.

With several ranks, an exception raised by the submission leaves the others inside a collective, so the rank reports
it and exits; the parent then ends the group and starts a fresh one for the next case.
"""
from __future__ import annotations

import copy
import os
import platform
import sys
import time
import traceback
import types

# Captured before any submission code runs, so a submission that patches time cannot change the clock we read.
_perf_ns = time.perf_counter_ns

if __package__:
    from . import timing
else:  # staged in the run directory
    import timing

_should_stop = timing.should_stop
torch = None  # imported in main(); the module itself stays importable without torch


class _Unsafe(Exception):
    """An exception after which the ranks are no longer in step (raised by the submission or around a collective)."""


# ----------------------------------------------------------------------------------------------------------------
# walking inputs and outputs: tensors inside tuples, lists, dicts and plain objects (mla-decode's config, kv cache)

def _leaves(obj, path="data", depth=0, seen=None):
    """Yield (path, tensor) for every tensor reachable from obj; paths are stable across clones of the same data."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    seen = set() if seen is None else seen
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _leaves(x, f"{path}[{i}]", depth + 1, seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}[{k!r}]", depth + 1, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, types.FunctionType)):
        for k, v in vars(obj).items():
            yield from _leaves(v, f"{path}.{k}", depth + 1, seen)


def _clone(obj):
    """A deep copy of inputs with tensors cloned in place (strides kept: fp8-mm's column-major views stay so)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_clone(x) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (int, float, str, bool)):
        return obj
    return copy.deepcopy(obj)


def _storage_ptr(t) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # meta / sparse tensors have no storage to share
        return 0


def _bad_aliases(output, given, before) -> list[str]:
    """Input paths an output tensor shares storage with, other than a preallocated output buffer.

    An output may be the very input tensor it was handed as a buffer and wrote into (fp8-mm's zeroed ``c``,
    mla-decode's cache): same dtype, shape, strides and offset, and its contents changed during the call. Any other
    sharing (a reshaped or reinterpreted view, or input data handed back untouched) is "a view of its input".
    ``before``: the inputs as they were before the call (what the check uses), for the changed test.
    """
    owners = {}
    for path, t in _leaves(given):
        ptr = _storage_ptr(t)
        if ptr:
            owners.setdefault(ptr, (path, t))
    previous = dict(_leaves(before)) if before is not None else {}
    bad = set()
    for _, out in _leaves(output):
        hit = owners.get(_storage_ptr(out))
        if hit is None:
            continue
        path, t = hit
        same_tensor = (out.dtype == t.dtype and out.shape == t.shape and out.stride() == t.stride()
                       and out.storage_offset() == t.storage_offset())
        prev = previous.get(path)
        written = prev is not None and prev is not t and not _bitwise_equal(prev, t)
        if not (same_tensor and written):
            bad.add(path)
    return sorted(bad)


_INT_OF_SIZE = {}


def _bitwise_equal(a, b) -> bool:
    """Same shape and the same bits (NaN equals NaN), for any dtype, including fp8."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not _INT_OF_SIZE:
        _INT_OF_SIZE.update({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64})
    as_int = _INT_OF_SIZE.get(a.element_size())
    if as_int is None or a.is_complex():
        return bool(torch.equal(a, b))
    return bool(torch.equal(a.view(as_int), b.view(as_int)))


def _describe(exc: BaseException, what: str) -> str:
    """'custom_kernel raised ValueError: msg (submission.py line 12)' from an exception."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if os.path.basename(frame.filename) == "submission.py":
            where = f" (submission.py line {frame.lineno})"
            break
    text = str(exc).strip().splitlines()
    return f"{what} raised {type(exc).__name__}: {text[0] if text else ''}{where}".rstrip()


def _noop(*_a, **_k):
    return None


# ----------------------------------------------------------------------------------------------------------------

class _Worker:
    def __init__(self, conn, job: dict):
        self.conn = conn
        self.job = job
        self.rank = job["rank"]
        self.world_size = job["world_size"]
        self.multi = self.world_size > 1
        self.distributed = job["distributed"]
        self.mode = job["mode"]
        self.p = types.SimpleNamespace(**job["protocol"])
        self.cuda = job["device"] == "cuda"

    def send(self, *msg) -> None:
        self.conn.send(msg)

    # -- start-up ----------------------------------------------------------------------------------------------
    def setup_device(self) -> None:
        if self.cuda:
            self.dev = torch.device("cuda", self.rank if self.distributed else torch.cuda.current_device())
            torch.cuda.set_device(self.dev)
            # Bound here, before the submission is imported: patching torch.cuda.synchronize or the Event class's
            # methods afterwards does not reach the functions the timer calls.
            self._sync = torch.cuda.synchronize
            self._Event, self._record, self._elapsed_ms = (torch.cuda.Event, torch.cuda.Event.record,
                                                           torch.cuda.Event.elapsed_time)
        else:
            self.dev = torch.device("cpu")
            self._sync = _noop
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world_size))
        if self.distributed:
            import datetime
            import torch.distributed as dist
            kw = dict(backend="nccl" if self.cuda else "gloo", init_method=f"tcp://127.0.0.1:{self.job['port']}",
                      rank=self.rank, world_size=self.world_size,
                      timeout=datetime.timedelta(seconds=self.job["pg_timeout_s"]))
            try:
                dist.init_process_group(**kw, **({"device_id": self.dev} if self.cuda else {}))
            except TypeError:  # torch without device_id
                dist.init_process_group(**kw)
            self._barrier, self._all_reduce, self._broadcast = dist.barrier, dist.all_reduce, dist.broadcast
            self._MAX = dist.ReduceOp.MAX
            self._dist = dist

    def environment(self) -> dict:
        env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
        if self.cuda:
            env["gpu"] = torch.cuda.get_device_name(self.dev)
            env["gpu_count"] = torch.cuda.device_count()
            try:
                import subprocess
                out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=10)
                env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else ""
            except Exception:
                pass
        return env

    def import_modules(self) -> str | None:
        """Import the problem's files, capture what the judge calls, then import the submission; an error text or None."""
        try:
            import utils
            import task  # noqa: F401  (submissions import it; an error here is the problem's, reported early)
            import reference
        except Exception as exc:
            return _describe(exc, "importing the problem's task/reference/utils")
        # Captured before the submission is imported, so patching these module attributes changes nothing here.
        self._generate_input = reference.generate_input
        self._check_implementation = getattr(reference, "check_implementation", None)
        self._ref_kernel_local = getattr(reference, "ref_kernel_local", None)
        self._compare = getattr(reference, "compare", None)
        self._clear_l2 = getattr(utils, "clear_l2_cache", _noop)
        if self.distributed and (self._ref_kernel_local is None or self._compare is None):
            return "reference.py of a distributed problem must define ref_kernel_local(rank, **case) and compare()"
        try:
            import submission
        except BaseException as exc:  # SystemExit from a submission is an import failure too
            return _describe(exc, "importing submission.py")
        fn = getattr(submission, "custom_kernel", None)
        if not callable(fn):
            return "submission.py defines no custom_kernel(data): add `def custom_kernel(data): ...`"
        self._custom_kernel = fn
        return None

    # -- building blocks -----------------------------------------------------------------------------------------
    def generate(self, case: dict):
        try:
            if self.distributed:
                return self._generate_input(**case, rank=self.rank)
            return self._generate_input(**case)
        except Exception as exc:
            raise _Unsafe(_describe(exc, "generate_input")) from exc

    def call(self, given):
        try:
            return self._custom_kernel(given)
        except Exception as exc:
            raise _Unsafe(_describe(exc, "custom_kernel")) from exc

    def split(self, data, need_check_copy: bool = True):
        """(what the submission gets, what the check uses): a clone and the original, or (clone_inputs false) the
        original and a copy taken before the call."""
        if self.p.clone_inputs:
            return _clone(data), data
        return data, (_clone(data) if need_check_copy else None)

    def verify(self, check_data, given, output, case) -> str | None:
        """None if the output is right, else why not."""
        try:
            if self.cuda:
                # Work the submission left running on another stream: a copy taken on the current stream before a
                # full device synchronize differs from the output after it.
                snapshot = [t.clone() for _, t in _leaves(output)]
                self._sync()
                after = [t for _, t in _leaves(output)]
                if len(snapshot) != len(after) or not all(map(_bitwise_equal, snapshot, after)):
                    return ("output changed after a full device synchronize: the submission leaves work running "
                            "(e.g. on a side stream) that the timer does not wait for")
            aliased = _bad_aliases(output, given, check_data)
            if aliased:
                return f"returned a view of its input ({', '.join(aliased)}): return a tensor of its own"
            if self.distributed:
                ok, msg = self._compare(output, self._ref_kernel_local(self.rank, **case))
            else:
                ok, msg = self._check_implementation(check_data, output)
            return None if ok else (str(msg).strip() or "output does not match the reference")
        except Exception as exc:
            return _describe(exc, "checking the output")

    def any_failed(self, err: str | None) -> bool:
        """True if this rank or (several ranks) any rank failed: every rank leaves the loop together."""
        if not self.multi:
            return err is not None
        flag = torch.tensor([1 if err else 0], dtype=torch.int32, device=self.dev)
        self._all_reduce(flag, op=self._MAX)
        return bool(flag.item())

    def decide_stop(self, durations, loop_start_ns, budget_s) -> bool:
        """Rank 0 applies the official stopping rule and (several ranks) broadcasts its decision."""
        p = self.p
        stop = _should_stop(durations, _perf_ns() - loop_start_ns, rel_err_stop=p.rel_err_stop, budget_s=budget_s,
                            max_wall_s=p.max_wall_s, min_runs=p.min_runs, max_runs=p.max_runs)
        if not self.multi:
            return stop
        flag = torch.tensor([1 if stop else 0], dtype=torch.int32, device=self.dev)
        self._broadcast(flag, src=0)
        return bool(flag.item())

    def timed_run(self, data, want_check: bool):
        """One timed call -> (ns, output, given, check_data), with the problem's timer."""
        p = self.p
        if self.multi:
            # Official multi-rank window: flush, sync, barrier, host clock on rank 0, clone inside the window.
            check_data = data if p.clone_inputs else (_clone(data) if want_check else None)
            if self.cuda and p.l2_flush:
                self._clear_l2()
            self._sync()
            self._barrier()
            t0 = _perf_ns()
            given = _clone(data) if p.clone_inputs else data
            out = self.call(given)
            self._sync()
            self._barrier()
            return _perf_ns() - t0, out, given, check_data
        given, check_data = self.split(data, want_check)
        if self.cuda and p.timer == "cuda_event":
            if p.l2_flush:
                self._clear_l2()
            start, end = self._Event(enable_timing=True), self._Event(enable_timing=True)
            self._record(start)
            out = self.call(given)
            self._record(end)
            self._sync()
            return self._elapsed_ms(start, end) * 1e6, out, given, check_data
        self._sync()
        t0 = _perf_ns()
        out = self.call(given)
        self._sync()
        return _perf_ns() - t0, out, given, check_data

    # -- modes -------------------------------------------------------------------------------------------------
    def check_once(self, case):
        """Generate, call once, check: (data, error or None)."""
        data = self.generate(case)
        given, check_data = self.split(data)
        out = self.call(given)
        err = self.verify(check_data, given, out, case)
        return data, err

    def test(self, case):
        _, err = self.check_once(case)
        self.any_failed(err)  # keeps the ranks in step with each other
        return err, []

    def benchmark(self, case, budget_s: float, recheck: bool):
        data, err = self.check_once(case)
        if self.any_failed(err):
            return err or "", []
        durations = []
        loop_start = _perf_ns()
        for i in range(self.p.max_runs):
            cur = case
            if recheck:  # the leaderboard's re-seeded run: new inputs each time, each output checked
                cur = dict(case, seed=case["seed"] + self.p.reseed_step * (i + 1))
                data = self.generate(cur)
            ns, out, given, check_data = self.timed_run(data, recheck)
            err = self.verify(check_data, given, out, cur) if recheck else None
            del out, given, check_data
            if self.any_failed(err):
                return (f"run {i + 1} (seed {cur['seed']}): {err}" if err else ""), durations
            durations.append(ns)
            if self.decide_stop(durations, loop_start, budget_s):
                break
        return None, durations

    def profile(self, case):
        data, err = self.check_once(case)
        if self.any_failed(err):
            return err or "", []
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        given, _ = self.split(data, need_check_copy=False)
        self._sync()
        with profile(activities=activities) as prof:
            self.call(given)
            self._sync()
        averages = prof.key_averages()
        for sort in (("device_time_total", "cuda_time_total") if self.cuda else ("cpu_time_total",)):
            try:  # torch renamed the CUDA column to "device"; older versions know only the first name
                return None, [], averages.table(sort_by=sort, row_limit=15)
            except Exception:
                continue
        return None, [], averages.table(row_limit=15)

    def run_case(self, case, first: bool) -> dict:
        t0 = _perf_ns()
        mode, p = self.mode, self.p
        table = ""
        if mode == "test":
            err, durations = self.test(case)
        elif mode == "profile":
            err, durations, *rest = self.profile(case)
            table = rest[0] if rest else ""
        else:
            if first and self.job.get("warmup") is not None:
                try:
                    self.benchmark(self.job["warmup"], p.warmup_budget_s[mode], recheck=False)
                except _Unsafe as exc:
                    if self.multi:  # the ranks are out of step: this case cannot run in this group
                        raise _Unsafe(f"during the warm-up: {exc}") from exc
                    # one process: the case below shows the submission's behaviour on its own inputs
            err, durations = self.benchmark(case, p.budget_s[mode], recheck=(mode == "leaderboard"))
        status = "pass" if err is None else "fail"
        return {"status": status, "message": table if status == "pass" else err, "durations": durations,
                "wall_s": (_perf_ns() - t0) / 1e9}

    def run(self) -> None:
        self.setup_device()
        self.send("hello", self.rank, self.environment() if self.rank == 0 else {})
        error = self.import_modules()
        if error:
            self.send("fatal", self.rank, error)
            return
        for n, (index, case) in enumerate(self.job["cases"]):
            self.send("start", self.rank, index)
            t0 = _perf_ns()
            try:
                payload = self.run_case(case, first=(n == 0))
            except Exception as exc:
                message = str(exc) if isinstance(exc, _Unsafe) else _describe(exc, "the harness")
                self.send("result", self.rank, index, {"status": "fail", "message": message, "durations": [],
                                                       "wall_s": (_perf_ns() - t0) / 1e9, "leaving": self.multi})
                if self.multi:  # the other ranks may sit in a collective this rank will never join
                    self.conn.close()
                    os._exit(0)
                continue
            self.send("result", self.rank, index, payload)
        self.send("done", self.rank)
        if self.distributed:
            try:
                self._dist.destroy_process_group()
            except Exception:
                pass


def main(conn, job: dict) -> None:
    """Worker entry: run the job, then leave without running the submission's exit hooks or waiting on its threads."""
    global torch
    import torch as _torch
    torch = _torch
    try:
        _Worker(conn, job).run()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(70)
    sys.stdout.flush()
    sys.stderr.flush()
    conn.close()
    os._exit(0)
