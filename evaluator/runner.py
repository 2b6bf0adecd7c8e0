"""Judging one submission against one problem: workers, time limits, containment, several ranks.

``run()`` stages the run directory (stage.py), then starts workers with the ``spawn`` method: one process, or one per
rank for a distributed problem (NCCL with ``cuda:rank`` on GPUs, gloo on the CPU, rendezvous on a free local port).
By default one worker (group) runs all cases in order; after a crash or a time-out the group is ended and a fresh one
runs the remaining cases, so a failure never loses another case's result. ``worker_per_case=True`` starts a fresh
worker (group) for every case, as the official runner does.

Containment: each worker leads its own process group (so Ctrl-C reaches only the parent, and killing the group also
ends compilers or helpers the submission started); its stdout and stderr go to ``logs/rank<R>.log`` in the run
directory; results come back over a pipe the parent alone reads. The time limit (the problem's per-mode limit unless
``timeout_s`` is given) applies to each case, counted from the end of the previous one, so the first case's window also
holds start-up, imports and compilation, as the official limit does.
"""
from __future__ import annotations

import faulthandler
import hashlib
import multiprocessing as mp
import os
import pickle
import platform
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import problems

from . import timing
from .record import CaseResult, RunRecord
from .stage import log_path, stage

MODES = ("test", "benchmark", "leaderboard", "profile")
MAX_MESSAGE_BYTES = 64 << 20  # far above any real message (a profile table); a forged length header fails at once
_KINDS = ("hello", "start", "result", "fatal", "done")
Progress = Callable[[str, int, "CaseResult | None"], None]


class EvaluatorError(ValueError):
    """A run that cannot start as asked (bad mode, device, world size, seed, submission path)."""


# ----------------------------------------------------------------------------------------------------------------
# inputs of a run

def resolve_problem(problem: str | Path):
    """(Spec, folder) for a registered name or a path to a problem folder holding spec.yml, task.py, reference.py."""
    if isinstance(problem, Path) or os.sep in str(problem):
        folder = Path(problem)
        return problems.load_spec_file(folder / "spec.yml"), folder
    return problems.load_spec(problem), problems.problem_dir(problem)


def check_world_size(cases: Sequence[Mapping], n: int, divisible_by: Sequence[str], gpus: int | None) -> None:
    """Raise EvaluatorError unless every case can be split over n ranks and (on GPUs) there is one GPU per rank.

    ``divisible_by``: case keys the reference splits over ranks (the spec's protocol.divisible_by_world_size, e.g.
    gemm-rs m and k), so a bad world size is refused before any process starts rather than deep inside a reference.
    """
    if n < 1:
        raise EvaluatorError(f"world size {n} is not a positive number of ranks: pass --world-size 1 or more")
    for case in cases:
        bad = [f"{k}={case[k]}" for k in divisible_by if k in case and int(case[k]) % n]
        if bad:
            raise EvaluatorError(f"case '{problems.format_case(case)}': {', '.join(bad)} not divisible by world size "
                                 f"{n}; pass a --world-size that divides them")
    if gpus is not None and gpus < n:
        raise EvaluatorError(f"world size {n} needs {n} GPUs (one per rank) but this machine has {gpus}: "
                             f"pass --world-size {max(gpus, 1)} or --device cpu")


def _world_size(spec, cases: list[dict], world_size: int | None, device: str) -> int | None:
    """The run's world size (None for a single-GPU problem); cases get their world_size key rewritten to it."""
    if spec.world_size is None:
        if world_size not in (None, 1):
            raise EvaluatorError(f"{spec.name} is a single-GPU problem: drop --world-size")
        return None
    sizes = {int(world_size)} if world_size else {_case_world_size(spec, c) for c in cases}
    if len(sizes) != 1:
        raise EvaluatorError(f"the cases ask for world sizes {sorted(sizes)}: pass one --world-size for the run")
    n = sizes.pop()
    gpus = None
    if device == "cuda":
        import torch
        gpus = torch.cuda.device_count()
    check_world_size(cases, n, spec.protocol.divisible_by_world_size, gpus)
    for c in cases:
        c["world_size"] = n
    return n


def _case_world_size(spec, case: Mapping) -> int:
    value = case.get("world_size", spec.world_size)
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise EvaluatorError(f"case '{problems.format_case(case)}': world_size {value!r} is not a whole number of "
                             f"ranks; fix the case or pass --world-size N") from None


