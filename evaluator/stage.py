"""The run directory: what the leaderboard's machine holds when it judges a submission.

    submission.py   the file under judgement, byte for byte
    task.py         problems/<problem>/task.py
    reference.py    problems/<problem>/reference.py
    utils.py        problems/utils.py (leaderboard helper names)
    harness.py      evaluator/harness.py: the code the workers run
    timing.py       evaluator/timing.py: statistics and stopping rules the harness imports
    cases.txt       the cases, one official ``k: v; k: v`` line each
    logs/           rank<R>.log: each worker's stdout and stderr (a file, so a chatty submission cannot block)

Workers run with this folder as cwd and sys.path[0], so ``import task`` / ``from utils import ...`` resolve here.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable, Mapping

from .. import problems

HERE = Path(__file__).resolve().parent
HARNESS_FILES = ("harness.py", "timing.py")


def stage(problem_dir: Path, submission: Path, cases: Iterable[Mapping], dest: Path) -> Path:
    """Fill ``dest`` (created if missing) with the run directory for one submission and problem; returns dest."""
    dest = Path(dest)
    shutil.rmtree(dest / "logs", ignore_errors=True)  # a kept run directory reused: no logs of an earlier run
    (dest / "logs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(submission, dest / "submission.py")
    for name in ("task.py", "reference.py"):
        shutil.copyfile(Path(problem_dir) / name, dest / name)
    shutil.copyfile(problems.UTILS_PATH, dest / "utils.py")
    for name in HARNESS_FILES:
        shutil.copyfile(HERE / name, dest / name)
    (dest / "cases.txt").write_text("".join(problems.format_case(c) + "\n" for c in cases))
    return dest


def log_path(run_dir: Path, rank: int) -> Path:
    """Where worker ``rank`` writes its stdout and stderr."""
    return Path(run_dir) / "logs" / f"rank{rank}.log"


def log_tail(run_dir: Path, rank: int = 0, max_bytes: int = 4000) -> str:
    """The last ``max_bytes`` of a worker's log (what the CLI shows after a failure); "" if there is none."""
    path = log_path(run_dir, rank)
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        return f.read().decode("utf-8", "replace")
