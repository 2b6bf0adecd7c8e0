"""What a run looks like on the terminal (rich): progress while cases run, then a table, the score and the failures.

Everything here reads a RunRecord / CaseResult (evaluator/record.py) and writes to a rich Console; nothing here runs
or judges anything.
"""
from __future__ import annotations

import math
import re
import statistics
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..problems import format_case

STATUS_STYLE = {"pass": "green", "fail": "red", "timeout": "red", "crash": "red", "skipped": "yellow",
                "interrupted": "yellow"}


def fmt_ns(ns: float | None) -> str:
    """A duration in nanoseconds with a readable unit: 812 ns, 12.3 µs, 4.56 ms, 1.23 s."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "—"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale * 0.9995:       # 999.7 ns reads "1 µs", not "1e+03 ns"
            return f"{ns / scale:.3g} {unit}" if abs(ns) < 100 * scale else f"{ns / scale:.1f} {unit}"
    return f"{ns:.3g} ns"


def fmt_s(seconds: float | None) -> str:
    return fmt_ns(None if seconds is None else seconds * 1e9)


def case_text(case: Mapping[str, Any]) -> str:
    """The official one-line form of a case (what --case takes back)."""
    return format_case(case)


def device_label(record: Any) -> str:
    """CPU timings are labelled as such: they are never comparable with GPU ones."""
    ranks = record.world_size if record.world_size and record.world_size > 1 else None
    if record.device == "cpu":
        return f"CPU, {ranks} ranks" if ranks else "CPU"
    gpu = (record.environment or {}).get("gpu") or "GPU"
    return f"{gpu} x{ranks}" if ranks else str(gpu)


class RunProgress:
    """A live progress bar fed by evaluator.run's callback ``progress(event, case_index, result)``.

    A call with ``result=None`` means the case started; a call with a CaseResult means it finished (a one-line verdict
    is printed above the bar so the scroll-back keeps it).
    """

    def __init__(self, console: Console, cases: Sequence[Mapping[str, Any]], mode: str):
        self.console = console
        self.cases = list(cases)
        self.mode = mode
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
        self._task = None
        self._done: set[int] = set()

    def __enter__(self) -> "RunProgress":
        self._progress.__enter__()
        self._task = self._progress.add_task(f"{self.mode}", total=len(self.cases))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def __call__(self, event: str, case_index: int, result: Any = None) -> None:
        n = len(self.cases)
        if result is None:
            if 0 <= case_index < n:
                label = case_text(self.cases[case_index])
                self._progress.update(self._task, description=f"{self.mode} {case_index + 1}/{n}: {label}")
            else:       # warm-up and other events not tied to one case
                self._progress.update(self._task, description=f"{self.mode}: {event}")
            return
        if case_index in self._done:
            return
        self._done.add(case_index)
        self._progress.advance(self._task)
        style = STATUS_STYLE.get(result.status, "")
        timing = f"  {fmt_ns(result.mean_ns)} ± {fmt_ns(result.err_ns)}" if result.mean_ns is not None else ""
        if result.status not in ("pass", "skipped") and result.message:
            first = _by_rank(result.message.strip().splitlines())[0]
            timing = f"  {first[:100]}"
        line = Text.assemble((f"{result.status:>11}", style), f"  #{case_index}  {case_text(result.case)}{timing}")
        self._progress.console.print(line, highlight=False)


def case_table(record: Any, sol: Mapping[int, float] | None = None,
               speedups: Mapping[int, float] | None = None, noise: set[int] = frozenset(),
               compact: bool = False) -> Table:
    """One row per case: case, status, mean ± err, median, best, worst, runs, and % SOL / speedup where known (a
    speedup within two standard errors of the difference reads "~": noise)."""
    # profile mode reports kernels, not means: its columns are the test table's unless the runner timed it too
    timed = record.mode in ("benchmark", "leaderboard") or any(r.mean_ns is not None for r in record.cases)
    title = f"{record.problem} · {record.mode} · {device_label(record)}"
    if record.device == "cpu":
        title += " (CPU timings: not comparable with GPU ones)" if timed else ""
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("case", overflow="fold")
    table.add_column("status", no_wrap=True)
    if timed:
        # numbers never wrap; the case text takes whatever width is left
        for name in ("mean ± err", "runs") if compact else ("mean ± err", "median", "best", "worst", "runs"):
            table.add_column(name, justify="right", no_wrap=True)
        if sol:
            table.add_column("% SOL", justify="right", no_wrap=True)
        if speedups is not None:
            table.add_column("speedup", justify="right", no_wrap=True)
    for r in record.cases:
        row = [str(r.index), case_text(r.case), Text(r.status, style=STATUS_STYLE.get(r.status, ""))]
        if timed:
            mean = f"{fmt_ns(r.mean_ns)} ± {fmt_ns(r.err_ns)}" if r.mean_ns is not None else "—"
            row += [mean, str(r.runs or "—")] if compact else [mean, fmt_ns(r.median_ns), fmt_ns(r.best_ns),
                                                                fmt_ns(r.worst_ns), str(r.runs or "—")]
            if sol:
                row.append(f"{sol[r.index]:.1f}%" if r.index in sol else "—")
            if speedups is not None:
                mark = "~" if r.index in noise else ""      # within the combined error: neither run is faster
                row.append(f"{mark}{speedups[r.index]:.2f}x" if r.index in speedups else "—")
        table.add_row(*row)
    return table


_RANK = re.compile(r"^rank (\d+) - ")


def _by_rank(lines: list[str]) -> list[str]:
    """Rank-prefixed lines in rank order (ranks report in the order they fail, which reads as noise)."""
    if lines and all(_RANK.match(ln) for ln in lines):
        return sorted(lines, key=lambda ln: int(_RANK.match(ln).group(1)))
    return lines


def import_line(record: Any) -> str:
    """How long the submission's import took (load_inline's build inside it), and a warning past the official runner's
    allowance for compiling: there the build starts from nothing, so a time read from torch's warm cache is a lower
    bound."""
    env = record.environment or {}
    seconds = env.get("import_s")
    if seconds is None:
        return ""
    groups = env.get("imports", 1)
    line = f"submission import: {fmt_s(seconds)} at the slowest" + (
        f" (imported by {groups} fresh worker groups: the official runner starts one a case)" if groups > 1 else "")
    allowance = (record.plan or {}).get("protocol", {}).get("compile_allowance_s")
    if allowance and seconds > allowance:
        line += (f"; over the {allowance:g} s the official runner allows for compiling: the leaderboard would "
                 "time out (fewer or smaller translation units, or fewer template instances, build faster)")
    return line


def rounds_lines(record: Any) -> list[str]:
    """kbench perf --rounds: each file's scores in order and their median, and with --against the ratio of the two
    medians (the submission's speedup over the other file)."""
    if not record.rounds:
        return []
    medians, out = {}, []
    for label in dict.fromkeys(r["file"] for r in record.rounds):
        scores = [r["score_s"] for r in record.rounds if r["file"] == label]
        timed = [x for x in scores if x]
        shown = ", ".join(fmt_s(x) if x else "failed" for x in scores)
        if timed and len(timed) == len(scores):
            medians[label] = statistics.median(timed)
            shown += f" (median {fmt_s(medians[label])})"
        out.append(f"{label} over {len(scores)} rounds: {shown}")
    if len(medians) == 2:
        ratio = medians["against"] / medians["submission"]
        out.append(f"the submission is {ratio:.3f}x {'faster' if ratio >= 1 else 'slower'} than --against "
                   f"(median over median, alternating rounds)")
    return out


SLOW_RUN = 2.0     # a run over this many medians is an outlier worth naming
LIFTED_MEAN = 1.05  # ... when the outliers lift the case's mean this far above its median


def outlier_lines(record: Any) -> list[str]:
    """A line for each passed case whose mean (what the score uses) a few slow runs lifted: how many runs took over
    SLOW_RUN x the median, the worst, and how far above the median they put the mean. Runs of seconds where the
    median is microseconds are usually the machine (another process, a clock change), not the submission."""
    out = []
    for r in record.cases:
        if r.status != "pass" or not r.durations_ns or not r.median_ns or not r.mean_ns:
            continue
        slow = [d for d in r.durations_ns if d > SLOW_RUN * r.median_ns]
        if slow and r.mean_ns > LIFTED_MEAN * r.median_ns:
            out.append(f"#{r.index}: {len(slow)} of {r.runs} runs took over {SLOW_RUN:g}x the median "
                       f"{fmt_ns(r.median_ns)} (worst {fmt_ns(max(slow))}); the mean is "
                       f"{r.mean_ns / r.median_ns - 1:.0%} above the median")
    return out


def failure_lines(record: Any) -> list[str]:
    """``#i [case] status: message`` for every case that failed (skipped is not a failure); rank prefixes are kept."""
    out = []
    for r in record.cases:
        if r.status in ("pass", "skipped"):
            continue
        head = f"#{r.index} [{case_text(r.case)}] {r.status}"
        lines = _by_rank([ln for ln in (r.message or "").splitlines() if ln.strip()])
        if not lines:
            out.append(head)
        elif len(lines) == 1:
            out.append(f"{head}: {lines[0]}")
        else:
            out.append(f"{head}:")
            out.extend(f"    {ln}" for ln in lines)
    return out


def output_lines(record: Any, max_cases: int = 5) -> list[str]:
    """The tail of what cases printed: failing cases first (their traceback is there), then others."""
    cases = [r for r in record.cases if r.output]
    cases.sort(key=lambda r: r.status == "pass")
    out = []
    for r in cases[:max_cases]:
        out.append(f"#{r.index} ({r.status}):")
        out.extend(f"    {ln}" for ln in r.output.splitlines())
    if len(cases) > max_cases:
        out.append(f"... {len(cases) - max_cases} more cases printed output (--json keeps every case's)")
    return out


def print_report(record: Any, console: Console, sol: Mapping[int, float] | None = None,
                 comparison: Any = None) -> None:
    """The whole report of one run: table, score (geomean), comparison, failures, interruption."""
    # narrow (a pipe is 80 columns): best and worst stay in --json, the case text keeps room to be read
    console.print(case_table(record, sol, comparison.speedups if comparison is not None else None,
                             comparison.noise if comparison is not None else frozenset(),
                             compact=console.width < 110))
    if record.mode == "profile":
        for r in record.cases:
            if r.status == "pass" and r.message:
                console.print(f"[bold]#{r.index}[/] {case_text(r.case)}")
                console.print(r.message, highlight=False, markup=False, soft_wrap=True)
    passed = sum(r.status == "pass" for r in record.cases)
    skipped = [r for r in record.cases if r.status == "skipped"]
    ran = len(record.cases) - len(skipped)
    why = "interrupted" if record.interrupted else (skipped[0].message.removeprefix("not run: ") if skipped else "")
    console.print(f"{passed}/{ran} cases passed" + (f" ({len(skipped)} skipped: {why})" if skipped else ""))
    line = import_line(record)
    if line:
        console.print(line, highlight=False)
    if record.mode in ("benchmark", "leaderboard"):
        score = record.score_s()
        where = " (CPU)" if record.device == "cpu" else ""
        if score is not None:
            console.print(f"[bold]score (geomean of means){where}: {fmt_s(score)}[/]")
        else:
            console.print(f"score{where}: none (a case did not pass, or none was timed)")
        if sol:
            gm = math.exp(sum(math.log(v) for v in sol.values()) / len(sol))
            console.print(f"geomean % of speed of light: {gm:.1f}%")
        for line in rounds_lines(record):
            console.print(line, highlight=False)
        lifted = outlier_lines(record)
        if lifted:
            console.print("[yellow]slow runs lifted these means (--json keeps every run's time):[/]")
            for line in lifted:
                console.print(line, highlight=False, markup=False, soft_wrap=True)
    if comparison is not None:
        if comparison.geomean_ratio is not None:
            faster = "faster" if comparison.geomean_ratio >= 1 else "slower"
            console.print(f"vs {comparison.old_path}: geomean speedup {comparison.geomean_ratio:.3f}x ({faster}) "
                          f"over {comparison.matched} matched case(s)")
        else:
            console.print(f"vs {comparison.old_path}: no case timed in both runs")
        for warning in comparison.warnings:
            console.print(f"[yellow]warning: {warning}[/]")
    failures = failure_lines(record)
    if failures:
        console.print("[bold red]cases that did not pass:[/]")
        for line in failures:
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    printed = output_lines(record)
    if printed:
        console.print("[bold]what the submission printed (last lines per case):[/]")
        for line in printed:
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    if record.interrupted:
        console.print("[yellow]interrupted: the cases above are the ones that finished[/]")