def world_size_groups(spec, cases: Sequence[Mapping], world_size: int | None = None) -> dict[int | None, list[int]]:
    """Positions of ``cases`` by the world size they run with, groups in order of first appearance.

    A single-GPU problem, or a ``world_size`` override, gives one group (key None, resp. the override) holding every
    case; otherwise each case runs with its own ``world_size`` key (the spec's world size where it has none).
    """
    if spec.world_size is None or world_size:
        return {world_size if spec.world_size is not None else None: list(range(len(cases)))}
    groups: dict[int | None, list[int]] = {}
    for i, case in enumerate(cases):
        groups.setdefault(_case_world_size(spec, case), []).append(i)
    return groups


RunGroup = Callable[[list, "int | None", "Progress | None"], RunRecord]


def run_by_world_size(run_group: RunGroup, cases: Sequence[Mapping], groups: Mapping[int | None, list[int]],
                      world_size: int | None = None, progress: Progress | None = None) -> RunRecord:
    """One run per world size (one process group each), merged into one record in the order of ``cases``.

    run_group(group_cases, world_size, progress) runs one group and returns its RunRecord (indices local to the
    group). ``groups`` is world_size_groups(...). One group: a single call with ``world_size`` as given (None: the
    cases' own). Several: one call per group with the group's world size; the merged record's case indices and the
    progress callback's indices are positions in ``cases``; its world_size is the largest and its environment the
    union. A run that comes back interrupted, or Ctrl-C between two runs, ends the merge there
    (``interrupted=True``): what earlier runs measured is kept, cases never run are "skipped" (or "interrupted" for
    the one Ctrl-C stopped). Ctrl-C before the first run returns anything propagates as KeyboardInterrupt, as from
    one run's set-up. The caller reads the seed once (popcorn_seed) and gives every run the same one.
    """
    if len(groups) <= 1:
        return run_group(list(cases), world_size, progress)
    done: list[tuple[list[int], RunRecord]] = []
    stopped: list[int] = []             # the positions of the run Ctrl-C stopped before it returned
    try:
        for ws, indices in groups.items():
            stopped = indices

            def local(event, i, result, indices=indices):
                inside = 0 <= i < len(indices)
                progress(event, indices[i] if inside else i,
                         replace(result, index=indices[i]) if result is not None and inside else result)

            record = run_group([cases[i] for i in indices], ws, local if progress else None)
            done.append((indices, record))
            stopped = []
            if record.interrupted:
                break
    except KeyboardInterrupt:
        if not done:
            raise
    merged = done[0][1]
    results: dict[int, CaseResult] = {}
    for indices, record in done:
        for r in record.cases:
            r.index = indices[r.index]
            results[r.index] = r
        if record is not merged:
            merged.environment.update(record.environment)
            merged.world_size = max(merged.world_size or 0, record.world_size or 0) or None
        merged.interrupted = merged.interrupted or record.interrupted
    if stopped or len(results) < len(cases):
        merged.interrupted = True
    cases_out = []
    for i, case in enumerate(cases):
        if i in results:
            cases_out.append(results[i])
        elif stopped and i == stopped[0]:
            cases_out.append(CaseResult(index=i, case=dict(case), status="interrupted", message="stopped by Ctrl-C"))
        else:
            cases_out.append(CaseResult(index=i, case=dict(case), status="skipped", message="not run: interrupted"))
    merged.cases = cases_out
    return merged


def popcorn_seed(seed: int | None = None) -> int | None:
    """--seed, else POPCORN_SEED; the variable is removed either way (the official harness hides it from the code).

    run() calls it; a caller running several modes in a row reads the seed once with it and passes it to each run.
    """
    env = os.environ.pop("POPCORN_SEED", None)
    if seed is not None:
        return int(seed)
    if env is None or env.strip() == "":
        return None
    try:
        return int(env)
    except ValueError:
        raise EvaluatorError(f"POPCORN_SEED={env!r} is not an integer: unset it or set a whole number") from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------------------------
# the worker side of the fence (runs in the spawned process before the staged harness takes over)

