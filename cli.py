"""kbench's front door: a thin click group (list, gen, new, test, perf, profile, device).

Each command parses its options, calls problems/, generator and evaluator/, and renders what comes back; bad input
becomes one ``Error:`` line with exit code 2. Heavy imports (torch, the evaluator) happen inside the commands so
``kbench --help`` stays instant.
"""
from __future__ import annotations

import contextlib
import shlex
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__
from .generator import TARGETS

EXIT_FAILED = 1          # a case did not pass
EXIT_USAGE = 2           # bad input (click's own convention for usage errors)
EXIT_INTERRUPTED = 130   # Ctrl-C, as a shell reports SIGINT

KERNELS_HELP = "Your own kernels folder (<DIR>/<problem>/<backend>/), searched before the shipped kernels."


class KbenchError(click.ClickException):
    """Bad input: printed as one line ``Error: ...`` with exit code 2, no traceback."""
    exit_code = EXIT_USAGE


class OneLineCommand(click.Command):
    """A command whose usage errors (bad option value, unknown option) are one line too, pointing at --help."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            raise KbenchError(f"{exc.format_message()} (see 'kbench {info_name} --help')") from None


class KbenchGroup(click.Group):
    command_class = OneLineCommand

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            raise KbenchError(f"{exc.format_message()} (see 'kbench --help')") from None


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(highlight=False, stderr=stderr)


def _note(message: str) -> None:
    """A one-line notice on stderr (kept out of stdout so reports stay clean to pipe)."""
    click.echo(f"kbench: {message}", err=True)


@contextlib.contextmanager
def _one_line_errors():
    """The library's refusals, as one line with exit code 2."""
    from . import generator, problems
    from .evaluator import EvaluatorError, results_io

    try:
        yield
    except problems.UnknownProblem as exc:
        raise KbenchError(str(exc)) from None
    except problems.SpecError as exc:
        raise KbenchError(f"broken spec: {exc}") from None
    except (EvaluatorError, generator.GeneratorError, results_io.RecordFileError) as exc:
        raise KbenchError(str(exc)) from None


def _spec(problem: str):
    from . import problems

    with _one_line_errors():
        return problems.load_spec(problem)


# ----------------------------------------------------------------------------------------------------------------
# the group

@click.group(cls=KbenchGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
             invoke_without_command=True)
@click.version_option(__version__, "--version", prog_name="kbench")
@click.pass_context
def main(ctx: click.Context) -> None:
    """kbench: pack kernels into a leaderboard submission.py and judge it locally, exactly as the leaderboard does.

    \b
    Typical loop:
      kbench list                          problems, case counts, backends
      kbench gen fp8-mm --backend cuda     kernels/fp8-mm/cuda/ -> ./submission.py
      kbench test fp8-mm                   correctness of ./submission.py on the official tests
      kbench perf fp8-mm --json new.json   official benchmarks, score, % of speed of light
    Without ./submission.py, test/perf/profile judge the spec's default backend; the first line says which file.
    """
    if ctx.invoked_subcommand is None:      # the bare command is a request for help, not an error
        click.echo(ctx.get_help())


