"""Supervising workers: the pipe protocol, the time limit, dead ranks, and fresh workers after a failure.

``run_group`` judges the cases of one world size in a staged run directory: one worker group runs them in order;
after a crash, a hang or a rank that left, the group is ended and a fresh one runs the remaining cases, so a failure
never loses another case's result (``plan.worker_per_case``: a fresh group for every case, as the official runner
does). The run's time limit bounds everything: when it passes, the running case is a time-out and the cases not
reached are reported as not run.
"""
from __future__ import annotations

import multiprocessing as mp
import pickle
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable, Mapping

from . import timing
from .harness import CASE_MARK
from .record import CaseResult
from .stage import case_output
from .workers import WorkerGroup, exit_text, stale_build_locks

MAX_MESSAGE_BYTES = 64 << 20  # far above any real message (a profile table); a forged length header fails at once
KINDS = ("hello", "start", "imported", "result", "fatal", "done")
Progress = Callable[[str, int, "CaseResult | None"], None]


@dataclass
class GroupRun:
    """What the supervision of one world size needs besides its workers."""
    run_dir: Path
    keep: bool                      # the run folder outlives the run (messages may name files in it)
    deadline: float                 # time.monotonic() past which the run's time limit is spent
    limit_s: float                  # that limit, for messages
    progress: Progress | None
    environment: dict
    results: dict[int, CaseResult] = field(default_factory=dict)

    def log_hint(self, rank: int) -> str:
        if self.keep:
            return f"its output: {self.run_dir / 'logs' / f'rank{rank}.log'}"
        return "its last output is shown below; --keep keeps the whole log"


class Supervisor:
    """Supervises one worker group over its batch: collects per-rank results, applies the time limit, spots dead
    ranks and bytes in the pipe the harness did not send.

    With several ranks, a rank whose submission raised reports and leaves (its peers may be stuck in a collective).
    Its peers get LEAVE_GRACE_S to report or die too (so a simultaneous crash still reads as one), then the case is
    judged with what came in and the group ends; the next case gets a fresh group.
    """

    LEAVE_GRACE_S = 1.0

    def __init__(self, group, batch: list[tuple[int, dict]], run: GroupRun):
        self.g, self.batch, self.run = group, batch, run
        self.pos = 0
        self.inbox: dict[int, dict[int, dict]] = {}   # case index -> rank -> payload (ranks may run ahead)
        self.done: set[int] = set()
        self.leavers: set[int] = set()               # ranks that reported a failure and exit on purpose
        self.grace_until: float | None = None
        self.ended = False                           # the group cannot run another case
        self.open = dict(enumerate(group.conns))
        self.started_at = time.monotonic()
        self.born = time.time()                      # a build lock older than this is not the group's own
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
        return {r: f"{exit_text(p.exitcode)} during the case ({self.run.log_hint(r)})"
                for r, p in enumerate(self.g.procs)
                if r not in self.done and r not in self.leavers and p.exitcode is not None}

    def _failure_lines(self, dead: Mapping[int, str], message: str) -> list[str]:
        ws = self.g.world_size
        prefix = (lambda r: f"rank {r} - ") if ws > 1 else (lambda r: "")
        # Dead ranks first, then failures in the order they arrived: the others' errors (a peer closed the
        # connection) are usually the echo of the first.
        lines = [prefix(r) + dead[r] for r in range(ws) if r in dead and r not in self.payloads]
        lines += [prefix(r) + pl["message"] for r, pl in self.payloads.items()
                  if pl["status"] != "pass" and pl["message"]]
        return lines + ([message] if message else [])

    def finish_case(self, status: str | None = None, dead: Mapping[int, str] = {}, message: str = "") -> None:
        index, case = self.current
        if status is None:
            if len(self.payloads) == self.g.world_size and all(pl["status"] == "pass"
                                                                for pl in self.payloads.values()):
                status = "pass"
            else:
                status = "crash" if any(r not in self.payloads for r in dead) else "fail"
        rank0 = self.payloads.get(0, {})
        # The worker's own clock when it reported (results of several cases can arrive in one read).
        result = CaseResult(index=index, case=case, status=status,
                            wall_s=rank0.get("wall_s") or (time.monotonic() - self.started_at))
        if status == "pass":
            result.message = rank0.get("message", "")  # the profile table, if any
            durations = rank0.get("durations", [])
            stats = timing.summarize(durations)
            if stats:
                result.runs = stats["runs"]
                result.mean_ns, result.std_ns, result.err_ns = stats["mean"], stats["std"], stats["err"]
                result.median_ns, result.best_ns, result.worst_ns = stats["median"], stats["best"], stats["worst"]
                result.durations_ns = [float(d) for d in durations]
        else:
            result.message = "\n".join(self._failure_lines(dead, message)) or "failed"
        self.run.results[index] = result
        self.inbox.pop(index, None)
        self.pos += 1
        self.started_at = time.monotonic()
        self.grace_until = None
        self.ended = self.ended or bool(self.leavers)
        if self.run.progress:
            self.run.progress("done", index, result)

    def handle(self, msg: tuple) -> None:
        kind, rank = msg[0], msg[1]
        if kind == "hello":
            if rank == 0:
                self.run.environment.update(msg[2])
        elif kind == "imported":  # the slowest import of any rank in any group, and how many groups imported it
            env = self.run.environment
            env["import_s"] = max(env.get("import_s", 0.0), float(msg[2]))
            env["imports"] = env.get("imports", 0) + (rank == 0)
        elif kind == "start":
            if rank == 0 and self.run.progress and msg[2] == self.current[0]:
                self.run.progress("start", msg[2], None)
        elif kind == "result":
            index, payload = msg[2], msg[3]
            if self.ended or index not in {i for i, _ in self.batch[self.pos:]}:
                return
            self.inbox.setdefault(index, {})[rank] = payload
            if payload.get("leaving"):
                self.leavers.add(rank)
                if self.grace_until is None:
                    self.grace_until = time.monotonic() + self.LEAVE_GRACE_S
            while not self.ended and self.pos < len(self.batch) and len(self.payloads) == self.g.world_size:
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
            if not (isinstance(msg, tuple) and len(msg) >= 2 and msg[0] in KINDS and msg[1] == rank):
                del self.open[rank]
                self.broken = self.broken or (f"{'rank %d - ' % rank if self.g.world_size > 1 else ''}the result "
                                              f"pipe of the worker held bytes the harness did not send (did the "
                                              f"submission write to a file descriptor?)")
                return
            self.handle(msg)

    def _settled(self) -> bool:
        """After reading the pipes: record what a failure decided; True when this group can do no more."""
        if self.broken:
            self.finish_case("fail", message=self.broken)
            return True
        if self.fatal:
            for _ in self.batch[self.pos:]:
                self.finish_case("fail", message=self.fatal)
            return True
        if self.ended or self.pos >= len(self.batch):
            return True
        dead = self.dead_ranks()
        if dead:
            self.finish_case(dead=dead)
            return True
        if not self.open and len(self.done) == self.g.world_size:
            self.finish_case("crash", message="the workers finished without reporting this case")
            return True
        return False

    def supervise(self) -> None:
        """Run until the batch is complete, or a failure or the time limit ended the group (its case is recorded)."""
        while self.pos < len(self.batch) and not self.ended:
            now = time.monotonic()
            left = self.run.deadline - now
            if left <= 0:
                self.g.dump_stacks()
                locks = stale_build_locks(self.born)
                why = (f"; torch's build lock {locks[0]} is older than this run: unless another build is running, "
                       "an interrupted one left it and every load of that extension waits on it; delete it and run "
                       "again") if locks else ""
                self.finish_case("timeout", message=f"timed out: the run passed its time limit of "
                                                    f"{self.run.limit_s:g} s (the worker was killed; "
                                                    f"{self.run.log_hint(0)}){why}")
                return
            if self.grace_until is not None and now >= self.grace_until:
                self.finish_case(dead=self.dead_ranks())
                return
            wake = left if self.grace_until is None else min(left, self.grace_until - now)
            sentinels = [p.sentinel for r, p in enumerate(self.g.procs) if r not in self.done]
            wait(list(self.open.values()) + sentinels, timeout=wake)
            for rank in list(self.open):
                self.drain(rank)
            if self._settled():
                return