def _follow_parent() -> None:
    """End this worker's whole process group when the parent dies (killed, terminal closed): a worker in its own
    session would otherwise outlive it, hanging on to a GPU."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch():
        parent.join()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="kbench-follow-parent", daemon=True).start()


def _worker_entry(job: dict, conn, log: str) -> None:
    try:
        os.setsid()  # own process group: Ctrl-C stays with the parent; killpg ends whatever the submission started
    except OSError:
        pass
    _follow_parent()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()                                    # a hard crash leaves its stack in the log
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for stacks before ending a hang
    try:
        # spawn hands every child the parent's resource-tracker pipe; a submission writing to stray descriptors
        # would spray errors over the parent's terminal. The worker starts its own tracker if it ever needs one.
        from multiprocessing import resource_tracker
        tracker = resource_tracker._resource_tracker
        if tracker._fd is not None:
            os.close(tracker._fd)
            tracker._fd = None
    except Exception:
        pass
    os.chdir(job["run_dir"])
    sys.path.insert(0, job["run_dir"])
    os.environ["KBENCH_DEVICE"] = job["device"]
    if job["device"] == "cpu":
        # Triton kernels have no CPU driver: on the CPU they run under Triton's interpreter, which must be chosen
        # before triton is first imported (by the submission, after this).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    for name in ("POPCORN_FD", "POPCORN_SEED"):
        os.environ.pop(name, None)
    import importlib
    importlib.import_module("harness").main(conn, job)


# ----------------------------------------------------------------------------------------------------------------
# the parent side: a group of workers for a batch of cases

def _exit_text(code: int | None) -> str:
    if code is None:
        return "worker stopped"
    if code < 0:
        try:
            return f"worker died with signal {signal.Signals(-code).name}"
        except ValueError:
            return f"worker died with signal {-code}"
    return f"worker exited with code {code}"


class _Group:
    """world_size worker processes running one batch of cases; the parent reads their pipes."""

    def __init__(self, ctx, job: dict, world_size: int, run_dir: Path):
        self.world_size = world_size
        self.procs, self.conns = [], []
        port = _free_port() if job["distributed"] else 0
        try:
            for rank in range(world_size):
                reader, writer = ctx.Pipe(duplex=False)
                self.conns.append(reader)
                proc = ctx.Process(target=_worker_entry, name=f"kbench-rank{rank}",
                                   args=(dict(job, rank=rank, port=port), writer, str(log_path(run_dir, rank))))
                self.procs.append(proc)
                proc.start()
                writer.close()  # the child holds the only write end: EOF on the reader means the child is gone
        except BaseException:  # Ctrl-C while starting: end the ranks already started
            self.kill()
            raise

    def dump_stacks(self, wait_s: float = 1.0) -> None:
        """Ask live workers to write every thread's stack into their logs (where a hang sits), before the kill."""
        live = [p for p in self.procs if p.pid is not None and p.exitcode is None]
        for proc in live:
            try:
                os.kill(proc.pid, signal.SIGUSR1)
            except OSError:
                pass
        if live:
            time.sleep(wait_s)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.pid is None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
            if proc.exitcode is None:
                proc.kill()
        for proc in self.procs:
            proc.join(timeout=10)
        for conn in self.conns:
            conn.close()

    def finish(self, grace_s: float = 5.0) -> None:
        """Every case is in: let the ranks leave on their own for a moment, then end the stragglers."""
        end = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(timeout=max(0.0, end - time.monotonic()))
        self.kill()


