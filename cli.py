"""kbench's front door: a thin click group (list, gen, test, perf, profile, device).

Each command turns options into calls of problems/, generator and evaluator/, and turns their errors into one line
with exit code 2. Heavy imports (torch, the evaluator) happen inside the commands so `kbench --help` stays instant.
"""
from __future__ import annotations

import contextlib
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import click

EXIT_FAILED = 1          # a case did not pass
EXIT_USAGE = 2           # bad input (click's own convention for usage errors)
EXIT_INTERRUPTED = 130   # Ctrl-C, as a shell reports SIGINT

TARGETS = ("h100", "h200", "mi300x")


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


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _note(message: str) -> None:
    """A one-line notice on stderr (kept out of stdout so reports stay clean to pipe)."""
    click.echo(f"kbench: {message}", err=True)


def _spec(problem: str):
    from . import problems

    try:
        return problems.load_spec(problem)
    except problems.UnknownProblem as exc:
        raise KbenchError(str(exc)) from None
    except problems.SpecError as exc:
        raise KbenchError(f"broken spec: {exc}") from None


# ----------------------------------------------------------------------------------------------------------------
# the group

@click.group(cls=KbenchGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
             invoke_without_command=True)
@click.pass_context
def main(ctx: click.Context) -> None:
    """kbench: pack kernels into a leaderboard submission.py and judge it locally, exactly as the leaderboard does.

    \b
    Typical loop:
      kbench list                          problems, case counts, backends
      kbench gen fp8-mm --backend cuda     kernels/fp8-mm/cuda/ -> submission.py
      kbench test fp8-mm                   correctness on the official tests
      kbench perf fp8-mm --json new.json   official benchmarks, score, % of speed of light
    """
    if ctx.invoked_subcommand is None:      # the bare command is a request for help, not an error
        click.echo(ctx.get_help())