def _attach_output(run: GroupRun, world_size: int) -> None:
    """What each finished case printed (the tail of its part of every rank's log) goes into its result."""
    per_rank = [case_output(run.run_dir, r, CASE_MARK) for r in range(world_size)]
    for index, result in run.results.items():
        parts = [(r, out[index]) for r, out in enumerate(per_rank) if index in out]
        if parts and not result.output:
            result.output = "\n".join(text if world_size == 1 else "\n".join(f"rank {r}: {ln}" for ln in
                                                                             text.splitlines())
                                      for r, text in parts)


def run_group(plan, indices: list[int], world_size: int | None, run: GroupRun) -> None:
    """Judge the plan's cases at ``indices`` (one world size, staged in run.run_dir: cases.txt line i is
    indices[i]); results land in run.results. Ctrl-C propagates with what was measured kept in run.results."""
    ranks = world_size or 1
    job = {"run_dir": str(run.run_dir.resolve()), "world_size": ranks, "distributed": plan.distributed,
           "device": plan.device, "mode": plan.mode, "protocol": dict(plan.protocol),
           "intended_bools": plan.intended_bools, "pg_timeout_s": max(60.0, 2 * plan.timeout_s)}
    timed = plan.mode in ("benchmark", "leaderboard")
    ctx = mp.get_context("spawn")
    lines = {index: n for n, index in enumerate(indices)}
    try:
        while True:
            pending = [i for i in indices if i not in run.results and plan.runs_case(i)]
            if not pending or time.monotonic() >= run.deadline:
                break
            batch = [(i, plan.cases[i]) for i in (pending[:1] if plan.worker_per_case else pending)]
            # The official warm-up is the first case; a group started after a failure warms up on its own first
            # case instead, so a case that crashes cannot take every later case down with it.
            first = [i for i in indices if plan.runs_case(i)][0]
            warm = first if not any(i in run.results for i in indices) else batch[0][0]
            group = WorkerGroup(ctx, dict(job, run=[[i, lines[i]] for i, _ in batch],
                                          warmup=lines[warm] if timed else None), ranks, run.run_dir)
            try:
                sup = Supervisor(group, batch, run)
                sup.supervise()
                if sup.pos >= len(batch) and not (sup.fatal or sup.ended or sup.broken):
                    group.finish()
            finally:
                group.kill()
    finally:
        _attach_output(run, ranks)