class _Batch:
    """Supervises one group over its batch: collects per-rank results, applies the time limit, spots dead ranks.

    With several ranks, a rank whose submission raised reports and leaves (its peers may be stuck in a collective).
    Its peers get LEAVE_GRACE_S to report or die too (so a simultaneous crash still reads as one), then the case is
    judged with what came in and the group ends; the next case gets a fresh group.
    """

    LEAVE_GRACE_S = 1.0

    def __init__(self, group: _Group, batch: list[tuple[int, dict]], timeout_s: float, results: dict,
                 progress: Progress | None, environment: dict):
        self.g, self.batch, self.timeout_s = group, batch, timeout_s
        self.results, self.progress, self.environment = results, progress, environment
        self.pos = 0
        # case index -> {rank: payload} in arrival order; ranks run ahead of each other, so a rank's result for a
        # later case can arrive before the current case is complete
        self.inbox: dict[int, dict[int, dict]] = {}
        self.done: set[int] = set()
        self.leavers: set[int] = set()          # ranks that reported a failure and exit on purpose
        self.grace_until: float | None = None
        self.ended = False                      # the group cannot run another case
        self.open = {i: c for i, c in enumerate(group.conns)}
        self.started_at = time.monotonic()
        self.fatal: str | None = None
        self.broken: str | None = None

    @property
    def current(self) -> tuple[int, dict]:
        return self.batch[self.pos]

    @property
    def payloads(self) -> dict[int, dict]:
        """rank -> payload of the current case."""
        return self.inbox.setdefault(self.current[0], {})

    def dead_ranks(self) -> dict[int, str]:
        """Ranks whose process ended without being asked to: rank -> why."""
        return {r: f"{_exit_text(p.exitcode)} during the case (its output: logs/rank{r}.log)"
                for r, p in enumerate(self.g.procs)
                if r not in self.done and r not in self.leavers and p.exitcode is not None}

    def finish_case(self, status: str | None = None, dead: Mapping[int, str] = {}, message: str = "") -> None:
        index, case = self.current
        ws = self.g.world_size
        prefix = (lambda r: f"rank {r} - ") if ws > 1 else (lambda r: "")
        # Dead ranks first, then failures in the order they arrived: the others' errors (a peer closed the
        # connection) are usually the echo of the first.
        lines = [prefix(r) + dead[r] for r in range(ws) if r in dead and r not in self.payloads]
        lines += [prefix(r) + pl["message"] for r, pl in self.payloads.items()
                  if pl["status"] != "pass" and pl["message"]]
        if message:
            lines.append(message)
        if status is None:
            if len(self.payloads) == ws and all(pl["status"] == "pass" for pl in self.payloads.values()):
                status = "pass"
            else:
                status = "crash" if any(r not in self.payloads for r in dead) else "fail"
        rank0 = self.payloads.get(0, {})
        # The worker's own clock when it reported (results of several cases can arrive in one read).
        wall = rank0.get("wall_s") or (time.monotonic() - self.started_at)
        result = CaseResult(index=index, case=case, status=status, wall_s=wall)
        if status == "pass":
            result.message = rank0.get("message", "")  # the profile table, if any
            stats = timing.summarize(rank0.get("durations", []))
            if stats:
                result.runs = stats["runs"]
                result.mean_ns, result.std_ns, result.err_ns = stats["mean"], stats["std"], stats["err"]
                result.best_ns, result.worst_ns = stats["best"], stats["worst"]
        else:
            result.message = "\n".join(lines) or "failed"
        self.results[index] = result
        self.inbox.pop(index, None)
        self.pos += 1
        self.started_at = time.monotonic()
        self.grace_until = None
        self.ended = self.ended or bool(self.leavers)
        if self.progress:
            self.progress("done", index, result)

    def handle(self, msg: tuple) -> None:
        kind, rank = msg[0], msg[1]
        if kind == "hello":
            if rank == 0:
                self.environment.update(msg[2])
        elif kind == "start":
            if rank == 0 and self.progress and msg[2] == self.current[0]:
                self.progress("start", msg[2], None)
        elif kind == "result":
            index, payload = msg[2], msg[3]
            if self.ended or index not in {i for i, _ in self.batch[self.pos:]}:
                return
            self.inbox.setdefault(index, {})[rank] = payload
            if payload.get("leaving"):
                self.leavers.add(rank)
                if self.grace_until is None:
                    self.grace_until = time.monotonic() + self.LEAVE_GRACE_S
            while (not self.ended and self.pos < len(self.batch)
                   and len(self.payloads) == self.g.world_size):
                self.finish_case()
        elif kind == "fatal":
            self.fatal = self.fatal or msg[2]
        elif kind == "done":
            self.done.add(rank)

    def drain(self, rank: int) -> None:
        """Read every message waiting from one rank. Bytes the submission wrote into the pipe (it lives in the same
        process) show up as a bad length or an unreadable message: the case then fails, nothing is trusted."""
        conn = self.open.get(rank)
        while conn is not None:
            try:
                if not conn.poll():
                    return
                msg = pickle.loads(conn.recv_bytes(MAX_MESSAGE_BYTES))
            except EOFError:
                del self.open[rank]
                return
            except Exception:
                msg = None
            if not (isinstance(msg, tuple) and len(msg) >= 2 and msg[0] in _KINDS and msg[1] == rank):
                del self.open[rank]
                self.broken = self.broken or (f"{'rank %d - ' % rank if self.g.world_size > 1 else ''}the result "
                                              f"pipe of the worker held bytes the harness did not send (did the "
                                              f"submission write to a file descriptor?)")
                return
            self.handle(msg)

    def supervise(self) -> None:
        """Run until the batch is complete, or a failure ended the group (its case is recorded)."""
        while self.pos < len(self.batch) and not self.ended:
            now = time.monotonic()
            left = self.started_at + self.timeout_s - now
            if left <= 0:
                self.g.dump_stacks()
                self.finish_case("timeout", message=f"timed out: the case ran past its time limit of "
                                                    f"{self.timeout_s:g} s (the worker was killed; its stack is "
                                                    f"in logs/rank*.log)")
                return
            if self.grace_until is not None and now >= self.grace_until:
                self.finish_case(dead=self.dead_ranks())
                return
            wake = left if self.grace_until is None else min(left, self.grace_until - now)
            sentinels = [p.sentinel for r, p in enumerate(self.g.procs) if r not in self.done]
            wait(list(self.open.values()) + sentinels, timeout=wake)
            for rank in list(self.open):
                self.drain(rank)
            if self.broken:
                self.finish_case("fail", message=self.broken)
                return
            if self.fatal:
                for _ in self.batch[self.pos:]:
                    self.finish_case("fail", message=self.fatal)
                return
            if self.ended or self.pos >= len(self.batch):
                return
            dead = self.dead_ranks()
            if dead:
                self.finish_case(dead=dead)
                return
            if not self.open and len(self.done) == self.g.world_size:
                self.finish_case("crash", message="the workers finished without reporting this case")
                return