@main.command("list")
def list_cmd() -> None:
    """List the problems: leaderboard names, case counts (tests/benchmarks/smoke) and backends under kernels/."""
    from . import problems
    from rich.table import Table

    table = Table(title="kbench problems", title_justify="left", caption="* the spec's default backend",
                  caption_justify="left")
    table.add_column("problem", no_wrap=True)
    table.add_column("leaderboard", overflow="fold")
    for col in ("tests", "bench", "smoke", "ranks"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("backends", overflow="fold")
    for name in problems.list_problems():
        spec = _spec(name)
        backends = _backends(name)
        shown = ", ".join(f"{b}*" if b == spec.default_backend else b for b in backends) or "—"
        table.add_row(name, spec.leaderboard, str(len(spec.tests)), str(len(spec.benchmarks)),
                      str(len(spec.smoke)), str(spec.world_size or 1), shown)
    _console().print(table)


def _backends(problem: str) -> list[str]:
    try:
        from . import generator

        return generator.list_backends(problem)
    except (ImportError, ValueError):       # no kernels/<problem>/ yet: nothing to list, not an error
        return []


@main.command("gen")
@click.argument("problem")
@click.option("--backend", metavar="NAME", help="Backend folder under kernels/PROBLEM/ (default: the spec's default_backend).")
@click.option("--target", type=click.Choice(TARGETS), default="h100", show_default=True,
              help="GPU to compile for: h100/h200 -> sm_90a, mi300x -> gfx942 (ROCm).")
@click.option("-o", "--output", "output", default="submission.py", show_default=True, metavar="FILE",
              help="Where to write the one-file submission.")
@click.option("--force", is_flag=True, help="Overwrite FILE even if kbench did not generate it.")
def gen_cmd(problem: str, backend: str | None, target: str, output: str, force: bool) -> None:
    """Pack kernels/PROBLEM/BACKEND/ into one leaderboard-ready submission.py."""
    _spec(problem)
    path = _generate(problem, backend, target, output, force)
    click.echo(f"wrote {path} ({problem}, backend {backend or _spec(problem).default_backend}, target {target})")


def _generate(problem: str, backend: str | None, target: str, out: str | Path, force: bool) -> Path:
    from . import generator

    try:
        return generator.generate(problem, backend=backend, target=target, out=out, force=force)
    except generator.GeneratorError as exc:
        raise KbenchError(str(exc)) from None


# ----------------------------------------------------------------------------------------------------------------
# test / perf / profile: shared options and flow

def _run_options(fn: Callable) -> Callable:
    options = [
        click.argument("problem"),
        click.option("--submission", metavar="FILE",
                     help="Judge this submission.py (any file written for the leaderboard)."),
        click.option("--backend", metavar="NAME",
                     help="Generate the submission from kernels/PROBLEM/NAME/ into a temporary file first "
                          "(./submission.py is never touched). Default without --submission: the spec's default_backend."),
        click.option("--target", type=click.Choice(TARGETS), default="h100", show_default=True,
                     help="Compile target when generating from --backend."),
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
        click.option("--json", "json_out", metavar="OUT",
                     help="Write the whole record (cases, statistics, environment, command) to OUT atomically."),
        click.option("--popcorn-log", "popcorn_log", metavar="FILE",
                     help="Write the official 'key: value' result log (as POPCORN_FD receives it) to FILE."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _plan(problem: str, mode: str, opts: dict):
    """The run's cases, device and world size (evaluator.plan), its errors as one line."""
    from .evaluator import plan

    try:
        return plan.make_plan(problem, mode, device=opts["device"], case_strings=opts["case_strings"],
                              cases_from=opts["cases_from"], world_size=opts["world_size"],
                              intended_bools=opts["intended_bools"])
    except plan.PlanError as exc:
        raise KbenchError(str(exc)) from None


def _check_submission_options(opts: dict) -> None:
    if opts["submission"] and opts["backend"]:
        raise KbenchError("give either --submission FILE or --backend NAME, not both")
    sub = opts["submission"]
    if sub and not Path(sub).is_file():
        raise KbenchError(f"submission file not found: {sub} (pass an existing file, or --backend NAME to generate one)")
    for key, flag in (("json_out", "--json"), ("popcorn_log", "--popcorn-log")):
        out = opts.get(key)
        if out and not Path(out).resolve().parent.is_dir():
            raise KbenchError(f"{flag} {out}: folder {Path(out).resolve().parent} does not exist; create it first")


@contextlib.contextmanager
def _submission_file(problem: str, spec, opts: dict):
    """(path, origin): --submission as given, or a backend generated into a temporary folder for this run only."""
    if opts["submission"]:
        yield str(Path(opts["submission"]).resolve()), {}
        return
    backend = opts["backend"] or spec.default_backend
    with tempfile.TemporaryDirectory(prefix="kbench-gen-") as tmp:
        path = _generate(problem, backend, opts["target"], Path(tmp) / "submission.py", force=True)
        _note(f"generated backend {backend!r} (target {opts['target']}) into a temporary submission.py")
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


def _command_line() -> str:
    return " ".join(shlex.quote(a) for a in ["kbench", *sys.argv[1:]])


def _execute(problem: str, mode: str, opts: dict) -> None:
    """The flow shared by test/perf/profile: plan, run with progress, report, write records, exit code."""
    try:
        _execute_run(problem, mode, opts)
    except KeyboardInterrupt:           # Ctrl-C outside the runner (generation, measuring ceilings): no record
        _note("interrupted before any result was recorded")
        sys.exit(EXIT_INTERRUPTED)


def _execute_run(problem: str, mode: str, opts: dict) -> None:
    from .evaluator import report, results_io

    _spec(problem)          # an unknown problem is the first thing to report
    _check_submission_options(opts)
    old = None
    if opts.get("compare"):
        try:
            old = results_io.load_record_json(opts["compare"])
        except results_io.RecordFileError as exc:
            raise KbenchError(str(exc)) from None
    plan = _plan(problem, mode, opts)
    if old is not None:
        try:
            results_io.check_comparable(old, problem, plan.device, opts["compare"])
        except results_io.RecordFileError as exc:
            raise KbenchError(str(exc)) from None

    from . import evaluator

    with _submission_file(problem, plan.spec, opts) as (submission, origin):
        for note in plan.notes:     # after generation, so that a generator error stays the only line
            _note(note)
        console = _console()
        try:
            ceil = _load_ceilings() if plan.device == "cuda" and mode in ("benchmark", "leaderboard") else None
            with report.RunProgress(console, plan.cases, mode) as progress:
                record = evaluator.run_plan(plan, submission, seed=opts["seed"], progress=progress)
        except evaluator.EvaluatorError as exc:
            raise KbenchError(str(exc)) from None

    from .evaluator import ceilings

    results_io.fill_environment(record, _command_line())
    record.environment.update(origin)
    sol = ceilings.sol_percents(record, plan.spec.roofline, ceil)
    comparison = results_io.compare(old, record, opts["compare"]) if old is not None else None
    report.print_report(record, console, sol=sol, comparison=comparison)
    if opts.get("json_out"):
        path = results_io.write_json(record, opts["json_out"], sol)
        _note(f"record written to {path}")
    if opts.get("popcorn_log"):
        results_io.write_popcorn_log(record, opts["popcorn_log"])
        _note(f"official log written to {opts['popcorn_log']}")
    if record.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(0 if record.passed() else EXIT_FAILED)


@main.command("test")
@_run_options
def test_cmd(problem: str, **opts: Any) -> None:
    """Check a submission's correctness on the spec's tests (exit 0 only when every case passes)."""
    _execute(problem, "test", opts)


@main.command("perf")
@_run_options
@click.option("--mode", type=click.Choice(("benchmark", "leaderboard")), default="benchmark", show_default=True,
              help="benchmark: time each case; leaderboard: also reseed, regenerate and check every timed run.")
@click.option("--compare", metavar="OLD.json", help="Show per-case speedups (old/new) and the geomean ratio vs a --json record.")
def perf_cmd(problem: str, mode: str, **opts: Any) -> None:
    """Time a submission on the spec's benchmarks: mean ± err per case, geomean score, % of speed of light."""
    _execute(problem, mode, opts)


@main.command("profile")
@_run_options
def profile_cmd(problem: str, **opts: Any) -> None:
    """Run each benchmark case once under the torch profiler and show the top kernels."""
    _execute(problem, "profile", opts)


# ----------------------------------------------------------------------------------------------------------------
# device

@main.command("device")
@click.option("--refresh", is_flag=True, help="Measure again even if this GPU model's ceilings are cached.")
def device_cmd(refresh: bool) -> None:
    """Measure this GPU's ceilings once (bf16/fp8 matmul, copy bandwidth, NCCL all-reduce) and cache them per model."""
    import torch

    from .evaluator import ceilings

    if not torch.cuda.is_available():
        raise KbenchError("no CUDA GPU is visible; kbench device measures a GPU (CPU runs have no % SOL)")
    c = ceilings.load_or_measure(refresh=refresh, say=lambda s: _note(s))
    from rich.table import Table

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