@main.command("list")
@click.option("--kernels", "kernels", metavar="DIR", envvar="KBENCH_KERNELS", help=KERNELS_HELP)
def list_cmd(kernels: str | None) -> None:
    """List the problems: leaderboard names, case counts (tests/benchmarks/smoke) and backends."""
    from rich.table import Table

    from . import generator, problems

    table = Table(title="kbench problems", title_justify="left", caption="* the spec's default backend",
                  caption_justify="left")
    table.add_column("problem", no_wrap=True)
    table.add_column("leaderboard", overflow="fold")
    for col in ("tests", "bench", "smoke", "ranks"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("backends", overflow="fold")
    for name in problems.list_problems():
        spec = _spec(name)
        try:
            backends = generator.list_backends(name, kernels)
        except generator.GeneratorError:       # no kernels/<problem>/ yet: nothing to list, not an error
            backends = []
        shown = ", ".join(f"{b}*" if b == spec.default_backend else b for b in backends) or "—"
        table.add_row(name, spec.leaderboard, str(len(spec.tests)), str(len(spec.benchmarks)),
                      str(len(spec.smoke)), str(spec.world_size or 1), shown)
    _console().print(table)


@main.command("gen")
@click.argument("problem")
@click.option("--backend", metavar="NAME", help="Backend folder under kernels/PROBLEM/ (default: the spec's default_backend).")
@click.option("--target", type=click.Choice(TARGETS), default="h100", show_default=True,
              help="GPU to compile for: h100/h200 -> sm_90a, mi300x -> gfx942 (ROCm).")
@click.option("-o", "--output", "output", default="submission.py", show_default=True, metavar="FILE",
              help="Where to write the one-file submission ('-': standard output).")
@click.option("--force", is_flag=True, help="Overwrite FILE even if kbench did not generate it.")
@click.option("--kernels", "kernels", metavar="DIR", envvar="KBENCH_KERNELS", help=KERNELS_HELP)
@click.option("--check", is_flag=True,
              help="Also compile the CUDA source as load_inline would (nvcc, no GPU needed) and report each "
                   "kernel's registers, spills and ptxas's performance advisories (SASS MMA/TMA counts where "
                   "cuobjdump is installed).")
def gen_cmd(problem: str, backend: str | None, target: str, output: str, force: bool, kernels: str | None,
            check: bool) -> None:
    """Pack kernels/PROBLEM/BACKEND/ into one leaderboard-ready submission.py."""
    from . import generator

    spec = _spec(problem)
    with _one_line_errors():
        path = generator.generate(problem, backend=backend, target=target, out=output, force=force, root=kernels)
    backend = backend or spec.default_backend
    if path is not None:
        click.echo(f"wrote {path} ({problem}, backend {backend}, target {target})", err=True)
    if check:
        from . import compile_check

        with _one_line_errors():
            found = compile_check.check(generator.load_build(problem, backend, target, root=kernels))
        compile_check.print_report(found, f"{problem}/{backend} · {target} · nvcc", _console(stderr=output == "-"))


@main.command("new")
@click.argument("problem")
@click.argument("backend")
@click.option("--from", "source", default="torch", show_default=True, metavar="BACKEND",
              help="The shipped backend to start from (its entry is copied; it passes `kbench test` on the CPU).")
@click.option("--kernels", "kernels", metavar="DIR", envvar="KBENCH_KERNELS",
              help="Your kernels folder (default: ./kernels); PROBLEM/BACKEND/ is created in it.")
def new_cmd(problem: str, backend: str, source: str, kernels: str | None) -> None:
    """Scaffold PROBLEM/BACKEND/ in your kernels folder: kernel.yml, entry.py (a working first version)."""
    from . import generator

    _spec(problem)
    with _one_line_errors():
        folder = generator.scaffold(problem, backend, Path(kernels or "kernels"), source)
    click.echo(f"created {folder}: edit entry.py, then `kbench test {problem} --backend {backend}"
               f"{'' if kernels else ' --kernels kernels'}`")


# ----------------------------------------------------------------------------------------------------------------
# test / perf / profile

def _run_options(fn: Callable) -> Callable:
    options = [
        click.argument("problem"),
        click.option("--submission", metavar="FILE",
                     help="Judge this submission.py (any file written for the leaderboard). Default: ./submission.py "
                          "when it exists, else the spec's default backend generated into a temporary file."),
        click.option("--backend", metavar="NAME",
                     help="Generate the submission from kernels/PROBLEM/NAME/ into a temporary file first "
                          "(./submission.py is never touched)."),
        click.option("--target", type=click.Choice(TARGETS), default="h100", show_default=True,
                     help="Compile target when generating from --backend."),
        click.option("--kernels", "kernels", metavar="DIR", envvar="KBENCH_KERNELS", help=KERNELS_HELP),
        click.option("--case", "case_strings", multiple=True, metavar='"k: v; k: v"',
                     help='Run this case (official form, e.g. "m: 64; n: 64; k: 128; seed: 1"); repeatable.'),
        click.option("--cases", "cases_from", metavar="official|smoke|FILE",
                     help="Case list: the spec's official list for this mode, its tiny smoke list, or a file in the "
                          "official format (one case a line). Default: official on a GPU, smoke on the CPU."),
        click.option("--device", type=click.Choice(("auto", "cuda", "cpu")), default="auto", show_default=True,
                     help="Where to run: auto = cuda when a GPU is visible, else the CPU (smoke cases)."),
        click.option("--seed", type=int, default=None, metavar="N",
                     help="Secret seed combined into every case seed, as the leaderboard's second pass does."),
        click.option("--world-size", "world_size", type=int, default=None, metavar="N",
                     help="Ranks for a distributed problem (GPUs, or CPU processes over gloo); replaces the cases' world_size."),
        click.option("--intended-bools", is_flag=True,
                     help="Pass True/False case values as booleans. DIFFERS from the leaderboard, which passed the "
                          "strings 'True'/'False' (both truthy)."),
        click.option("--timeout", "timeout_s", type=float, default=None, metavar="SECONDS",
                     help="Time limit of the whole run (default: the mode's official limit); cases not reached are "
                          "reported as not run."),
        click.option("--keep", is_flag=True, help="Keep the run folder (staged files, cases.txt, logs) and name it."),
        click.option("--json", "json_out", metavar="OUT",
                     help="Write the whole record (plan, cases, statistics, environment, command) to OUT."),
        click.option("--popcorn-log", "popcorn_log", metavar="FILE",
                     help="Write the official 'key: value' result log (as POPCORN_FD receives it) to FILE."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _backend_for(problem: str, spec, opts: dict) -> str | None:
    """The backend to generate, or None when a file is judged as it is (--submission, or ./submission.py)."""
    if opts["submission"] and opts["backend"]:
        raise KbenchError("give either --submission FILE or --backend NAME, not both")
    if opts["submission"]:
        if not Path(opts["submission"]).is_file():
            raise KbenchError(f"submission file not found: {opts['submission']} (pass an existing file, "
                              "or --backend NAME to generate one)")
        return None
    if opts["backend"] or not Path("submission.py").is_file():
        return opts["backend"] or spec.default_backend
    opts["submission"] = "submission.py"
    return None


def _check_runs_here(problem: str, backend: str, device: str, opts: dict) -> None:
    """A backend that needs a GPU, asked to run on the CPU: refused before anything is built."""
    from . import generator

    with _one_line_errors():
        runs_on = generator.runs_on(problem, backend, opts["kernels"])
    if device == "cpu" and "cpu" not in runs_on:
        raise KbenchError(f"backend {backend!r} of {problem} needs a GPU ({', '.join(runs_on)}) and this run is on "
                          f"the CPU: use --backend torch here, or run on a GPU machine")
    if device == "cuda" and opts["target"] not in runs_on:
        raise KbenchError(f"backend {backend!r} of {problem} runs on {', '.join(runs_on)}, not {opts['target']}: "
                          f"pass --target {next(t for t in runs_on if t != 'cpu')}")


@contextlib.contextmanager
def _submission_file(problem: str, backend: str | None, opts: dict):
    """(path, origin): the file as given, or a backend generated into a temporary folder for this run only."""
    from . import generator

    if backend is None:
        yield str(Path(opts["submission"]).resolve()), {}
        return
    with tempfile.TemporaryDirectory(prefix="kbench-gen-") as tmp, _one_line_errors():
        path = generator.generate(problem, backend, opts["target"], Path(tmp) / "submission.py", force=True,
                                  root=opts["kernels"])
        # the file is gone after the run; the record keeps where it came from (and its sha256)
        yield str(path), {"backend": backend, "target": opts["target"]}


def _load_ceilings() -> Any:
    """This GPU's ceilings for % SOL; measured once and cached. A failed measurement costs only the % column."""
    from .evaluator import ceilings

    try:
        return ceilings.load_or_measure(say=lambda s: _note(s))
    except Exception as exc:  # noqa: BLE001 - % SOL is an extra; a failed measurement must not cost the run
        _note(f"no % SOL column: could not measure this GPU's ceilings ({type(exc).__name__}: {exc})")
        return None


def _plan(problem: str, mode: str, opts: dict):
    """Everything settled before anything runs (evaluator.make_plan); outputs checked writable; --compare read."""
    from . import evaluator
    from .evaluator import results_io

    old = None
    with _one_line_errors():
        for key, flag in (("json_out", "--json"), ("popcorn_log", "--popcorn-log")):
            if opts.get(key):
                results_io.check_writable(opts[key], flag)
        if opts.get("compare"):
            old = results_io.load_record_json(opts["compare"])
        run_dir = tempfile.mkdtemp(prefix="kbench-run-") if opts["keep"] else None
        plan = evaluator.make_plan(problem, mode, device=opts["device"], case_strings=opts["case_strings"],
                                   cases_from=opts["cases_from"], world_size=opts["world_size"],
                                   intended_bools=opts["intended_bools"], seed=opts["seed"],
                                   timeout_s=opts["timeout_s"], protocol=opts.get("protocol"), run_dir=run_dir)
        if old is not None:
            results_io.check_comparable(old, plan.spec.name, plan.device, opts["compare"])
    return plan, old


def _execute(problem: str, mode: str, opts: dict) -> None:
    """test/perf/profile: plan, pick the file, run with progress, report, write records, exit code."""
    from . import evaluator
    from .evaluator import report

    spec = _spec(problem)       # an unknown problem is the first thing to report
    backend = _backend_for(problem, spec, opts)
    plan, old = _plan(problem, mode, opts)
    if backend is not None:
        _check_runs_here(problem, backend, plan.device, opts)
    with _submission_file(problem, backend, opts) as (submission, origin):
        _note(f"judging {opts['submission']}" if backend is None else
              f"judging backend {backend!r} (target {opts['target']}) generated into a temporary submission.py")
        for note in plan.notes:
            _note(note)
        plan = replace(plan, submission=submission)
        console = _console()
        ceil = _load_ceilings() if plan.device == "cuda" and mode in ("benchmark", "leaderboard") else None
        record = _judge_rounds(plan, mode, opts, console)
    record.environment.update(origin)
    record.command = record.command or " ".join(shlex.quote(a) for a in ["kbench", *sys.argv[1:]])
    _finish(record, plan, old, opts, console, ceil)


def _judge_rounds(plan, mode: str, opts: dict, console):
    """One run of the plan, or (perf --rounds N) N runs, each in fresh worker groups, alternating with --against's file
    (A B, B A, ...: a machine that drifts favours neither): the submission's last record, every run's score in
    record.rounds. A failed or interrupted run ends the rounds."""
    from . import evaluator
    from .evaluator import report

    files = [("submission", plan.submission)]
    if opts.get("against"):
        files.append(("against", str(Path(opts["against"]).resolve())))
    runs = [(r, label, path) for r in range(opts.get("rounds") or 1)
            for label, path in (files if r % 2 == 0 else files[::-1])]
    rounds, last = [], None
    for r, label, path in runs:
        if len(runs) > 1:
            _note(f"round {r + 1}: {label} ({path})")
        with report.RunProgress(console, plan.cases, mode) as progress, _one_line_errors():
            rec = evaluator.execute(replace(plan, submission=path), progress)
        rounds.append({"file": label, "score_s": rec.score_s(), "passed": rec.passed()})
        if label == "submission":
            last = rec
        if not rec.passed():
            if label == "against":
                _note(f"--against {opts['against']} did not pass round {r + 1}; the rounds end here")
            break
    last = last or rec
    last.rounds = rounds if len(rounds) > 1 else []
    return last


def _finish(record, plan, old, opts: dict, console, ceil) -> None:
    """Render the report, write the records (a fallback file if a write fails at the end), exit."""
    from .evaluator import ceilings, report, results_io

    sol = ceilings.sol_percents(record, plan.spec.roofline, ceil)
    comparison = results_io.compare(old, record, opts["compare"]) if old is not None else None
    report.print_report(record, console, sol=sol, comparison=comparison)
    outputs = []
    if opts.get("json_out"):
        outputs.append(("record", opts["json_out"], results_io.json_text(record, sol)))
    if opts.get("popcorn_log"):
        outputs.append(("official log", opts["popcorn_log"], results_io.popcorn_log(record)))
    for what, path, text in outputs:
        where, failed = results_io.write_with_fallback(path, text)
        _note(f"{what} written to {where}" if not failed else f"could not write {failed}; {what} written to {where}")
    if plan.run_dir:
        _note(f"run folder kept: {plan.run_dir}")
    if record.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(0 if record.passed() else EXIT_FAILED)


def _interruptible(problem: str, mode: str, opts: dict) -> None:
    try:
        _execute(problem, mode, opts)
    except KeyboardInterrupt:           # Ctrl-C outside the runner (generation, measuring ceilings): no record
        _note("interrupted before any result was recorded")
        sys.exit(EXIT_INTERRUPTED)


@main.command("test")
@_run_options
def test_cmd(problem: str, **opts: Any) -> None:
    """Check a submission's correctness on the spec's tests (exit 0 only when every case passes)."""
    _interruptible(problem, "test", dict(opts, compare=None))


@main.command("perf")
@_run_options
@click.option("--mode", type=click.Choice(("benchmark", "leaderboard")), default="benchmark", show_default=True,
              help="benchmark: time each case; leaderboard: also reseed, regenerate and check every timed run.")
@click.option("--compare", metavar="OLD.json", help="Show per-case speedups (old/new) and the geomean ratio vs a --json record.")
@click.option("--rounds", type=click.IntRange(1, 50), default=1, show_default=True, metavar="N",
              help="Judge N times, each in fresh worker processes (on several GPUs one file's score moves by tens of % "
                   "from one run to the next): every round's score and the median. The report is the last round's.")
@click.option("--against", metavar="FILE",
              help="Another submission judged in alternation with this one, --rounds times each (A B, B A, ...): "
                   "the two medians and their ratio, the fair way to compare two files on one machine.")
def perf_cmd(problem: str, mode: str, **opts: Any) -> None:
    """Time a submission on the spec's benchmarks: mean ± err per case, geomean score, % of speed of light."""
    if opts.get("against") and not Path(opts["against"]).is_file():
        raise KbenchError(f"--against {opts['against']}: no such file (pass the other submission.py to alternate with)")
    _interruptible(problem, mode, opts)


@main.command("profile")
@_run_options
@click.option("--warmup", type=click.IntRange(0, 1000), default=0, show_default=True, metavar="N",
              help="Calls before the profiled one (the official profile mode makes none): a submission's steady "
                   "state, e.g. its replayed CUDA graph, instead of its first calls' captures.")
def profile_cmd(problem: str, warmup: int, **opts: Any) -> None:
    """Run each benchmark case once under the torch profiler: the top kernels, and on a GPU the device's idle time
    inside the call (waiting for the host)."""
    protocol = {"profile_warmup": warmup} if warmup else None
    _interruptible(problem, "profile", dict(opts, compare=None, protocol=protocol))


# ----------------------------------------------------------------------------------------------------------------
# device

@main.command("device")
@click.option("--refresh", is_flag=True, help="Measure again even if this GPU model's ceilings are cached.")
def device_cmd(refresh: bool) -> None:
    """Measure this GPU's ceilings once (bf16/fp8 matmul, copy bandwidth, NCCL all-reduce) and cache them per model."""
    import torch
    from rich.table import Table

    from .evaluator import ceilings

    if not torch.cuda.is_available():
        raise KbenchError("no CUDA GPU is visible; kbench device measures a GPU (CPU runs have no % SOL)")
    c = ceilings.load_or_measure(refresh=refresh, say=lambda s: _note(s))
    table = Table(title=f"{c.gpu} (x{c.gpus}) · torch {c.torch} · {c.measured_at}", title_justify="left")
    table.add_column("ceiling")
    table.add_column("measured", justify="right")
    table.add_row("bf16 matmul 8192^3", f"{c.bf16_flops / 1e12:.0f} TFLOP/s")
    table.add_row("fp8 matmul 8192^3 (_scaled_mm)", f"{c.fp8_flops / 1e12:.0f} TFLOP/s" if c.fp8_flops else "n/a")
    table.add_row("device copy (read+write)", f"{c.copy_bw / 1e12:.2f} TB/s")
    table.add_row("NCCL all-reduce bus bw (256 MB)", f"{c.allreduce_bw / 1e9:.0f} GB/s" if c.allreduce_bw else "n/a (1 GPU)")
    console = _console()
    console.print(table)
    console.print(f"cached in {ceilings.cache_path(c.gpu)}")


if __name__ == "__main__":
    main()