def run(problem: str | Path, submission: str | Path, *, mode: str, cases: Sequence[Mapping[str, Any]], device: str,
        seed: int | None = None, world_size: int | None = None, intended_bools: bool = False,
        progress: Progress | None = None, timeout_s: float | None = None, worker_per_case: bool = False,
        run_dir: str | Path | None = None, protocol: Mapping[str, Any] | None = None) -> RunRecord:
    """Judge ``submission`` (a leaderboard submission.py) on ``problem`` (a registered name or a problem folder).

    cases: case dicts already as the official text round trip gives them (``problems.official_case``; the caller
    applies ``intended_bools`` there; run() only records it in the environment, so a record says it deviated from
    the leaderboard's reading of the cases). device: "cuda" | "cpu". seed: the secret seed (else POPCORN_SEED), combined
    with each case's seed when the problem's protocol says so. world_size: distributed problems only; overrides the
    cases' world_size. Without it the cases of a distributed problem may ask for different world sizes (smoke lists
    mix 2 and 4 ranks): each world size then runs as its own process group, one after the other, and the results are
    merged back in case order (see run_by_world_size; POPCORN_SEED is read once for all of them, and with ``run_dir``
    each world size stages into ``run_dir/world_size_N``). progress(event, case_index, result): "start" when a case
    begins, "done" with its CaseResult; indices are positions in ``cases``.
    timeout_s: per-case limit (default: the problem's limit for the mode). run_dir: stage there and keep it (logs
    included) instead of a temporary folder that is removed afterwards. protocol: overrides of the spec's protocol
    fields (e.g. {"max_runs": 10} for a quick look; such numbers are not the official protocol's).
    Returns a RunRecord; Ctrl-C returns what was measured so far with ``interrupted=True``.
    """
    if mode not in MODES:
        raise EvaluatorError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    if device not in ("cuda", "cpu"):
        raise EvaluatorError(f"unknown device {device!r}: choose cuda or cpu")
    submission = Path(submission)
    if not submission.is_file():
        raise EvaluatorError(f"submission {str(submission)!r} not found: pass the path of a submission.py "
                             f"(kbench gen writes one)")
    if not cases:
        raise EvaluatorError("no cases to run: pass at least one case")
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise EvaluatorError("no CUDA GPU is visible on this machine: run with --device cpu")
    spec, folder = resolve_problem(problem)
    cases = list(cases)
    groups = world_size_groups(spec, cases, world_size)
    common = dict(mode=mode, device=device, intended_bools=intended_bools, timeout_s=timeout_s,
                  worker_per_case=worker_per_case, protocol=protocol)
    if len(groups) == 1:
        return _run_group(spec, folder, submission, cases=cases, seed=seed, world_size=world_size,
                          progress=progress, run_dir=run_dir, **common)
    for ws, indices in groups.items():     # refuse a bad world size before any group starts
        _world_size(spec, [dict(cases[i]) for i in indices], ws, device)
    seed = popcorn_seed(seed)

    def one(group_cases, ws, group_progress):
        where = Path(run_dir) / f"world_size_{ws}" if run_dir is not None else None
        return _run_group(spec, folder, submission, cases=group_cases, seed=seed, world_size=ws,
                          progress=group_progress, run_dir=where, **common)

    return run_by_world_size(one, cases, groups, progress=progress)


