"""Worker processes and their containment: one spawned process per rank, each in its own process group.

Each worker leads its own process group (so Ctrl-C reaches only the parent, and killing the group also ends compilers
or helpers the submission started), follows its parent (it dies when the parent dies), writes its stdout and stderr
to ``logs/rank<R>.log`` in the run directory, and sends results over a pipe only the parent reads. Several ranks
rendezvous over TCP on a free local port (NCCL on GPUs, gloo on the CPU). The staged ``harness.py`` does the judging.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from .stage import log_path


def stale_build_locks(before: float) -> list[Path]:
    """torch's extension build locks last touched before ``before`` (epoch seconds). A build that was interrupted
    (Ctrl-C, a killed run) leaves its ``lock`` file behind, and every later load of that extension waits on it
    forever (torch.utils.file_baton): a worker hanging in its import is often this."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"
    found = []
    for pattern in ("*/lock", "*/*/lock"):  # <root>/<name>/lock, or <root>/py<ver>_<cuda>/<name>/lock
        for lock in Path(root).glob(pattern):
            try:
                if lock.stat().st_mtime < before:
                    found.append(lock)
            except OSError:  # released meanwhile
                pass
    return sorted(found)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the official harness's fixed 12356 may be taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_text(code: int | None) -> str:
    if code is None:
        return "worker stopped"
    if code < 0:
        try:
            return f"worker died with signal {signal.Signals(-code).name}"
        except ValueError:
            return f"worker died with signal {-code}"
    return f"worker exited with code {code}"


# ----------------------------------------------------------------------------------------------------------------
# the worker side of the fence (runs in the spawned process before the staged harness takes over)

def _follow_parent() -> None:
    """End this worker's whole process group when the parent dies (killed, terminal closed): a worker in its own
    session would otherwise outlive it, hanging on to a GPU."""
    import multiprocessing as mp

    parent = mp.parent_process()
    if parent is None:
        return

    def watch():
        parent.join()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="kbench-follow-parent", daemon=True).start()


def _close_inherited_tracker() -> None:
    """spawn hands every child the parent's resource-tracker pipe; a submission writing to stray descriptors would
    spray errors over the parent's terminal. The worker starts its own tracker if it ever needs one."""
    try:
        from multiprocessing import resource_tracker
        tracker = resource_tracker._resource_tracker
        if tracker._fd is not None:
            os.close(tracker._fd)
            tracker._fd = None
    except Exception:
        pass


def worker_entry(job: dict, conn, log: str) -> None:
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
    _close_inherited_tracker()
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
# the parent side

class WorkerGroup:
    """``world_size`` worker processes running one job; the parent reads their pipes (``conns``)."""

    def __init__(self, ctx, job: dict, world_size: int, run_dir: Path):
        self.world_size = world_size
        self.procs, self.conns = [], []
        port = free_port() if job["distributed"] else 0
        try:
            for rank in range(world_size):
                reader, writer = ctx.Pipe(duplex=False)
                self.conns.append(reader)
                proc = ctx.Process(target=worker_entry, name=f"kbench-rank{rank}",
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
