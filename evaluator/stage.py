"""The run directory: what the leaderboard's machine holds when it judges a submission.

    submission.py   the file under judgement, byte for byte
    task.py         problems/<problem>/task.py
    reference.py    problems/<problem>/reference.py
    utils.py        problems/utils.py (leaderboard helper names)
    harness.py      evaluator/harness.py: the code the workers run
    timing.py       evaluator/timing.py: timers, statistics and stopping rules the harness imports
    guards.py       evaluator/guards.py: clones, aliasing and bitwise checks the harness imports
    cases.txt       the case lines that run, in the official ``k: v; k: v`` form (world size and secret seed
                    applied); the workers read their cases from it, as the official harness does
    plan.json       the run's plan (what was settled before anything ran)
    logs/           rank<R>.log: each worker's stdout and stderr (a file, so a chatty submission cannot block)

Workers run with this folder as cwd and sys.path[0], so ``import task`` / ``from utils import ...`` resolve here.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from .. import problems

HERE = Path(__file__).resolve().parent
HARNESS_FILES = ("harness.py", "timing.py", "guards.py")


def stage(plan, indices: Sequence[int], dest: Path) -> Path:
    """Fill ``dest`` (created if missing) for the plan's cases at ``indices``; cases.txt line i is case indices[i].
    Returns dest."""
    dest = Path(dest)
    shutil.rmtree(dest / "logs", ignore_errors=True)  # a kept run directory reused: no logs of an earlier run
    (dest / "logs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plan.submission, dest / "submission.py")
    for name in ("task.py", "reference.py"):
        shutil.copyfile(plan.problem_dir / name, dest / name)
    shutil.copyfile(problems.UTILS_PATH, dest / "utils.py")
    for name in HARNESS_FILES:
        shutil.copyfile(HERE / name, dest / name)
    (dest / "cases.txt").write_text("".join(plan.line(i) + "\n" for i in indices))
    (dest / "plan.json").write_text(json.dumps(plan.to_json(), indent=2, default=str) + "\n")
    return dest


def log_path(run_dir: Path, rank: int) -> Path:
    """Where worker ``rank`` writes its stdout and stderr."""
    return Path(run_dir) / "logs" / f"rank{rank}.log"


def log_tail(run_dir: Path, rank: int = 0, max_bytes: int = 4000) -> str:
    """The last ``max_bytes`` of a worker's log; "" if there is none."""
    path = log_path(run_dir, rank)
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        return f.read().decode("utf-8", "replace")


def case_output(run_dir: Path, rank: int, mark: str, max_lines: int = 20, max_bytes: int = 4000) -> dict[int, str]:
    """What each case printed in rank ``rank``'s log: case index -> its last lines (the harness prints ``mark`` +
    index before each case). Only what a case printed; reading stops at ~8 MB from the end of a huge log."""
    path = log_path(run_dir, rank)
    if not path.is_file():
        return {}
    with open(path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - (8 << 20)))
        text = f.read().decode("utf-8", "replace")
    out: dict[int, str] = {}
    for chunk in text.split("\n" + mark)[1:]:
        head, _, body = chunk.partition("\n")
        if not head.strip().isdigit():
            continue
        lines = [ln for ln in body.rstrip("\n").splitlines() if ln.strip()]
        if lines:
            out[int(head)] = "\n".join(lines[-max_lines:])[-max_bytes:]
    return out