def _run_group(spec, folder: Path, submission: Path, *, mode: str, cases: Sequence[Mapping[str, Any]], device: str,
               seed: int | None, world_size: int | None, intended_bools: bool, progress: Progress | None,
               timeout_s: float | None, worker_per_case: bool, run_dir: str | Path | None,
               protocol: Mapping[str, Any] | None) -> RunRecord:
    """run() for cases of one world size: one process group (fresh ones after failures) over a staged folder."""
    cases = [dict(c) for c in cases]
    ws = _world_size(spec, cases, world_size, device)
    seed = popcorn_seed(seed)
    p = spec.protocol
    if protocol:
        unknown = set(protocol) - set(asdict(p))
        if unknown:
            raise EvaluatorError(f"unknown protocol field(s) {', '.join(sorted(unknown))}: choose from "
                                 f"{', '.join(asdict(p))}")
        p = replace(p, **protocol)
    timeout_s = float(timeout_s if timeout_s is not None else spec.timeouts.for_mode(mode))

    def seeded(case: dict) -> dict:
        if seed is not None and p.combine_seed:
            return dict(case, seed=problems.combine_seed(int(case["seed"]), seed))
        return dict(case)

    results: dict[int, CaseResult] = {}
    to_run = list(range(len(cases)))
    if mode == "leaderboard" and p.leaderboard_cases == "last":
        to_run = to_run[-1:]
        for i in range(len(cases) - 1):
            results[i] = CaseResult(index=i, case=cases[i], status="skipped",
                                    message=f"the leaderboard mode of {spec.name} times only the last case")

    record = RunRecord(problem=spec.name, mode=mode, submission=str(submission), submission_sha256=_sha256(submission),
                       device=device, world_size=ws, seed=seed, cases=[],
                       environment={"python": platform.python_version(), "platform": platform.platform(),
                                    "hostname": socket.gethostname(), "intended_bools": intended_bools})
    keep = run_dir is not None
    rdir = Path(run_dir) if keep else Path(tempfile.mkdtemp(prefix="kbench-run-"))
    stage(folder, submission, cases, rdir)
    job = {"run_dir": str(rdir.resolve()), "world_size": ws or 1, "distributed": ws is not None, "device": device,
           "mode": mode, "protocol": asdict(p), "pg_timeout_s": max(60.0, 2 * timeout_s)}
    timed = mode in ("benchmark", "leaderboard")
    ctx = mp.get_context("spawn")
    try:
        while True:
            pending = [i for i in to_run if i not in results]
            if not pending:
                break
            batch = [(i, cases[i]) for i in (pending[:1] if worker_per_case else pending)]
            # The official warm-up is the first case; a group started after a failure warms up on its own first
            # case instead, so a case that crashes cannot take every later case down with it.
            warm = cases[0] if len(results) == len(cases) - len(to_run) else batch[0][1]
            group = _Group(ctx, dict(job, cases=[[i, seeded(c)] for i, c in batch],
                                     warmup=seeded(warm) if timed else None), ws or 1, rdir)
            try:
                sup = _Batch(group, batch, timeout_s, results, progress, record.environment)
                sup.supervise()
                if sup.pos >= len(batch) and not (sup.fatal or sup.ended or sup.broken):
                    group.finish()
            finally:
                group.kill()
    except KeyboardInterrupt:
        record.interrupted = True
    finally:
        if not keep:
            shutil.rmtree(rdir, ignore_errors=True)

    first_missing = True
    for i, case in enumerate(cases):
        if i in results:
            record.cases.append(results[i])
        else:
            record.cases.append(CaseResult(index=i, case=case, status="interrupted" if first_missing else "skipped",
                                           message="stopped by Ctrl-C" if first_missing else "not run: interrupted"))
            first_missing = False
    return record
